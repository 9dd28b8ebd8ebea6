package metrics

import (
	"fmt"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/component-base/featuregate"
	k8smetrics "k8s.io/component-base/metrics"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/model"
)

// Options selects which metrics New registers.
type Options struct {
	// Mode is the proxy mode (iptables, ipvs, nftables, kernelspace); it
	// decides the mode-specific metrics, as upstream does.
	Mode string
	// NFAcct reads nfacct counters. In iptables mode, when set, the two
	// kubeproxy_iptables_*_packets_total metrics are registered; when nil they
	// are not (upstream leaves them out when it cannot open nfacct).
	NFAcct NFAcctReader
	// ServiceTraffic, when set, reads the per-Service traffic counters
	// (--service-traffic-metrics) at each scrape, for the kproxy_service_*
	// metrics; when nil they are not registered.
	ServiceTraffic ServiceTrafficReader
	// Relays, when set, reads the userspace mode's relay counters at each
	// scrape, for the kproxy_userspace_* metrics.
	Relays RelayReader
	// Logger logs failed nfacct and traffic reads; the zero value discards.
	Logger klog.Logger
	// FeatureGate, when set, is published as kubernetes_feature_enabled
	// (one series per known gate), as every Kubernetes component does.
	FeatureGate featuregate.FeatureGate
}

// Metrics records kproxy's kubeproxy_* metrics. Its methods are safe for
// concurrent use. A nil *Metrics records nothing.
type Metrics struct {
	mode string
	s    *set
}

// NewRegistry returns a registry with what upstream's global registry also
// carries besides kube-proxy's own metrics: the process and Go runtime
// collectors, the registry's meta metrics (registered_metrics_total, ...),
// kubernetes_build_info (git_version is the kube-proxy version kproxy is
// compatible with) and client-go's rest_client_* metrics. client-go reports
// to the registry made last (its hooks are process-wide).
func NewRegistry() k8smetrics.KubeRegistry {
	reg := k8smetrics.NewKubeRegistry()
	reg.RawMustRegister(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.RawMustRegister(collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(collectors.MetricsAll)))
	reg.RegisterMetaMetrics()
	registerBuildInfo(reg, config.UpstreamVersion)
	registerRestClient(reg)
	return reg
}

// New creates the metrics of o.Mode and registers them on reg. It fails
// when a metric is already registered there.
func New(reg k8smetrics.KubeRegistry, o Options) (*Metrics, error) {
	m := &Metrics{mode: o.Mode, s: newSet()}
	for _, c := range append(m.s.common(), m.s.forMode(o.Mode)...) {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering %s: %w", c.FQName(), err)
		}
	}
	if o.FeatureGate != nil {
		if err := registerFeatures(reg, o.FeatureGate); err != nil {
			return nil, err
		}
	}
	if o.Mode == ModeIPTables && o.NFAcct != nil {
		for _, c := range newNFAcctCollectors(o.NFAcct, o.Logger) {
			if err := reg.CustomRegister(c); err != nil {
				return nil, fmt.Errorf("registering nfacct metrics: %w", err)
			}
		}
	}
	if o.Relays != nil {
		if err := reg.CustomRegister(newRelayCollector(o.Relays)); err != nil {
			return nil, fmt.Errorf("registering relay metrics: %w", err)
		}
	}
	if o.ServiceTraffic != nil {
		if err := reg.CustomRegister(newTrafficCollector(o.ServiceTraffic, o.Logger)); err != nil {
			return nil, fmt.Errorf("registering Service traffic metrics: %w", err)
		}
	}
	return m, nil
}

// Mode returns the proxy mode the metrics were registered for.
func (m *Metrics) Mode() string { return m.mode }

// seconds is a Unix time in seconds, as Prometheus SetToCurrentTime writes.
func seconds(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// SyncQueued records that a sync of family f was requested at t
// (kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds). Upstream also
// sets it when the sync loop starts.
func (m *Metrics) SyncQueued(f model.Family, t time.Time) {
	if m == nil {
		return
	}
	m.s.lastQueued.WithLabelValues(f.String()).Set(seconds(t))
}

// SyncDuration records how long one sync attempt of family f took, whether
// or not it succeeded: the overall histogram, and the full or partial one
// (those two exist in iptables and nftables modes only).
func (m *Metrics) SyncDuration(f model.Family, full bool, d time.Duration) {
	if m == nil {
		return
	}
	fam := f.String()
	m.s.syncLatency.WithLabelValues(fam).Observe(d.Seconds())
	if full {
		m.s.syncFullLatency.WithLabelValues(fam).Observe(d.Seconds())
	} else {
		m.s.syncPartialLatency.WithLabelValues(fam).Observe(d.Seconds())
	}
}

// SyncSucceeded records the time t of a successful sync of family f
// (kubeproxy_sync_proxy_rules_last_timestamp_seconds).
func (m *Metrics) SyncSucceeded(f model.Family, t time.Time) {
	if m == nil {
		return
	}
	m.s.lastSync.WithLabelValues(f.String()).Set(seconds(t))
}

// NetworkProgrammed records the time from an object change (its
// last-change-trigger-time) to the sync that programmed it.
func (m *Metrics) NetworkProgrammed(f model.Family, latency time.Duration) {
	if m == nil {
		return
	}
	m.s.programming.WithLabelValues(f.String()).Observe(latency.Seconds())
	m.s.programmingFine.WithLabelValues(f.String()).Observe(latency.Seconds())
}

// NoLocalEndpoints sets how many services of family f have a Local traffic
// policy (internal or external) and no local endpoints.
func (m *Metrics) NoLocalEndpoints(f model.Family, internal, external int) {
	if m == nil {
		return
	}
	m.s.noLocalEndpoints.WithLabelValues(PolicyInternal, f.String()).Set(float64(internal))
	m.s.noLocalEndpoints.WithLabelValues(PolicyExternal, f.String()).Set(float64(external))
}

// ServiceChanged counts one Service event that changed the proxy's input
// and sets the number of Services now pending.
func (m *Metrics) ServiceChanged(pending int) {
	if m == nil {
		return
	}
	m.s.servicesTotal.Inc()
	m.s.servicesPending.Set(float64(pending))
}

// EndpointsChanged counts one EndpointSlice event that changed the proxy's
// input and sets the number of Services whose endpoints are now pending.
func (m *Metrics) EndpointsChanged(pending int) {
	if m == nil {
		return
	}
	m.s.endpointsTotal.Inc()
	m.s.endpointsPending.Set(float64(pending))
}

// ChangesPending sets the pending Service and endpoint changes; a sync that
// takes the changes sets both to 0, as upstream does.
func (m *Metrics) ChangesPending(services, endpoints int) {
	if m == nil {
		return
	}
	m.s.servicesPending.Set(float64(services))
	m.s.endpointsPending.Set(float64(endpoints))
}

// HealthzRequest counts one /healthz answer with HTTP status code.
func (m *Metrics) HealthzRequest(code int) {
	if m == nil {
		return
	}
	m.s.healthz.WithLabelValues(strconv.Itoa(code)).Inc()
}

// LivezRequest counts one /livez answer with HTTP status code.
func (m *Metrics) LivezRequest(code int) {
	if m == nil {
		return
	}
	m.s.livez.WithLabelValues(strconv.Itoa(code)).Inc()
}

// ConntrackReconciled records one stale-conntrack cleanup of family f: its
// duration and how many entries it deleted.
func (m *Metrics) ConntrackReconciled(f model.Family, d time.Duration, deleted int) {
	if m == nil {
		return
	}
	m.s.conntrackLatency.WithLabelValues(f.String()).Observe(d.Seconds())
	m.s.conntrackDeleted.WithLabelValues(f.String()).Add(float64(deleted))
}

// NFTablesSyncFailed counts a failed nftables transaction.
func (m *Metrics) NFTablesSyncFailed(f model.Family) {
	if m == nil {
		return
	}
	m.s.nftSyncFailures.WithLabelValues(f.String()).Inc()
}

// NFTablesCleanupFailed counts a failed removal of stale nftables chains.
func (m *Metrics) NFTablesCleanupFailed(f model.Family) {
	if m == nil {
		return
	}
	m.s.nftCleanupFailures.WithLabelValues(f.String()).Inc()
}

// IPTablesRestoreFailed counts a failed iptables-restore (iptables and ipvs
// modes, including cleanup).
func (m *Metrics) IPTablesRestoreFailed(f model.Family) {
	if m == nil {
		return
	}
	m.s.iptRestoreFailures.WithLabelValues(f.String()).Inc()
}

// IPTablesPartialRestoreFailed counts a failed partial iptables-restore
// (followed by a full one).
func (m *Metrics) IPTablesPartialRestoreFailed(f model.Family) {
	if m == nil {
		return
	}
	m.s.iptPartialRestoreFailures.WithLabelValues(f.String()).Inc()
}

// IPTablesWriter records how iptables mode writes rules
// (kproxy_iptables_writer{writer}: 1 for it, 0 for the other).
func (m *Metrics) IPTablesWriter(writer string) {
	if m == nil || writer == "" {
		return
	}
	for _, w := range []string{"netlink", "iptables-restore"} {
		v := 0.0
		if w == writer {
			v = 1
		}
		m.s.iptWriter.WithLabelValues(w).Set(v)
	}
}

// IPTablesRules sets, for one table ("filter", "nat") of family f, the
// number of rules kproxy owns and the number written in the last sync.
func (m *Metrics) IPTablesRules(f model.Family, table string, total, lastSync int) {
	if m == nil {
		return
	}
	m.s.iptRulesTotal.WithLabelValues(table, f.String()).Set(float64(total))
	m.s.iptRulesLast.WithLabelValues(table, f.String()).Set(float64(lastSync))
}
