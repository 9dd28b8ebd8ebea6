package metrics

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	kpmodel "github.com/kproxy/kproxy/internal/model"
)

type wantMetric struct {
	name    string
	typ     dto.MetricType
	help    string
	labels  []string
	buckets int // histograms only; a scrape shows +Inf as a bucket too
	modes   []string
}

var (
	allModes   = []string{ModeIPTables, ModeIPVS, ModeNFTables, ModeKernelspace}
	ruleModes  = []string{ModeIPTables, ModeNFTables}
	ctModes    = []string{ModeIPTables, ModeIPVS, ModeNFTables}
	iptModes   = []string{ModeIPTables, ModeIPVS}
	onlyIPT    = []string{ModeIPTables}
	onlyNFT    = []string{ModeNFTables}
	counterT   = dto.MetricType_COUNTER
	gaugeT     = dto.MetricType_GAUGE
	histogramT = dto.MetricType_HISTOGRAM
	fam        = []string{"ip_family"}
)

// upstreamMetrics is upstream v1.36's pkg/proxy/metrics, metric by metric.
var upstreamMetrics = []wantMetric{
	{"kubeproxy_sync_proxy_rules_duration_seconds", histogramT, "SyncProxyRules latency in seconds", fam, 16, allModes},
	{"kubeproxy_sync_full_proxy_rules_duration_seconds", histogramT, "SyncProxyRules latency in seconds for full resyncs", fam, 16, ruleModes},
	{"kubeproxy_sync_partial_proxy_rules_duration_seconds", histogramT, "SyncProxyRules latency in seconds for partial resyncs", fam, 16, ruleModes},
	{"kubeproxy_sync_proxy_rules_last_timestamp_seconds", gaugeT, "The last time proxy rules were successfully synced", fam, 0, allModes},
	{"kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds", gaugeT, "The last time a sync of proxy rules was queued", fam, 0, allModes},
	{"kubeproxy_network_programming_duration_seconds", histogramT, "In Cluster Network Programming Latency in seconds", fam, 1 + 2 + 59 + 12 + 7 + 1, allModes},
	{"kubeproxy_sync_proxy_rules_endpoint_changes_pending", gaugeT, "Pending proxy rules Endpoint changes", nil, 0, allModes},
	{"kubeproxy_sync_proxy_rules_endpoint_changes_total", counterT, "Cumulative proxy rules Endpoint changes", nil, 0, allModes},
	{"kubeproxy_sync_proxy_rules_service_changes_pending", gaugeT, "Pending proxy rules Service changes", nil, 0, allModes},
	{"kubeproxy_sync_proxy_rules_service_changes_total", counterT, "Cumulative proxy rules Service changes", nil, 0, allModes},
	{"kubeproxy_sync_proxy_rules_no_local_endpoints_total", gaugeT, "Number of services with a Local traffic policy and no endpoints", []string{"ip_family", "traffic_policy"}, 0, allModes},
	{"kubeproxy_proxy_healthz_total", counterT, "Cumulative proxy healthz HTTP status", []string{"code"}, 0, allModes},
	{"kubeproxy_proxy_livez_total", counterT, "Cumulative proxy livez HTTP status", []string{"code"}, 0, allModes},
	{"kubeproxy_sync_proxy_rules_iptables_restore_failures_total", counterT, "Cumulative proxy iptables restore failures", fam, 0, iptModes},
	{"kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total", counterT, "Cumulative proxy iptables partial restore failures", fam, 0, onlyIPT},
	{"kubeproxy_sync_proxy_rules_iptables_total", gaugeT, "Total number of iptables rules owned by kube-proxy", []string{"ip_family", "table"}, 0, onlyIPT},
	{"kubeproxy_sync_proxy_rules_iptables_last", gaugeT, "Number of iptables rules written by kube-proxy in last sync", []string{"ip_family", "table"}, 0, onlyIPT},
	{"kubeproxy_sync_proxy_rules_nftables_sync_failures_total", counterT, "Cumulative proxy nftables sync failures", fam, 0, onlyNFT},
	{"kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total", counterT, "Cumulative proxy nftables cleanup failures", fam, 0, onlyNFT},
	{"kubeproxy_conntrack_reconciler_sync_duration_seconds", histogramT, "ReconcileConntrackFlowsLatency latency in seconds", fam, 16, ctModes},
	{"kubeproxy_conntrack_reconciler_deleted_entries_total", counterT, "Cumulative conntrack flows deleted by conntrack reconciler", fam, 0, ctModes},
	{"kubeproxy_iptables_ct_state_invalid_dropped_packets_total", counterT, "packets dropped by iptables to work around conntrack problems", nil, 0, onlyIPT},
	{"kubeproxy_iptables_localhost_nodeports_accepted_packets_total", counterT, "Number of packets accepted on nodeports of loopback interface", nil, 0, onlyIPT},
	// kproxy's own.
	{"kproxy_network_programming_duration_seconds", histogramT, "In Cluster Network Programming Latency in seconds, from an EndpointSlice's last-change-trigger-time to its rules in the kernel; finer buckets than kubeproxy_network_programming_duration_seconds", fam, 17 + 1, allModes},
	{"kproxy_iptables_writer", gaugeT, "How iptables mode writes rules: 1 for the writer in use (netlink, in iptables-nft's encoding, or iptables-restore)", []string{"writer"}, 0, onlyIPT},
}

// touchAll calls every recording method, so that every vector has a child
// and shows up in a scrape.
func touchAll(m *Metrics) {
	now := time.Unix(1700000000, 0)
	for _, f := range []kpmodel.Family{kpmodel.IPv4, kpmodel.IPv6} {
		m.SyncQueued(f, now)
		m.SyncDuration(f, true, time.Millisecond)
		m.SyncDuration(f, false, time.Millisecond)
		m.SyncSucceeded(f, now)
		m.NetworkProgrammed(f, time.Second)
		m.NoLocalEndpoints(f, 1, 2)
		m.ConntrackReconciled(f, time.Millisecond, 3)
		m.NFTablesSyncFailed(f)
		m.NFTablesCleanupFailed(f)
		m.IPTablesRestoreFailed(f)
		m.IPTablesPartialRestoreFailed(f)
		m.IPTablesRules(f, "nat", 10, 5)
	}
	m.IPTablesWriter("netlink")
	m.ServiceChanged(1)
	m.EndpointsChanged(1)
	m.HealthzRequest(200)
	m.LivezRequest(503)
}

func fakeNFAcct(counter string) (uint64, error) { return 7, nil }

// scrape serves the registry through the metrics server and parses /metrics.
func scrape(t *testing.T, s *Server) map[string]*dto.MetricFamily {
	t.Helper()
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("/metrics: %d %s", rec.Code, rec.Body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(rec.Body.String()))
	if err != nil {
		t.Fatalf("parsing /metrics: %v", err)
	}
	return fams
}

func labelNames(mf *dto.MetricFamily) []string {
	var out []string
	for _, lp := range mf.GetMetric()[0].GetLabel() {
		out = append(out, lp.GetName())
	}
	sort.Strings(out)
	return out
}

func TestScrapeHasUpstreamMetrics(t *testing.T) {
	for _, mode := range allModes {
		t.Run(mode, func(t *testing.T) {
			reg := NewRegistry()
			m, err := New(reg, Options{Mode: mode, NFAcct: fakeNFAcct})
			if err != nil {
				t.Fatal(err)
			}
			touchAll(m)
			fams := scrape(t, NewServer(ServerConfig{Gatherer: reg, Mode: mode}))
			for _, w := range upstreamMetrics {
				checkMetric(t, fams, w, slices.Contains(w.modes, mode))
			}
			for name := range fams {
				if strings.HasPrefix(name, "kubeproxy_") && !isUpstream(name) {
					t.Errorf("unexpected metric %s", name)
				}
			}
			for _, name := range []string{"go_goroutines", "process_start_time_seconds", "registered_metrics_total"} {
				if fams[name] == nil {
					t.Errorf("missing %s", name)
				}
			}
		})
	}
}

func checkMetric(t *testing.T, fams map[string]*dto.MetricFamily, w wantMetric, want bool) {
	t.Helper()
	mf := fams[w.name]
	if !want {
		if mf != nil {
			t.Errorf("%s: registered, upstream does not in this mode", w.name)
		}
		return
	}
	if mf == nil {
		t.Errorf("%s: missing", w.name)
		return
	}
	if mf.GetType() != w.typ {
		t.Errorf("%s: type %v, want %v", w.name, mf.GetType(), w.typ)
	}
	if got, want := mf.GetHelp(), "[ALPHA] "+w.help; got != want {
		t.Errorf("%s: help %q, want %q", w.name, got, want)
	}
	if got := labelNames(mf); !slices.Equal(got, w.labels) {
		t.Errorf("%s: labels %v, want %v", w.name, got, w.labels)
	}
	if w.typ == histogramT {
		if got := len(mf.GetMetric()[0].GetHistogram().GetBucket()); got != w.buckets {
			t.Errorf("%s: %d buckets, want %d", w.name, got, w.buckets)
		}
	}
}

func isUpstream(name string) bool {
	for _, w := range upstreamMetrics {
		if w.name == name {
			return true
		}
	}
	return false
}

func TestBuckets(t *testing.T) {
	sync := syncBuckets()
	if sync[0] != 0.001 || sync[14] != 16.384 {
		t.Errorf("sync buckets %v", sync)
	}
	// upstream's MergeBuckets starts with a 0 bucket.
	p := programmingBuckets()
	want := map[int]float64{0: 0, 1: 0.25, 2: 0.5, 3: 1, 61: 59, 62: 60, 73: 115, 74: 120, 80: 300}
	if len(p) != 81 {
		t.Errorf("%d programming buckets, want 81", len(p))
	}
	for i, v := range want {
		if p[i] != v {
			t.Errorf("programming bucket %d = %v, want %v", i, p[i], v)
		}
	}
}

func TestNewTwiceOnOneRegistryFails(t *testing.T) {
	reg := NewRegistry()
	if _, err := New(reg, Options{Mode: ModeNFTables}); err != nil {
		t.Fatal(err)
	}
	if _, err := New(reg, Options{Mode: ModeNFTables}); err == nil {
		t.Fatal("second New on the same registry succeeded")
	}
}

func TestNilMetricsIsNoop(t *testing.T) {
	var m *Metrics
	touchAll(m)
	m.ObserveSync(SyncResult{Err: errors.New("x")})
}

func TestIPTablesWithoutNFAcct(t *testing.T) {
	reg := NewRegistry()
	if _, err := New(reg, Options{Mode: ModeIPTables}); err != nil {
		t.Fatal(err)
	}
	fams := scrape(t, NewServer(ServerConfig{Gatherer: reg}))
	if fams["kubeproxy_iptables_ct_state_invalid_dropped_packets_total"] != nil {
		t.Error("nfacct metric registered without a reader")
	}
}

func TestNFAcctReadFailureLeavesSampleOut(t *testing.T) {
	reg := NewRegistry()
	read := func(c string) (uint64, error) {
		if c == NFAcctCTStateInvalidDropped {
			return 0, errors.New("no such counter")
		}
		return 42, nil
	}
	if _, err := New(reg, Options{Mode: ModeIPTables, NFAcct: read}); err != nil {
		t.Fatal(err)
	}
	fams := scrape(t, NewServer(ServerConfig{Gatherer: reg}))
	if fams["kubeproxy_iptables_ct_state_invalid_dropped_packets_total"] != nil {
		t.Error("failed counter exposed")
	}
	mf := fams["kubeproxy_iptables_localhost_nodeports_accepted_packets_total"]
	if mf == nil || mf.GetMetric()[0].GetCounter().GetValue() != 42 {
		t.Errorf("localhost nodeports counter = %v", mf)
	}
}

// TestIPTablesWriter: the writer in use is 1, the other 0.
func TestIPTablesWriter(t *testing.T) {
	reg := NewRegistry()
	m, err := New(reg, Options{Mode: ModeIPTables})
	if err != nil {
		t.Fatal(err)
	}
	m.IPTablesWriter("netlink")
	m.IPTablesWriter("iptables-restore")
	fams := scrape(t, NewServer(ServerConfig{Gatherer: reg}))
	got := map[string]float64{}
	for _, s := range fams[IPTablesWriter].GetMetric() {
		got[s.GetLabel()[0].GetValue()] = s.GetGauge().GetValue()
	}
	if got["iptables-restore"] != 1 || got["netlink"] != 0 || len(got) != 2 {
		t.Fatalf("%s = %v", IPTablesWriter, got)
	}
}
