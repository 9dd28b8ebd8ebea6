package daemon

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/conntrack"
	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/runner"
)

// sync is the runner's sync func: take the pending changes, update the
// model, program the kernel, and only when that succeeded drop the changes,
// clean conntrack and report.
func (d *daemon) sync(ctx context.Context, req runner.Request) error {
	logger := klog.FromContext(ctx)
	start := d.env.clock.Now()
	b := d.take()
	snap, problems := model.Update(d.prev, b.Input, b.Changed)
	d.problems.log(ctx, problems)
	if b.NodeChanged && d.prev != nil {
		logNodeChange(logger, d.prev.Node, snap.Node, dataplane.LocalMode(d.o.Config.DetectLocalMode) == dataplane.LocalNodeCIDR)
	}
	d.handServiceCIDRs(ctx, snap)
	if d.prev == nil && d.endColdLimit == nil {
		d.endColdLimit = startColdLimit(ctx)
	}
	modelDone := d.env.clock.Now()
	// IPVS mode's periodic syncs are whole to repair the kernel, as
	// upstream's; conntrack has nothing new to clean then, so they clean
	// only what changed, as upstream's IPVS mode does.
	ctFull := req.Full && (d.mode != ModeIPVS || req.Reason != runner.ReasonPeriodic)
	var synsCleaned []conntrack.Result
	if d.mode == ModeIPVS {
		// IPVS forwards a SYN that matches an un-DNATed entry from before
		// the sync, bypassing the nat table (and so its masquerade): such
		// entries go before the commit as well as after it.
		synsCleaned = d.cleaner.CleanSYNs(ctx, d.prev, snap, ctFull)
	}

	err := d.dp.Sync(ctx, snap, dataplane.SyncRequest{Full: req.Full, Changed: b.Changed, NodeChanged: b.NodeChanged})
	dpDone := d.env.clock.Now()
	d.inputs.Tracker.Done(b, err == nil)
	report := SyncReport{
		Full: req.Full, Reason: string(req.Reason), Families: d.fams, Start: start, Err: err,
		Pending: len(b.Changed), TriggerTimes: b.TriggerTimes,
	}
	if fr, ok := d.dp.(dataplane.FullReporter); ok {
		report.Full = fr.LastSyncFull()
	}
	if cr, ok := d.dp.(dataplane.CleanupReporter); ok {
		report.CleanupFailed = cr.LastSyncCleanupFailed()
	}
	if err != nil {
		report.Duration = d.env.clock.Since(start)
		d.obs.Synced(report)
		return fmt.Errorf("%s sync (%s): %w", d.mode, req.Reason, err)
	}
	first := d.prev == nil
	report.Programmed = dpDone
	report.KernelOps = -1
	if rc, ok := d.dp.(dataplane.RuleCounter); ok {
		report.Rules = rc.RuleCounts()
		report.KernelOps = 0
		for _, c := range report.Rules {
			report.KernelOps += c.LastSync
		}
	}
	if oc, ok := d.dp.(dataplane.OpCounter); ok {
		report.KernelOps = oc.LastSyncOps()
	}
	if w, ok := d.dp.(interface{ Writer() string }); ok {
		report.Writer = w.Writer()
	}
	report.Conntrack = conntrack.Merge(synsCleaned, d.cleaner.Clean(ctx, d.prev, snap, ctFull))
	ctDone := d.env.clock.Now()
	d.prev = snap
	report.Snapshot = snap
	report.Duration = d.env.clock.Since(start)
	d.obs.Synced(report)
	if d.endColdLimit != nil {
		d.endColdLimit()
		d.endColdLimit = nil
	}
	adaptMemoryLimit(first)
	logger.V(2).Info("Sync complete", "reason", req.Reason, "full", req.Full, "changed", len(b.Changed), "serviceCIDRsChanged", b.ServiceCIDRsChanged,
		"elapsed", report.Duration, "model", modelDone.Sub(start), "dataplane", dpDone.Sub(modelDone), "conntrack", ctDone.Sub(dpDone), "report", d.env.clock.Since(ctDone))
	if first {
		// This mode's rules are in place: the other modes' rules can go
		// now without leaving a window.
		d.removeLeftovers(ctx)
	}
	return nil
}

// take takes the tracker's batch with the model options the daemon sets
// (the mode's balancing, AllowServiceExternalIPs=false); every Take the
// daemon makes goes through it. Each must be followed by Tracker.Done.
func (d *daemon) take() *Batch {
	b := d.inputs.Tracker.Take()
	b.Input.Balancing = d.balancing
	b.Input.IgnoreExternalIPs = d.noExtIPs
	return b
}

// buildSnapshot builds a complete snapshot of a batch (dry run).
func buildSnapshot(b *Batch) (*model.Snapshot, []model.Problem) {
	return model.Build(b.Input)
}

// maxLoggedProblems bounds the memory of problemLog.
const maxLoggedProblems = 10000

// problemEvent is the Event reason of a Service problem that names none.
const problemEvent = "InvalidServiceField"

// problemLog logs each distinct model problem once, not on every sync,
// and records a Service's as a Warning Event on it (when events is set).
type problemLog struct {
	seen   map[string]struct{}
	events EventSink
}

func (p *problemLog) log(ctx context.Context, problems []model.Problem) {
	if p.seen == nil || len(p.seen) > maxLoggedProblems {
		p.seen = map[string]struct{}{}
	}
	logger := klog.FromContext(ctx)
	for _, pr := range problems {
		key := pr.String()
		if _, ok := p.seen[key]; ok {
			continue
		}
		p.seen[key] = struct{}{}
		logger.Info("Skipping invalid input", "kind", pr.Kind, "object", pr.Object.String(), "field", pr.Field, "reason", pr.Reason)
		if pr.Kind == "Service" && p.events != nil {
			p.events.ServiceWarning(pr.Object, pr.UID, cmp.Or(pr.Event, problemEvent), pr.Field+": "+pr.Reason)
		}
	}
}

// logNodeChange says what a change of this node's Node object means for
// proxying. Upstream exits on a podCIDR change in NodeCIDR mode (to be
// restarted) and only logs other changes; kproxy follows them live. A
// deleted Node stays in use as last seen (the tracker keeps it), so a Node
// is unknown only until it is first seen.
func logNodeChange(logger klog.Logger, prev, cur model.NodeInfo, nodeCIDR bool) {
	switch {
	case !cur.Known:
		return
	case !prev.Known:
		logger.Info("This node's Node object appeared", "node", cur.Name, "podCIDRs", cur.PodCIDRs, "internalIPs", cur.InternalIPs)
		return
	}
	if !slices.Equal(prev.PodCIDRs, cur.PodCIDRs) {
		msg := "This node's podCIDRs changed"
		switch {
		case nodeCIDR && len(cur.PodCIDRs) == 0:
			msg += "; detect-local-mode NodeCIDR now counts no traffic as from local pods"
		case nodeCIDR:
			msg += "; detect-local-mode NodeCIDR follows them"
		}
		logger.Info(msg, "node", cur.Name, "old", prev.PodCIDRs, "new", cur.PodCIDRs)
	}
	if !slices.Equal(prev.InternalIPs, cur.InternalIPs) || !slices.Equal(prev.ExternalIPs, cur.ExternalIPs) {
		logger.Info("This node's addresses changed; kproxy keeps the node IPs it started with, as upstream does",
			"node", cur.Name, "oldInternalIPs", prev.InternalIPs, "newInternalIPs", cur.InternalIPs)
	}
}
