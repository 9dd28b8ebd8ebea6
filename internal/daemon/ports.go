package daemon

import (
	"context"
	"time"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/conntrack"
	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/objects"
)

// This file holds the daemon's view of its collaborators: small interfaces it
// consumes, so that each part can be replaced by a fake in tests and adapted
// to the package that implements it.

// Batch is one Take from the change tracker: the current input (complete, or
// only the changed Services when Input.Partial) and what changed since the
// last successful sync.
type Batch struct {
	Input model.Input
	// Changed names Services added, updated or removed (or whose slices
	// changed) since the last successful sync.
	Changed     map[objects.Key]struct{}
	NodeChanged bool
	// ServiceCIDRsChanged is true when the ServiceCIDR objects changed
	// (Input.ServiceCIDRs holds them all).
	ServiceCIDRsChanged bool
	// TriggerTimes are the last-change-trigger-times of the changed
	// EndpointSlices, by their address family, for the network programming
	// latency.
	TriggerTimes map[model.Family][]time.Time

	// orig is the tracker's own batch, handed back on Done.
	orig any
}

// Tracker coalesces source events and keeps changes pending until a sync that
// includes them succeeds.
type Tracker interface {
	// Take returns the pending changes and the input: complete until a
	// Done(ok=true), afterwards (unless the Node changed) only the changed
	// Services (Input.Partial), which model.Update needs.
	Take() *Batch
	// Done returns b: ok=true drops its changes from the pending set, false
	// keeps them for the next Take.
	Done(b *Batch, ok bool)
	// Synced reports whether Services and EndpointSlices are fully listed.
	Synced() bool
	// NodeSynced reports whether this node's Node was listed (whether or
	// not it exists).
	NodeSynced() bool
	// Node returns this node's Node object as last seen, nil when unknown.
	// It consumes nothing.
	Node() *objects.Node
}

// ChangeObserver is told about every Service and EndpointSlice event and
// the pending counts (the kubeproxy_sync_proxy_rules_*_changes_* metrics).
// It must not block.
type ChangeObserver interface {
	ServiceChanged(pending int)
	EndpointsChanged(pending int)
	ChangesPending(services, endpoints int)
}

// Source feeds a Tracker until ctx is done.
type Source interface {
	Run(ctx context.Context) error
}

// Inputs is a source and the tracker it feeds.
type Inputs struct {
	Source  Source
	Tracker Tracker
	// NodeExpected is true when the source is a cluster, whose Node object is
	// waited for (the file source may have none).
	NodeExpected bool
	// ObserveChanges, when set, routes the tracker's change events to o
	// from now on (the metrics exist only once the servers are built).
	ObserveChanges func(o ChangeObserver)
	// Events records Events about Services; nil when the source has no
	// API server to write them to (the file source).
	Events EventSink
}

// EventSink records Events without blocking: a Warning on a Service (uid
// its metadata.uid) about its input, one on a Service about what this
// node's proxy could not do for it (reported by kube-proxy with an action,
// as upstream's), or one of type eventType on this node's Node.
type EventSink interface {
	ServiceWarning(key objects.Key, uid, reason, message string)
	ProxyServiceWarning(key objects.Key, reason, action, message string)
	NodeEvent(eventType, reason, action, message string)
}

// InputsFunc builds the inputs for o: the file source when o.SourceFile is
// set, else the API source. notify is called (from any goroutine) whenever
// the tracker has new pending changes or becomes synced.
type InputsFunc func(o *config.Options, nodeName string, notify func()) (Inputs, error)

// DataplaneFunc builds a backend without touching the kernel.
type DataplaneFunc func(cfg dataplane.Config) (dataplane.Dataplane, error)

// SyncReport is what one sync attempt did.
type SyncReport struct {
	Full bool
	// Reason is why the runner synced (initial, change, drift, …).
	Reason   string
	Families []model.Family
	Start    time.Time
	Duration time.Duration
	// Programmed is when the dataplane had the rules in the kernel, before
	// the conntrack cleanup (zero when the sync failed).
	Programmed time.Time
	// Err is nil for a successful sync.
	Err error
	// CleanupFailed are the families whose deletion of stale objects
	// failed (dataplane.CleanupReporter), whatever Err says.
	CleanupFailed []model.Family
	// Snapshot is the snapshot programmed (nil when the sync failed).
	Snapshot *model.Snapshot
	// Pending is how many Services had pending changes in this sync.
	Pending      int
	TriggerTimes map[model.Family][]time.Time
	Conntrack    []conntrack.Result
	// Rules are the backend's rule counts after a successful sync (iptables
	// mode; nil for the others).
	Rules []dataplane.RuleCount
	// KernelOps is how many kernel operations the sync wrote
	// (dataplane.OpCounter; in iptables mode the rules written); -1 when
	// the dataplane does not say.
	KernelOps int
	// Writer is how the dataplane writes rules, where it has a choice
	// (iptables mode: "netlink" or "iptables-restore").
	Writer string
}

// Observer is told what the sync loop does; the health and metrics servers
// implement it through adapters.
type Observer interface {
	// Started is called once when the sync loop starts (the health server
	// judges the families from then on, as upstream's does, not only after
	// the first sync).
	Started(fams []model.Family)
	// Queued is called when a change is waiting to be programmed.
	Queued(fams []model.Family)
	// Synced is called after every sync attempt.
	Synced(r SyncReport)
}

// Server is a long-running HTTP server (healthz, metrics). Run returns when
// ctx is done, or with an error when it cannot serve.
type Server interface {
	Run(ctx context.Context) error
}

// observers fans events out to several Observers.
type observers []Observer

func (os observers) Started(fams []model.Family) {
	for _, o := range os {
		o.Started(fams)
	}
}

func (os observers) Queued(fams []model.Family) {
	for _, o := range os {
		o.Queued(fams)
	}
}

func (os observers) Synced(r SyncReport) {
	for _, o := range os {
		o.Synced(r)
	}
}
