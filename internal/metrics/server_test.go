package metrics

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/kproxy/kproxy/internal/model"
)

type fakeConfig struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Mode       string `json:"mode"`
}

func TestServerRoutes(t *testing.T) {
	cfgz := func() any {
		return fakeConfig{APIVersion: "kubeproxy.config.k8s.io/v1alpha1", Kind: "KubeProxyConfiguration", Mode: "nftables"}
	}
	tests := []struct {
		name      string
		cfg       ServerConfig
		path      string
		code      int
		body      string // exact, unless prefix is set
		prefix    bool
		wantCType string
	}{
		{"proxy mode", ServerConfig{Mode: "nftables"}, "/proxyMode", 200, "nftables", false, "text/plain; charset=utf-8"},
		{"healthz", ServerConfig{}, "/healthz", 200, "ok", false, "text/plain; charset=utf-8"},
		{"healthz verbose", ServerConfig{}, "/healthz?verbose", 200, "[+]ping ok\nhealthz check passed\n", false, "text/plain; charset=utf-8"},
		{"healthz ping", ServerConfig{}, "/healthz/ping", 200, "ok", false, "text/plain; charset=utf-8"},
		{"healthz excluded", ServerConfig{}, "/healthz?exclude=ping&exclude=etcd&verbose", 200,
			"[+]ping excluded: ok\nwarn: some health checks cannot be excluded: no matches for \"etcd\"\nhealthz check passed\n", false, ""},
		{"configz", ServerConfig{Configz: cfgz}, "/configz", 200,
			`{"kubeproxy.config.k8s.io":{"apiVersion":"kubeproxy.config.k8s.io/v1alpha1","kind":"KubeProxyConfiguration","mode":"nftables"}}`, false, "application/json"},
		{"configz unset", ServerConfig{}, "/configz", 200, `{}`, false, "application/json"},
		{"configz unmarshalable", ServerConfig{Configz: func() any { return func() {} }}, "/configz", 500, "error marshaling json", true, ""},
		{"pprof off", ServerConfig{}, "/debug/pprof/", 404, "", true, ""},
		{"pprof index", ServerConfig{Profiling: true}, "/debug/pprof/", 200, "", true, ""},
		{"pprof redirect", ServerConfig{Profiling: true}, "/debug/pprof", 302, "", true, ""},
		{"pprof symbol", ServerConfig{Profiling: true}, "/debug/pprof/symbol", 200, "num_symbols", true, ""},
		{"metrics without gatherer", ServerConfig{}, "/metrics", 404, "", true, ""},
		{"component SLIs", ServerConfig{}, "/metrics/slis", 200, "", true, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			NewServer(tc.cfg).Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, tc.path, nil))
			if rec.Code != tc.code {
				t.Fatalf("code %d, want %d (%s)", rec.Code, tc.code, rec.Body)
			}
			body := rec.Body.String()
			if (tc.prefix && !strings.HasPrefix(body, tc.body)) || (!tc.prefix && body != tc.body) {
				t.Errorf("body %q, want %q", body, tc.body)
			}
			if tc.wantCType != "" && rec.Header().Get("Content-Type") != tc.wantCType {
				t.Errorf("content type %q, want %q", rec.Header().Get("Content-Type"), tc.wantCType)
			}
		})
	}
}

func TestServerRunServesUntilCancelled(t *testing.T) {
	reg := NewRegistry()
	m, err := New(reg, Options{Mode: ModeNFTables})
	if err != nil {
		t.Fatal(err)
	}
	m.HealthzRequest(200)
	addrc := make(chan string, 1)
	listen := func(ctx context.Context, network, addr string) (net.Listener, error) {
		if addr != "127.0.0.1:10249" {
			t.Errorf("listening on %q", addr)
		}
		l, err := (&net.ListenConfig{}).Listen(ctx, network, "127.0.0.1:0")
		if err == nil {
			addrc <- l.Addr().String()
		}
		return l, err
	}
	s := NewServer(ServerConfig{Addr: "127.0.0.1:10249", Gatherer: reg, Mode: "nftables", Listen: listen})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	addr := <-addrc

	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `kubeproxy_proxy_healthz_total{code="200"} 1`) {
		t.Errorf("/metrics lacks the healthz counter:\n%s", b)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run after cancel: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

// TestHealthzSLIs: every /healthz answer that runs the ping check is
// recorded in the SLI metrics, as the apiserver healthz handler upstream
// installs records it; an excluded check is not.
func TestHealthzSLIs(t *testing.T) {
	h := NewServer(ServerConfig{}).Handler()
	get := func(path string) string {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Body.String()
	}
	const total = `kubernetes_healthchecks_total{name="ping",status="success",type="healthz"} `
	count := func() int {
		for _, line := range strings.Split(get("/metrics/slis"), "\n") {
			if v, ok := strings.CutPrefix(line, total); ok {
				n, _ := strconv.Atoi(v)
				return n
			}
		}
		return 0
	}
	before := count()
	get("/healthz")
	get("/healthz?verbose")
	get("/healthz?exclude=ping")
	if got := count() - before; got != 2 {
		t.Errorf("%s grew by %d over two checked answers and one excluded, want 2", total, got)
	}
	if slis := get("/metrics/slis"); !strings.Contains(slis, `kubernetes_healthcheck{name="ping",type="healthz"} 1`) {
		t.Errorf("/metrics/slis lacks the ping gauge:\n%s", slis)
	}
}

func TestServerRunListenError(t *testing.T) {
	boom := errors.New("address in use")
	listen := func(context.Context, string, string) (net.Listener, error) { return nil, boom }
	err := NewServer(ServerConfig{Addr: "127.0.0.1:10249", Listen: listen}).Run(context.Background())
	if !errors.Is(err, boom) {
		t.Fatalf("Run: %v, want %v", err, boom)
	}
}

// TestServerRunNoAddress: a disabled server (no address) runs until its
// context ends, so the daemon does not see it stop and retry it.
func TestServerRunNoAddress(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- NewServer(ServerConfig{}).Run(ctx) }()
	select {
	case err := <-done:
		t.Fatalf("Run without address returned before cancel: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func port(name string, ip, ep bool, local int, hasEndpoints bool) *model.ServicePort {
	p := &model.ServicePort{ID: model.PortID{Namespace: "ns", Name: name}, InternalPolicyLocal: ip, ExternalPolicyLocal: ep, HasEndpoints: hasEndpoints}
	for range local {
		p.LocalEndpoints = append(p.LocalEndpoints, &model.Endpoint{IsLocal: true, Ready: true})
	}
	return p
}

func metricValue(t *testing.T, fams map[string]*dto.MetricFamily, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	mf := fams[name]
	if mf == nil {
		return 0, false
	}
next:
	for _, m := range mf.GetMetric() {
		for _, lp := range m.GetLabel() {
			if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}

// histogramSum is the sample sum of the histogram name with labels (0 when absent).
func histogramSum(fams map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	var sum float64
	for _, m := range fams[name].GetMetric() {
		match := true
		for _, lp := range m.GetLabel() {
			if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
				match = false
			}
		}
		if match {
			sum += m.GetHistogram().GetSampleSum()
		}
	}
	return sum
}

func TestObserveSync(t *testing.T) {
	end := time.Unix(1700000100, 0)
	fs := model.NewFamilySnapshot(model.IPv4, []*model.ServicePort{port("a", true, true, 0, true)})
	// One Service with two ports whose Local policy finds no local endpoint.
	dns, dnsTCP := port("dns", true, false, 0, true), port("dns", true, false, 0, true)
	dns.ID.Port, dnsTCP.ID.Port = "dns", "dns-tcp"
	twoPorts := model.NewFamilySnapshot(model.IPv4, []*model.ServicePort{dns, dnsTCP})
	tests := []struct {
		name string
		mode string
		r    SyncResult
		want map[string]float64 // metric name -> value (histograms: sample count)
		sums map[string]float64 // histogram name -> sample sum
		none []string
	}{
		{
			name: "success partial",
			mode: ModeNFTables,
			r: SyncResult{Family: model.IPv4, Duration: 20 * time.Millisecond, End: end, Snapshot: fs,
				TriggerTimes: []time.Time{end.Add(-2 * time.Second), {}, end.Add(-time.Second)}},
			want: map[string]float64{
				"kubeproxy_sync_proxy_rules_duration_seconds":         1,
				"kubeproxy_sync_partial_proxy_rules_duration_seconds": 1,
				"kubeproxy_sync_proxy_rules_last_timestamp_seconds":   1700000100,
				"kubeproxy_network_programming_duration_seconds":      2,
				"kubeproxy_sync_proxy_rules_no_local_endpoints_total": 1,
			},
			none: []string{"kubeproxy_sync_full_proxy_rules_duration_seconds", "kubeproxy_sync_proxy_rules_nftables_sync_failures_total"},
		},
		{
			// Programming latency and the last-sync timestamp are taken when
			// the rules were in the kernel, not after the conntrack cleanup.
			name: "success programmed before the end",
			mode: ModeNFTables,
			r: SyncResult{Family: model.IPv4, Duration: 20 * time.Millisecond, End: end, Programmed: end.Add(-time.Second), Snapshot: fs,
				TriggerTimes: []time.Time{end.Add(-1500 * time.Millisecond)}},
			want: map[string]float64{
				"kubeproxy_sync_proxy_rules_last_timestamp_seconds": 1700000099,
				"kubeproxy_network_programming_duration_seconds":    1,
			},
			sums: map[string]float64{"kubeproxy_network_programming_duration_seconds": 0.5},
		},
		{
			name: "nftables failure",
			mode: ModeNFTables,
			r:    SyncResult{Family: model.IPv4, Full: true, Duration: time.Second, End: end, Err: errors.New("x")},
			want: map[string]float64{
				"kubeproxy_sync_full_proxy_rules_duration_seconds":        1,
				"kubeproxy_sync_proxy_rules_nftables_sync_failures_total": 1,
			},
			none: []string{"kubeproxy_sync_proxy_rules_last_timestamp_seconds", "kubeproxy_network_programming_duration_seconds"},
		},
		{
			name: "iptables failure",
			mode: ModeIPTables,
			r:    SyncResult{Family: model.IPv6, Full: true, End: end, Err: errors.New("x")},
			want: map[string]float64{"kubeproxy_sync_proxy_rules_iptables_restore_failures_total": 1},
			none: []string{"kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total"},
		},
		{
			name: "iptables partial failure",
			mode: ModeIPTables,
			r:    SyncResult{Family: model.IPv4, End: end, Err: errors.New("x")},
			want: map[string]float64{
				"kubeproxy_sync_proxy_rules_iptables_restore_failures_total":         1,
				"kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total": 1,
			},
		},
		{
			name: "nftables counts Service ports without local endpoints",
			mode: ModeNFTables,
			r:    SyncResult{Family: model.IPv4, End: end, Snapshot: twoPorts},
			want: map[string]float64{"kubeproxy_sync_proxy_rules_no_local_endpoints_total": 2},
		},
		{
			name: "ipvs counts Services without local endpoints",
			mode: ModeIPVS,
			r:    SyncResult{Family: model.IPv4, End: end, Snapshot: twoPorts},
			want: map[string]float64{"kubeproxy_sync_proxy_rules_no_local_endpoints_total": 1},
		},
		{
			name: "ipvs has no full histogram",
			mode: ModeIPVS,
			r:    SyncResult{Family: model.IPv4, Full: true, End: end},
			want: map[string]float64{"kubeproxy_sync_proxy_rules_duration_seconds": 1},
			none: []string{"kubeproxy_sync_full_proxy_rules_duration_seconds"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			reg := NewRegistry()
			m, err := New(reg, Options{Mode: tc.mode})
			if err != nil {
				t.Fatal(err)
			}
			m.ObserveSync(tc.r)
			fams := scrape(t, NewServer(ServerConfig{Gatherer: reg}))
			fam := map[string]string{"ip_family": tc.r.Family.String(), "traffic_policy": PolicyInternal}
			for name, want := range tc.want {
				if got, ok := metricValue(t, fams, name, fam); !ok || got != want {
					t.Errorf("%s = %v (present %v), want %v", name, got, ok, want)
				}
			}
			for name, want := range tc.sums {
				if got := histogramSum(fams, name, fam); got != want {
					t.Errorf("%s sum = %v, want %v", name, got, want)
				}
			}
			for _, name := range tc.none {
				if _, ok := metricValue(t, fams, name, fam); ok {
					t.Errorf("%s present", name)
				}
			}
		})
	}
}
