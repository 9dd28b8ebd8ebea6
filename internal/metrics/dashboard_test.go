package metrics

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestDashboardUsesKnownMetrics: every kubeproxy_* and kproxy_* series the
// Grafana dashboard (deploy/grafana/kproxy.json) queries is one kproxy
// exports, and it shows the per-Service traffic.
func TestDashboardUsesKnownMetrics(t *testing.T) {
	data, err := os.ReadFile("../../deploy/grafana/kproxy.json")
	if err != nil {
		t.Fatal(err)
	}
	type panel struct {
		Title   string
		Targets []struct{ Expr string }
	}
	var dash struct{ Panels []panel }
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	known := map[string]bool{}
	for _, w := range upstreamMetrics {
		known[w.name] = true
	}
	for _, n := range []string{ServiceNewConnections, ServicePackets, ServiceBytes} {
		known[n] = true
	}
	name := regexp.MustCompile(`(kubeproxy|kproxy)_[a-z_]+`)
	used := 0
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			for _, m := range name.FindAllString(tg.Expr, -1) {
				used++
				base := m
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					base = strings.TrimSuffix(base, suffix)
				}
				if !known[base] {
					t.Errorf("panel %q queries %s, which kproxy does not export", p.Title, m)
				}
			}
		}
	}
	if !slices.ContainsFunc(dash.Panels, func(p panel) bool {
		return len(p.Targets) > 0 && strings.Contains(p.Targets[0].Expr, ServiceNewConnections)
	}) {
		t.Errorf("no panel shows %s", ServiceNewConnections)
	}
	if used == 0 || !slices.ContainsFunc(dash.Panels, func(p panel) bool { return strings.Contains(p.Title, "Sync duration") }) {
		t.Errorf("the dashboard queries no kubeproxy_* metric")
	}
}
