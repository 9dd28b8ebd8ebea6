package daemon

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync/atomic"

	"k8s.io/component-base/featuregate"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/conntrack"
	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/runner"
)

// daemon holds the parts of one kproxy process. newDaemon builds what needs
// no node knowledge; serve and dryRun add the dataplane once the Node is known.
type daemon struct {
	o        *config.Options
	env      env
	mode     string
	nodeName string
	inputs   Inputs
	runner   *runner.Runner
	cleaner  *conntrack.Cleaner
	// errc carries the first fatal error of a part (source, server).
	errc chan error

	// Set by prepare, before the runner starts.
	dp    dataplane.Dataplane
	dpCfg dataplane.Config
	fams  []model.Family
	obs   observers

	// queued is read by notify, which runs on source goroutines.
	queued atomic.Pointer[[]model.Family]
	// initialized is set by the first notify that finds the inputs synced
	// (or when the servers start, if they already were).
	initialized atomic.Bool
	// balancing is the mode's load-balancing default and support, given
	// to every model update.
	balancing model.BalancingOptions
	// noExtIPs is --feature-gates AllowServiceExternalIPs=false: the
	// model leaves Services' spec.externalIPs out, as upstream does.
	noExtIPs bool

	// Owned by the runner goroutine.
	prev     *model.Snapshot
	problems problemLog
	// cidrs are the Service ranges the dataplane has (handServiceCIDRs).
	cidrs []netip.Prefix
	// endColdLimit stops the first sync's memory guard (startColdLimit);
	// nil before the first sync and after it succeeded.
	endColdLimit func()
}

// newDaemon builds the daemon's parts. It starts nothing and touches
// neither the network nor the kernel.
func newDaemon(o *config.Options, e env) (*daemon, error) {
	o = ipvsFallback(o, e)
	mode := string(o.Config.Mode)
	if mode == "" {
		mode = ModeIPTables // upstream's Linux default (config.Default sets it too)
	}
	if _, ok := e.dataplanes[mode]; !ok {
		return nil, fmt.Errorf("proxy mode %q is not available (have %v)", mode, sortedModes(e.dataplanes))
	}
	name, err := nodeName(o.Config.HostnameOverride, e.hostname)
	if err != nil {
		return nil, err
	}
	lb, err := balancingFor(mode, o.LoadBalancing)
	if err != nil {
		return nil, err
	}
	d := &daemon{o: o, env: e, mode: mode, nodeName: name, balancing: lb, noExtIPs: !externalIPsAllowed(o.FeatureGate),
		cleaner: conntrack.NewCleaner(e.conntrack), errc: make(chan error, 1)}
	// The runner exists before the sources, which may notify at once.
	if d.runner, err = runner.New(d.runnerConfig(), d.sync); err != nil {
		return nil, err
	}
	if d.inputs, err = e.inputs(o, name, d.notify); err != nil {
		return nil, fmt.Errorf("setting up sources: %w", err)
	}
	d.problems.events = d.inputs.Events
	return d, nil
}

// runnerConfig maps the mode's sync periods onto the runner as upstream v1.36
// does: iptables and nftables sync at least hourly (always full), retry after
// syncPeriod; ipvs syncs every syncPeriod, each time whole: upstream's IPVS
// sync re-reads the virtual servers, re-adds its chains and jumps and
// rewrites its sets and rules, which repairs what others changed (ipvsadm
// -C, ipset flush, iptables -F) within a sync period.
func (d *daemon) runnerConfig() runner.Config {
	syncPeriod, minSync := syncPeriods(d.o.Config)
	maxInterval, fullInterval := runner.FullSyncPeriod, runner.FullSyncPeriod
	if d.mode == ModeIPVS && syncPeriod > 0 {
		maxInterval, fullInterval = syncPeriod, syncPeriod
	}
	if maxInterval < minSync {
		maxInterval = minSync
	}
	return runner.Config{
		MinInterval:   minSync,
		MaxInterval:   maxInterval,
		RetryInterval: syncPeriod,
		FullInterval:  fullInterval,
		PollInterval:  d.env.pollInterval,
		Ready:         d.inputsSynced,
		Drifted:       d.drifted,
		Clock:         d.env.clock,
	}
}

// inputsSynced is the runner's Ready condition.
func (d *daemon) inputsSynced() bool { return d.inputs.Tracker.Synced() }

// notify is the tracker's callback: a change is pending. The observers
// (health's pending update, the last-queued timestamp) hear of it only once
// the inputs had been synced before it, as upstream's proxiers queue an
// update only after their initialization: the initial lists, and their end,
// are the first sync's, which a slow start (the API, a large cluster) must
// not turn into an unhealthy /healthz.
func (d *daemon) notify() {
	// queued is stored after the inputs are in place: its load orders
	// the read of d.inputs after their write.
	if fams := d.queued.Load(); fams != nil {
		// The first notify that finds them synced is their end.
		if d.inputsSynced() && d.initialized.Swap(true) {
			d.obs.Queued(*fams)
		}
	}
	d.runner.Trigger()
}

// drifted polls the dataplane; an error counts as no drift (logged).
func (d *daemon) drifted(ctx context.Context) bool {
	drifted, err := d.dp.Drifted(ctx)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Checking the dataplane for drift failed")
		return false
	}
	return drifted
}

// prepare waits for what the dataplane needs to know about the node, then
// builds the dataplane. It does not touch the kernel.
func (d *daemon) prepare(ctx context.Context) error {
	node, err := d.waitForNode(ctx)
	if err != nil {
		return err
	}
	ips := detectNodeIPs(rawNodeIPs(node), d.o.Config.BindAddress)
	if d.fams, err = families(ips.primary, d.env.ipv6()); err != nil {
		return err
	}
	logger := klog.FromContext(ctx)
	if known := ips.known(); len(known) > 0 {
		logger.Info("Successfully retrieved NodeIPs", "NodeIPs", known)
	} else {
		logger.Info("Can't determine this node's IP, assuming loopback; if this is incorrect, please set the --bind-address flag")
	}
	logger.Info("Proxy families", "families", familyNames(d.fams), "primary", ips.primary, "nodeIPs", ips.known())
	var podCIDRs []string
	if node != nil {
		podCIDRs = node.PodCIDRs
	}
	warnings, fatal := checkConfig(d.o.Config, ips.primary, d.fams, podCIDRs, nodePortAddresses(d.o.Config.NodePortAddresses, ips))
	for _, w := range warnings {
		logger.Error(w, "Kube-proxy configuration may be incomplete or incorrect")
	}
	if fatal != nil {
		return fmt.Errorf("kube-proxy configuration is incorrect: %w", fatal)
	}
	cfg, err := dataplaneConfig(d.o.Config, ips, d.fams)
	if err != nil {
		return err
	}
	cfg.NoIPTablesNetlink = d.o.NoIPTablesNetlink
	d.dpCfg = cfg
	d.cidrs = cfg.ServiceCIDRs
	if d.dp, err = d.env.dataplanes[d.mode](cfg); err != nil {
		return fmt.Errorf("creating the %s dataplane: %w", d.mode, err)
	}
	return nil
}

// runSource runs the source until ctx is done; its failure ends the daemon.
func (d *daemon) runSource(ctx context.Context) {
	err := d.inputs.Source.Run(ctx)
	if err != nil && ctx.Err() == nil {
		d.fail(fmt.Errorf("source failed: %w", err))
	}
}

// fail reports a part's fatal error; the first one ends the daemon.
func (d *daemon) fail(err error) {
	select {
	case d.errc <- err:
	default:
	}
}

// cleanupConfig is the configuration handed to backends only to clean up.
func cleanupConfig(e env) dataplane.Config {
	fams := []model.Family{model.IPv4}
	if e.ipv6() {
		fams = append(fams, model.IPv6)
	}
	return dataplane.Config{Families: fams}
}

// leftoverModes are the modes whose kernel state is removed when starting in
// mode, as upstream does: nftables removes iptables and ipvs state, the
// iptables-based modes (which share chains) remove nftables state; every
// mode removes the userspace mode's interface, and the userspace mode
// removes every other mode's state.
func leftoverModes(mode string, available map[string]DataplaneFunc) []string {
	iptablesBased := func(m string) bool { return m == ModeIPTables || m == ModeIPVS }
	var out []string
	for _, m := range sortedModes(available) {
		if m == mode || (iptablesBased(m) && iptablesBased(mode)) {
			continue
		}
		out = append(out, m)
	}
	return out
}

func sortedModes(m map[string]DataplaneFunc) []string {
	return slices.Sorted(maps.Keys(m))
}

var errNoDryRun = errors.New("does not support --dry-run")

func familyNames(fams []model.Family) []string {
	out := make([]string, len(fams))
	for i, f := range fams {
		out[i] = f.String()
	}
	return out
}

// allowServiceExternalIPs is upstream's gate (GA, on by default, not
// locked) that, turned off, stops every proxy mode from proxying Services'
// spec.externalIPs.
const allowServiceExternalIPs featuregate.Feature = "AllowServiceExternalIPs"

// externalIPsAllowed reads allowServiceExternalIPs from g; a nil gate, or
// one that does not know the feature, allows them.
func externalIPsAllowed(g featuregate.FeatureGate) bool {
	return enabledByDefault(g, allowServiceExternalIPs)
}

// enabledByDefault reads a gate that is on by default: a nil gate, or one
// that does not know f, has it on.
func enabledByDefault(g featuregate.FeatureGate, f featuregate.Feature) bool {
	if g == nil {
		return true
	}
	if all, ok := g.(interface {
		GetAll() map[featuregate.Feature]featuregate.FeatureSpec
	}); ok {
		if _, known := all.GetAll()[f]; !known {
			return true
		}
	}
	return g.Enabled(f)
}
