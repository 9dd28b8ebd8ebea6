//go:build e2e

package bench

import (
	"maps"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/test/testbed/controlplane"
)

// Unprivileged checks of the benchmark's pure helpers (run without
// KPROXY_BENCH: `go test -tags e2e -run TestPure ./test/bench/`).

func TestPureHistogram(t *testing.T) {
	text := `# HELP kubeproxy_sync_proxy_rules_duration_seconds x
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="0.001"} 1
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="0.002"} 3
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="+Inf"} 4
kubeproxy_sync_proxy_rules_duration_seconds_sum{ip_family="IPv4"} 0.01
kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"} 4
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv6",le="0.001"} 1
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv6",le="0.002"} 1
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv6",le="+Inf"} 1
kubeproxy_sync_proxy_rules_duration_seconds_sum{ip_family="IPv6"} 0.0005
kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv6"} 1
other_metric 7
`
	h := parseHistograms(text, metricSync)[metricSync]
	if h.count != 5 || math.Abs(h.sum-0.0105) > 1e-9 || h.series != 2 {
		t.Fatalf("count %v sum %v series %d, want 5, 0.0105 and 2", h.count, h.sum, h.series)
	}
	cases := []struct{ q, want float64 }{
		{0.2, 0.0005},  // rank 1: half of the first bucket (2)
		{0.6, 0.0015},  // rank 3 of buckets 2 (at 0.001) .. 4 (at 0.002)
		{0.99, 0.002},  // in +Inf: the last finite bound
		{0.0, 0.0},     // rank 0
		{0.4, 0.001},   // rank 2 = first bucket's count
		{0.8, 0.002},   // rank 4 = second bucket's count
		{1.0, 0.002},   // all
		{0.5, 0.00125}, // rank 2.5
	}
	for _, c := range cases {
		if got := h.quantile(c.q); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("quantile(%v) = %v, want %v", c.q, got, c.want)
		}
	}
	d := h.sub(h)
	if d.count != 0 || !math.IsNaN(d.mean()) || !math.IsNaN(d.quantile(0.5)) {
		t.Errorf("h - h = %+v, want empty", d)
	}
}

func TestPureSummarize(t *testing.T) {
	cases := []struct {
		in   []float64
		want string
	}{
		{[]float64{2}, "2.0"},
		{[]float64{3, 1, 2}, "2.0 (1.0–3.0)"},
		{[]float64{4, 1, 2, 3}, "2.5 (1.0–4.0)"},
		{[]float64{5, 5}, "5.0"},
	}
	for _, c := range cases {
		s, ok := summarize(c.in)
		if !ok || s.format(1) != c.want {
			t.Errorf("summarize(%v) = %q, want %q", c.in, s.format(1), c.want)
		}
	}
	if _, ok := summarize(nil); ok {
		t.Error("summarize(nil) reported a value")
	}
}

func TestPureUpdateDoc(t *testing.T) {
	path := filepath.Join(t.TempDir(), "perf.md")
	if err := os.WriteFile(path, []byte("# title\n\nbefore\n"+docBegin+"\nSTALE-CONTENT\n"+docEnd+"\nafter\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	st := store{}
	for _, proxy := range []string{"kproxy", "upstream"} {
		e := entry{Size: "10×2", Mode: "nftables", Proxy: proxy, Runs: 1,
			Values: map[string][]float64{"cold_start_s": {map[string]float64{"kproxy": 1, "upstream": 3}[proxy]}}}
		st[e.key()] = e
	}
	if err := updateDoc(path, st); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	got := string(b)
	for _, want := range []string{"before\n" + docBegin, docEnd + "\nafter", "| 1.00 | 3.00 | 3.00× |", "10 × 2 Services"} {
		if !strings.Contains(got, want) {
			t.Errorf("document lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "STALE-CONTENT") {
		t.Errorf("old generated part kept:\n%s", got)
	}
}

func TestPureObjects(t *testing.T) {
	if got := addrAdd(netip.MustParseAddr("198.18.130.250"), 10); got != netip.MustParseAddr("198.18.131.4") {
		t.Errorf("addrAdd = %s", got)
	}
	for _, i := range []int{0, narrowServices - 1} {
		if ip := clusterIP(i); !controlplane.ServiceCIDR4.Contains(ip) {
			t.Errorf("Service %d's ClusterIP %s is outside the API server's Service CIDR", i, ip)
		}
	}
	for _, i := range []int{narrowServices, maxServices - 1} {
		if ip, wide := clusterIP(i), controlplane.WideServiceCIDR4; !wide.Contains(ip) || ip == wide.Addr() || ip == lastAddr(wide) {
			t.Errorf("Service %d's ClusterIP %s is not an allocatable address of %s", i, ip, wide)
		}
	}
	pods := map[netip.Addr]bool{}
	for _, p := range plannedPods() {
		pods[p.ip] = true
	}
	seen := map[string]bool{}
	for k := range fakeEndpointSpace {
		ep := fakeEndpoint(k)
		a := netip.MustParseAddr(ep.Addresses[0])
		if pods[a] || seen[a.String()] {
			t.Fatalf("fake endpoint %d = %s collides", k, a)
		}
		seen[a.String()] = true
	}
	if s := sampleIndexes(1000); len(s) != sampleCount || s[0] != 0 || s[len(s)-1] != 999 {
		t.Errorf("sampleIndexes(1000) = %v", s)
	}
	if s := sampleIndexes(3); len(s) != 3 {
		t.Errorf("sampleIndexes(3) = %v", s)
	}
}

func TestRecordLatencies(t *testing.T) {
	var lat []time.Duration
	for i := 100; i >= 1; i-- {
		lat = append(lat, time.Duration(i)*time.Millisecond)
	}
	f := newFigures()
	recordLatencies(f, lat)
	setQuantiles(f, "watch", lat[:0], 0.5)
	want := map[string]float64{"change_p50_ms": 50, "change_p90_ms": 90, "change_p99_ms": 99, "change_max_ms": 100}
	if !maps.Equal(f.values, want) {
		t.Errorf("figures %v, want %v", f.values, want)
	}
	if lat[0] != 100*time.Millisecond {
		t.Error("recordLatencies reordered its input")
	}
}

func TestPureProcIPVSVirtualAddrs(t *testing.T) {
	dump := `IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port Forward Weight ActiveConn InActConn
TCP  C6128205:0050 rr
  -> C6120A0A:1F90      Masq    1      0          0
UDP  C6128206:0035 rr persistent 10800
SCTP C6128207:0050 sh
TCP  [fd00:0000:0000:0000:0000:0000:0000:0001]:0050 rr
`
	got := procIPVSVirtualAddrs(dump)
	want := []string{"198.18.130.5", "198.18.130.6", "198.18.130.7"}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for _, w := range want {
		if !got[netip.MustParseAddr(w)] {
			t.Errorf("%s missing from %v", w, got)
		}
	}
}

func TestPureInputsSynced(t *testing.T) {
	began := time.Date(2026, 11, 27, 23, 59, 58, 0, time.UTC)
	log := "I1127 23:59:58.100000   22943 api.go:72] \"Watching the API server\"\n" +
		"I1128 00:00:01.250000   22943 runner.go:182] \"Inputs synced, syncing may start\" logger=\"runner\"\n"
	at, ok := inputsSynced(log, began)
	if want := 3250 * time.Millisecond; !ok || at.Sub(began) != want {
		t.Errorf("inputsSynced = %v, %v; want %v after start", at.Sub(began), ok, want)
	}
	if _, ok := inputsSynced("I1127 23:59:58.100000 1 x.go:1] nothing\n", began); ok {
		t.Error("found in a log without the line")
	}
}
