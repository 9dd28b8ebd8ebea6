package daemon

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/conntrack"
	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/health"
	"github.com/kproxy/kproxy/internal/metrics"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/objects"
)

// serverRetry is how long a failed server waits before listening again when
// bindAddressHardFail is off (upstream: 5 s).
const serverRetry = 5 * time.Second

// serve runs the proxy until ctx is done or a part fails for good.
func (d *daemon) serve(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	startMemoryPolicy()
	wg.Go(func() { d.runSource(ctx) })
	if err := d.prepare(ctx); err != nil {
		return err
	}
	if in, ok := d.dp.(dataplane.Initializer); ok {
		if err := in.Init(ctx); err != nil {
			return fmt.Errorf("initializing the %s dataplane: %w", d.mode, err)
		}
	}
	d.applyOOMScoreAdj(ctx)
	if err := conntrack.ApplySysctls(ctx, &d.o.Config.Conntrack, d.env.numCPU(), d.env.sysctls); err != nil {
		return fmt.Errorf("could not set conntrack parameters from kube-proxy configuration: %w", err)
	}
	if err := d.startServers(ctx, &wg); err != nil {
		return err
	}
	d.obs.Started(d.fams)
	if d.inputs.Events != nil {
		// Upstream's "birth cry" (like upstream's, without the Node's
		// UID: kubectl get events lists it, describe node does not).
		d.inputs.Events.NodeEvent(corev1.EventTypeNormal, "Starting", startAction, "")
	}
	wg.Go(func() { d.runner.Run(ctx) })
	if d.o.ConfigFile != "" {
		// Upstream fails to start without the watch; kproxy runs on
		// (a node out of inotify instances still gets its Services).
		if w, err := newConfigWatch(d.o.ConfigFile); err != nil {
			klog.FromContext(ctx).Error(err, "Not watching the configuration file: a change takes effect at the next start")
		} else {
			wg.Go(func() { w.run(ctx, d.errc) })
		}
	}
	klog.FromContext(ctx).Info("kproxy running", "mode", d.mode, "node", d.nodeName)
	if d.noExtIPs {
		klog.FromContext(ctx).Info("Services' externalIPs are not proxied (feature gate AllowServiceExternalIPs=false)")
	}

	select {
	case <-ctx.Done():
		cancel()
		wg.Wait() // no sync after this
		d.drain(ctx)
		return nil
	case err := <-d.errc:
		return err
	}
}

// drainTimeout bounds how long an exiting kproxy waits for the relays it
// holds (userspace mode) to finish: within the 30 s a Pod gets by default
// between SIGTERM and SIGKILL.
const drainTimeout = 20 * time.Second

// drain lets a dataplane that relays traffic itself finish it.
func (d *daemon) drain(ctx context.Context) {
	dr, ok := d.dp.(dataplane.Drainer)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), drainTimeout)
	defer cancel()
	start := time.Now()
	dr.Drain(ctx)
	klog.FromContext(ctx).Info("Stopped relaying", "mode", d.mode, "waited", time.Since(start).Round(time.Millisecond))
}

// applyOOMScoreAdj sets this process's oom_score_adj from oomScoreAdj; a
// failure is logged at V(2), as upstream does.
func (d *daemon) applyOOMScoreAdj(ctx context.Context) {
	adj := d.o.Config.OOMScoreAdj
	if adj == nil || d.env.oomScoreAdj == nil {
		return
	}
	if err := d.env.oomScoreAdj(int(*adj)); err != nil {
		klog.FromContext(ctx).V(2).Info("Failed to apply OOMScore", "err", err)
	}
}

// startServers builds the healthz and metrics servers and their observers,
// and runs the servers.
func (d *daemon) startServers(ctx context.Context, wg *sync.WaitGroup) error {
	trafficObs, trafficRead := d.startTraffic(ctx, wg)
	servers, obs, err := d.env.servers(ServerParams{
		Options: d.o, NodeName: d.nodeName, Mode: d.mode, Families: d.fams,
		NodePortAddresses: d.dpCfg.NodePortAddresses, NodeOptional: !d.inputs.NodeExpected,
		Node:           func() model.NodeInfo { return model.NodeInfoOf(d.nodeName, d.peekNode()) },
		ServiceTraffic: trafficRead, Relays: relayReader(d.dp), NFAcct: nfacctReader(d.dp), Events: d.inputs.Events,
	})
	if err != nil {
		return fmt.Errorf("setting up servers: %w", err)
	}
	if trafficObs != nil {
		obs = append(obs, trafficObs)
	}
	if addr := d.o.DebugBindAddress; addr != "" {
		s, o := d.debugServer(addr)
		servers, obs = append(servers, s), append(obs, o)
	}
	d.obs = obs
	if d.inputs.ObserveChanges != nil {
		for _, o := range obs {
			if co, ok := o.(ChangeObserver); ok {
				d.inputs.ObserveChanges(co)
			}
		}
	}
	fams := d.fams
	d.initialized.Store(d.inputsSynced())
	d.queued.Store(&fams) // from now on notify reports to the observers
	hardFail := d.o.Config.BindAddressHardFail
	for _, s := range servers {
		wg.Go(func() { d.runServer(ctx, s, hardFail) })
	}
	return nil
}

// startAction is the action of the Node Events about kproxy's start, as
// upstream names it.
const startAction = "StartKubeProxy"

// serverFailure is the reason of the Warning Event upstream records on its
// Node when a server fails under bindAddressHardFail: only the healthz and
// metrics servers have one.
func serverFailure(s Server) string {
	switch s.(type) {
	case *health.ProxyHealthServer:
		return "FailedToStartProxierHealthcheck"
	case *metrics.Server:
		return "FailedToStartMetricServer"
	}
	return ""
}

// runServer keeps s serving: a failure ends the daemon when hardFail is
// set, else it is logged and retried.
func (d *daemon) runServer(ctx context.Context, s Server, hardFail bool) {
	for ctx.Err() == nil {
		err := s.Run(ctx)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			err = errors.New("server stopped")
		}
		if hardFail {
			if reason := serverFailure(s); reason != "" && d.inputs.Events != nil {
				d.inputs.Events.NodeEvent(corev1.EventTypeWarning, reason, startAction, err.Error())
			}
			d.fail(err)
			return
		}
		klog.FromContext(ctx).Error(err, "Server failed, retrying", "in", serverRetry)
		select {
		case <-ctx.Done():
		case <-d.env.clock.After(serverRetry):
		}
	}
}

// waitForNode waits, bounded as upstream, for what is needed from this
// node's Node object and returns it (nil when there is none). For a source
// without a cluster it only waits for the source to be read.
func (d *daemon) waitForNode(ctx context.Context) (*objects.Node, error) {
	needCIDRs := dataplane.LocalMode(d.o.Config.DetectLocalMode) == dataplane.LocalNodeCIDR
	if !d.inputs.NodeExpected {
		if err := d.waitFor(ctx, 0, d.inputs.Tracker.Synced); err != nil {
			return nil, err
		}
		node := d.peekNode()
		if needCIDRs && (node == nil || len(node.PodCIDRs) == 0) {
			return nil, fmt.Errorf("detect-local-mode NodeCIDR needs node %q with podCIDRs in the source", d.nodeName)
		}
		return node, nil
	}
	// As upstream's node manager: the list of this node's Node first,
	// however long the API server takes to answer (on a control-plane
	// node it may start after kproxy), and only then the bounded waits
	// for the Node's addresses and pod CIDRs.
	if err := d.waitFor(ctx, 0, d.inputs.Tracker.NodeSynced); err != nil {
		return nil, err
	}
	hasIPs := func() bool { return len(rawNodeIPs(d.peekNode())) > 0 }
	if err := d.waitFor(ctx, d.env.nodeIPsWait, hasIPs); err != nil {
		return nil, err
	}
	if needCIDRs {
		hasCIDRs := func() bool { n := d.peekNode(); return n != nil && len(n.PodCIDRs) > 0 }
		if err := d.waitFor(ctx, d.env.podCIDRsWait, hasCIDRs); err != nil {
			return nil, err
		}
		if !hasCIDRs() {
			if d.peekNode() == nil {
				return nil, fmt.Errorf("timeout waiting for node %q to exist", d.nodeName)
			}
			return nil, fmt.Errorf("timeout waiting for PodCIDR allocation on node %q", d.nodeName)
		}
	}
	node := d.peekNode()
	switch {
	case node == nil:
		klog.FromContext(ctx).Error(nil, "Timed out waiting for node to exist", "node", d.nodeName)
	case len(rawNodeIPs(node)) == 0:
		klog.FromContext(ctx).Error(nil, "Timed out waiting for node to be assigned IPs", "node", d.nodeName)
	}
	return node, nil
}

// peekNode returns the tracker's current Node without consuming changes.
func (d *daemon) peekNode() *objects.Node { return d.inputs.Tracker.Node() }

// waitFor polls cond until it holds or timeout (0: none) passes; only a done
// ctx or a failed part is an error.
func (d *daemon) waitFor(ctx context.Context, timeout time.Duration, cond func() bool) error {
	var deadline <-chan time.Time
	if timeout > 0 {
		deadline = d.env.clock.After(timeout)
	}
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-d.errc:
			return err
		case <-deadline:
			return nil
		case <-d.env.clock.After(d.env.waitInterval):
		}
	}
	return nil
}

// dryRun prints what the dataplane would program for the first complete
// input, then returns. It touches neither the kernel nor the network
// (beyond the source).
func (d *daemon) dryRun(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { d.runSource(ctx) })
	if err := d.prepare(ctx); err != nil {
		return err
	}
	dr, ok := d.dp.(dataplane.DryRunner)
	if !ok {
		return fmt.Errorf("proxy mode %s %w", d.mode, errNoDryRun)
	}
	if err := d.waitFor(ctx, 0, d.inputs.Tracker.Synced); err != nil {
		return err
	}
	snap := d.takeSnapshot(ctx)
	d.handServiceCIDRs(ctx, snap)
	return dr.Render(d.env.stdout, snap)
}

// takeSnapshot builds a snapshot of everything the inputs hold, logs its
// problems and marks the changes taken (--dry-run and explain, which
// program nothing).
func (d *daemon) takeSnapshot(ctx context.Context) *model.Snapshot {
	b := d.take()
	snap, problems := buildSnapshot(b)
	d.problems.log(ctx, problems)
	d.inputs.Tracker.Done(b, false)
	return snap
}
