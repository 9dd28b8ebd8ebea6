package daemon

import (
	"fmt"
	"strings"
	"time"

	"k8s.io/component-base/featuregate"
	"k8s.io/klog/v2"
	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/health"
	"github.com/kproxy/kproxy/internal/metrics"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/objects"
	"github.com/kproxy/kproxy/internal/source/api"
)

// ServerParams is what the healthz and metrics servers are built from; it is
// known once the dataplane is prepared.
type ServerParams struct {
	Options           *config.Options
	NodeName          string
	Mode              string
	Families          []model.Family
	NodePortAddresses []string
	// NodeOptional is true when the source has no cluster (file source):
	// /healthz then does not require a Node object.
	NodeOptional bool
	// Node reads this node's Node as last seen (the tracker's); /healthz
	// judges the node's eligibility from it at each request.
	Node func() model.NodeInfo
	// ServiceTraffic reads the per-Service traffic counters at scrape
	// time; nil without --service-traffic-metrics.
	ServiceTraffic metrics.ServiceTrafficReader
	// Relays reads the userspace mode's relay counters; nil in the other
	// modes.
	Relays metrics.RelayReader
	// NFAcct reads the nfacct counters of the iptables mode's packet
	// metrics; nil in the other modes or without nfacct.
	NFAcct metrics.NFAcctReader
	// Events, when set, records a Warning on a Service whose health-check
	// node port could not be opened.
	Events EventSink
}

// listenFailedEvent records, as upstream does on every sync that fails to
// open it, a FailedToStartServiceHealthcheck Warning (action Listen) on the
// Service whose health-check node port could not be opened; nil without
// a sink.
func listenFailedEvent(events EventSink) func(objects.Key, uint16, error) {
	if events == nil {
		return nil
	}
	return func(key objects.Key, _ uint16, err error) {
		events.ProxyServiceWarning(key, "FailedToStartServiceHealthcheck", "Listen", err.Error())
	}
}

// defaultServers builds the proxy health server, one health-check node port
// server per family, and the metrics server, with the observer that feeds
// them from the sync loop.
func defaultServers(p ServerParams) ([]Server, []Observer, error) {
	cfg := p.Options.Config
	reg := metrics.NewRegistry()
	m, err := metrics.New(reg, metrics.Options{Mode: p.Mode, FeatureGate: api.EffectiveGates(p.Options.FeatureGate, cfg.FeatureGates),
		ServiceTraffic: p.ServiceTraffic, Relays: p.Relays, NFAcct: p.NFAcct, Logger: klog.Background().WithName("metrics")})
	if err != nil {
		return nil, nil, fmt.Errorf("registering metrics: %w", err)
	}
	syncPeriod, _ := syncPeriods(cfg)
	hs := health.NewProxyHealthServer(health.ProxyConfig{
		Addr:         cfg.HealthzBindAddress,
		Timeout:      2 * syncPeriod,
		NodeOptional: p.NodeOptional,
		Node:         p.Node,
		Counter:      m,
	})
	obs := &serverObserver{health: hs, metrics: m, services: map[model.Family]*health.ServiceHealthServer{}}
	servers := []Server{hs}
	for _, f := range p.Families {
		shs := health.NewServiceHealthServer(health.ServiceConfig{
			NodeName: p.NodeName, Family: f, NodePortAddresses: p.NodePortAddresses,
			Proxy: hs, Logger: klog.Background().WithValues("family", f.String()),
			ListenFailed: listenFailedEvent(p.Events),
		})
		obs.services[f] = shs
		servers = append(servers, shs)
	}
	mcfg := metrics.ServerConfig{
		Addr: cfg.MetricsBindAddress, Gatherer: reg, Mode: p.Mode,
		Configz: func() any { return configz(cfg) }, Profiling: cfg.EnableProfiling,
	}
	if enabledByDefault(p.Options.FeatureGate, componentStatusz) {
		mcfg.Statusz = &metrics.Statusz{BinaryVersion: strings.TrimPrefix(config.UpstreamVersion, "v"), EmulationVersion: emulationVersion()}
	}
	if enabledByDefault(p.Options.FeatureGate, componentFlagz) {
		mcfg.Flagz = p.Options.Flagz
	}
	servers = append(servers, metrics.NewServer(mcfg))
	return servers, []Observer{obs}, nil
}

// The gates of upstream's /statusz and /flagz (beta, on by default).
const (
	componentStatusz featuregate.Feature = "ComponentStatusz"
	componentFlagz   featuregate.Feature = "ComponentFlagz"
)

// emulationVersion is the upstream release's major.minor.
func emulationVersion() string {
	v := strings.Split(strings.TrimPrefix(config.UpstreamVersion, "v"), ".")
	return strings.Join(v[:min(2, len(v))], ".")
}

// configz is the effective configuration as /configz shows it.
func configz(cfg *kpv1alpha1.KubeProxyConfiguration) any {
	return config.Canonical(cfg)
}

// serverObserver feeds the health and metrics servers from the sync loop.
type serverObserver struct {
	health   *health.ProxyHealthServer
	metrics  *metrics.Metrics
	services map[model.Family]*health.ServiceHealthServer
}

// The change-event methods make serverObserver a ChangeObserver.
//
// A Service event counts once per family proxied, as upstream's dual-stack
// proxy hands each Service event to both of its per-family proxiers, each
// counting it; an EndpointSlice belongs to one family and counts once.
func (o *serverObserver) ServiceChanged(pending int) {
	for range max(len(o.services), 1) {
		o.metrics.ServiceChanged(pending)
	}
}
func (o *serverObserver) EndpointsChanged(pending int) { o.metrics.EndpointsChanged(pending) }
func (o *serverObserver) ChangesPending(services, endpoints int) {
	o.metrics.ChangesPending(services, endpoints)
}

func (o *serverObserver) Started(fams []model.Family) {
	now := time.Now()
	for _, f := range fams {
		o.health.Updated(f)
		o.metrics.SyncQueued(f, now)
	}
}

func (o *serverObserver) Queued(fams []model.Family) {
	now := time.Now()
	for _, f := range fams {
		o.health.QueuedUpdate(f)
		o.metrics.SyncQueued(f, now)
	}
}

func (o *serverObserver) Synced(r SyncReport) {
	for _, f := range r.Families {
		res := metrics.SyncResult{Family: f, Full: r.Full, Duration: r.Duration, End: r.Start.Add(r.Duration), Programmed: r.Programmed, Err: r.Err}
		if r.Snapshot != nil {
			res.Snapshot = r.Snapshot.Family(f)
		}
		// Each slice's trigger time counts under its own family, as
		// upstream's per-family proxiers observe them.
		res.TriggerTimes = r.TriggerTimes[f]
		o.metrics.ObserveSync(res)
		if r.Err != nil || r.Snapshot == nil {
			continue
		}
		o.health.Updated(f)
		if shs := o.services[f]; shs != nil {
			if err := shs.SyncSnapshot(r.Snapshot.Family(f)); err != nil {
				klog.Background().Error(err, "Updating health-check node ports failed", "family", f.String())
			}
		}
	}
	for _, f := range r.CleanupFailed {
		o.metrics.NFTablesCleanupFailed(f)
	}
	for _, c := range r.Rules {
		o.metrics.IPTablesRules(c.Family, c.Table, c.Total, c.LastSync)
	}
	o.metrics.IPTablesWriter(r.Writer)
	for _, c := range r.Conntrack {
		if !c.Skipped {
			o.metrics.ConntrackReconciled(c.Family, c.Duration, c.Deleted)
		}
	}
}
