package metrics

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kproxy/kproxy/internal/config"
)

// TestComponentMetrics checks the metrics every Kubernetes component
// serves besides its own, as upstream kube-proxy v1.36.3 serves them:
// kubernetes_build_info, kubernetes_feature_enabled and client-go's
// rest_client_* (fed by a real client-go request).
func TestComponentMetrics(t *testing.T) {
	gate, err := config.FeatureGateFor(config.NewDefault())
	if err != nil {
		t.Fatal(err)
	}
	reg := NewRegistry()
	if _, err := New(reg, Options{Mode: ModeNFTables, FeatureGate: gate}); err != nil {
		t.Fatal(err)
	}
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"major":"1","minor":"36","gitVersion":"v1.36.3"}`)
	}))
	defer api.Close()
	client, err := kubernetes.NewForConfig(&rest.Config{Host: api.URL})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Discovery().ServerVersion(); err != nil {
		t.Fatal(err)
	}
	fams := scrape(t, NewServer(ServerConfig{Gatherer: reg, Mode: ModeNFTables}))
	checkSeries(t, fams, "kubernetes_build_info", map[string]string{"major": "1", "minor": "36", "git_version": "v1.36.3"}, 1)
	checkSeries(t, fams, "kubernetes_feature_enabled", map[string]string{"name": "PreferSameTrafficDistribution", "stage": ""}, 1)
	checkSeries(t, fams, "kubernetes_feature_enabled", map[string]string{"name": "AllAlpha", "stage": "ALPHA"}, 0)
	checkSeries(t, fams, "rest_client_requests_total", map[string]string{"code": "200", "method": "GET"}, 1)
	for _, name := range []string{"rest_client_request_duration_seconds", "rest_client_response_size_bytes", "rest_client_rate_limiter_duration_seconds"} {
		if fams[name] == nil || fams[name].GetType() != dto.MetricType_HISTOGRAM {
			t.Errorf("%s: missing or not a histogram", name)
		}
	}
	// A second registry in one process: registering again works, and
	// client-go now reports there.
	if _, err := New(NewRegistry(), Options{Mode: ModeIPTables, FeatureGate: gate}); err != nil {
		t.Fatal(err)
	}
}

// checkSeries wants a series of name whose labels include labels, with value.
func checkSeries(t *testing.T, fams map[string]*dto.MetricFamily, name string, labels map[string]string, value float64) {
	t.Helper()
	mf := fams[name]
	if mf == nil {
		t.Errorf("%s: missing", name)
		return
	}
	for _, m := range mf.GetMetric() {
		match := 0
		for _, lp := range m.GetLabel() {
			if v, ok := labels[lp.GetName()]; ok && v == lp.GetValue() {
				match++
			}
		}
		if match != len(labels) {
			continue
		}
		got := m.GetGauge().GetValue() + m.GetCounter().GetValue()
		if got != value {
			t.Errorf("%s%v = %v, want %v", name, labels, got, value)
		}
		return
	}
	t.Errorf("%s: no series with labels %v", name, labels)
}
