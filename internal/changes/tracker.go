// Package changes is kproxy's change tracker. Sources report Services,
// EndpointSlices and this node's Node one event at a time; the Tracker keeps
// the current objects, drops events that change nothing, and coalesces the
// rest into a set of pending Services. The sync loop takes a Batch (a
// consistent view of the input plus what is pending), programs it, and tells
// the Tracker whether that worked: changes stay pending until a sync that
// included them succeeds.
package changes

import (
	"maps"
	"slices"
	"sync"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/objects"
	"github.com/kproxy/kproxy/internal/source"
)

// Observer is told about every event and pending count, for the
// kubeproxy_sync_proxy_rules_{service,endpoint}_changes_{total,pending}
// metrics (*metrics.Metrics implements it). It is called with the Tracker's
// lock held and must not call back into the Tracker.
type Observer interface {
	// ServiceChanged counts one Service event; pending is the number of
	// Services whose own object now differs from what was last synced.
	ServiceChanged(pending int)
	// EndpointsChanged counts one EndpointSlice event; pending is the number
	// of Services whose slices now differ from what was last synced.
	EndpointsChanged(pending int)
	// ChangesPending reports both pending counts after a successful sync.
	ChangesPending(services, endpoints int)
}

// Option configures a Tracker.
type Option func(*Tracker)

// WithObserver makes the Tracker report events to o.
func WithObserver(o Observer) Option { return func(t *Tracker) { t.obs = o } }

// WithClock sets the clock whose time at NewTracker bounds the trigger times
// kept: older ones describe changes made before kproxy started (default:
// the real clock).
func WithClock(c clock.PassiveClock) Option { return func(t *Tracker) { t.clock = c } }

// WithLogger sets the logger (default: klog's global logger).
func WithLogger(l klog.Logger) Option { return func(t *Tracker) { t.logger = l } }

// Batch is one Take: the whole current input and what is pending.
// Everything in it is read-only and stays valid while sources keep writing.
type Batch struct {
	// Input is a consistent view of the objects at the time of Take: all of
	// them, or, when Input.Partial, only the changed Services and their
	// slices (see TakeChanges).
	Input model.Input
	// Changed names the Services whose object or slices differ from the last
	// successful sync (added, updated or deleted).
	Changed map[objects.Key]struct{}
	// NodeChanged is true when this node's Node object differs from the last
	// successful sync (appeared, changed or disappeared).
	NodeChanged bool
	// ServiceCIDRsChanged is true when the ServiceCIDR objects differ from
	// the last successful sync (one added, changed or deleted).
	ServiceCIDRsChanged bool
	// TriggerTimes holds the endpoints.kubernetes.io/last-change-trigger-time
	// of the EndpointSlice changes pending for the changed Services (only
	// those later than the Tracker's start), for the network programming
	// duration metric, by the address family of their slice: upstream
	// observes each under its own family.
	TriggerTimes map[model.Family][]time.Time

	// gen is the Tracker's event generation at Take.
	gen uint64
}

// pendingService is a Service with changes not yet synced: its state at the
// last successful sync (the base) and what happened since.
type pendingService struct {
	baseSvc    *objects.Service
	baseSlices []*objects.EndpointSlice
	svcDiff    bool // the Service object differs from baseSvc
	slicesDiff bool // the slices differ from baseSlices
	gen        uint64
	triggers   []trigger
}

type trigger struct {
	at  time.Time
	gen uint64
	fam model.Family // the slice's address family
}

// Tracker is the change tracker; it implements source.Handler. All methods
// are safe for concurrent use.
type Tracker struct {
	nodeName string
	notify   func()
	obs      Observer
	clock    clock.PassiveClock
	logger   klog.Logger
	start    time.Time

	mu sync.Mutex
	// services and bySvc are copy-on-write: once a Batch holds one
	// (shared), the next write to it clones it. Slice lists in bySvc are
	// replaced, never changed in place.
	services       map[objects.Key]*objects.Service
	bySvc          map[objects.Key][]*objects.EndpointSlice
	sharedServices bool
	sharedSlices   bool
	slices         map[objects.Key]*objects.EndpointSlice // by slice key
	node           *objects.Node

	gen        uint64 // counts events that changed state
	pending    map[objects.Key]*pendingService
	svcPending int // pending entries with svcDiff
	epPending  int // pending entries with slicesDiff

	nodePending bool
	nodeBase    *objects.Node
	nodeGen     uint64

	// cidrs are the ServiceCIDRs sorted by name (servicecidrs.go).
	cidrs        []*objects.ServiceCIDR
	cidrsPending bool
	cidrsBase    []*objects.ServiceCIDR
	cidrsGen     uint64

	synced map[source.Kind]bool
	// programmed is true once a Done(ok=true) happened: the consumer holds
	// the state of every unchanged Service.
	programmed bool
}

var _ source.Handler = (*Tracker)(nil)

// NewTracker returns an empty Tracker for node nodeName. notify is called,
// without the Tracker's lock held, whenever something becomes pending or a
// kind becomes synced; it must not block (e.g. a non-blocking channel send).
func NewTracker(nodeName string, notify func(), opts ...Option) *Tracker {
	t := &Tracker{
		nodeName: nodeName,
		notify:   notify,
		clock:    clock.RealClock{},
		logger:   klog.Background(),
		services: map[objects.Key]*objects.Service{},
		bySvc:    map[objects.Key][]*objects.EndpointSlice{},
		slices:   map[objects.Key]*objects.EndpointSlice{},
		pending:  map[objects.Key]*pendingService{},
		synced:   map[source.Kind]bool{},
	}
	for _, o := range opts {
		o(t)
	}
	if t.notify == nil {
		t.notify = func() {}
	}
	if t.obs == nil {
		t.obs = nopObserver{}
	}
	t.start = t.clock.Now()
	return t
}

// TakeChanges is Take for a consumer that keeps the state of its last
// successful Done: once one happened and the Node is not pending, the Batch
// is Partial and its Input holds only the changed Services and their slices,
// copied, so a change costs the size of the change, not of the cluster.
// Before that, or when the Node changed (a new zone rebuilds everything), it
// is a full Take.
func (t *Tracker) TakeChanges() *Batch {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.programmed || t.nodePending {
		return t.take()
	}
	b := t.newBatch()
	b.Input.Partial = true
	b.Input.Services = make(map[objects.Key]*objects.Service, len(t.pending))
	b.Input.Slices = make(map[objects.Key][]*objects.EndpointSlice, len(t.pending))
	for k := range t.pending {
		if svc, ok := t.services[k]; ok {
			b.Input.Services[k] = svc
		}
		if list, ok := t.bySvc[k]; ok {
			b.Input.Slices[k] = list
		}
	}
	return b
}

// Take returns the current input and everything pending. It copies only the
// pending set: the object maps are shared with the Tracker until its next
// write. Every Take must be followed by one Done.
func (t *Tracker) Take() *Batch {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.take()
}

func (t *Tracker) take() *Batch {
	t.sharedServices, t.sharedSlices = true, true
	b := t.newBatch()
	b.Input.Services = t.services
	b.Input.Slices = t.bySvc
	return b
}

// newBatch returns a Batch with everything but the Services and slices.
func (t *Tracker) newBatch() *Batch {
	b := &Batch{
		Input: model.Input{
			NodeName:     t.nodeName,
			Node:         t.node,
			ServiceCIDRs: t.cidrs,
		},
		Changed:             make(map[objects.Key]struct{}, len(t.pending)),
		NodeChanged:         t.nodePending,
		ServiceCIDRsChanged: t.cidrsPending,
		TriggerTimes:        map[model.Family][]time.Time{},
		gen:                 t.gen,
	}
	for k, p := range t.pending {
		b.Changed[k] = struct{}{}
		for _, tr := range p.triggers {
			b.TriggerTimes[tr.fam] = append(b.TriggerTimes[tr.fam], tr.at)
		}
	}
	return b
}

// Done returns b. ok=true means b's input is now programmed: its changes are
// no longer pending, except where newer events changed a Service again (those
// stay pending, now measured against b's state). ok=false keeps everything
// pending, merged with newer events, for the next Take.
func (t *Tracker) Done(b *Batch, ok bool) {
	if !ok {
		return
	}
	t.mu.Lock()
	t.programmed = true
	for k := range b.Changed {
		p := t.pending[k]
		if p != nil && p.gen <= b.gen {
			t.dropPending(k, p)
			continue
		}
		t.rebase(k, p, b)
	}
	if b.NodeChanged || t.nodePending {
		t.rebaseNode(b)
	}
	t.rebaseServiceCIDRs(b)
	if len(t.pending) == 0 {
		// A map keeps its buckets when emptied: after a cold start's
		// every-Service pending set, 0.8 MB at 10k Services.
		t.pending = map[objects.Key]*pendingService{}
	}
	t.obs.ChangesPending(t.svcPending, t.epPending)
	again := len(t.pending) > 0 || t.nodePending || t.cidrsPending
	t.mu.Unlock()
	if again {
		t.notify()
	}
}

// rebase makes b's state of Service k the base of its pending entry (creating
// one if k changed back after b was taken) and keeps only newer triggers.
func (t *Tracker) rebase(k objects.Key, p *pendingService, b *Batch) {
	if p == nil {
		p = &pendingService{gen: t.gen}
		t.pending[k] = p
	}
	p.baseSvc = b.Input.Services[k]
	p.baseSlices = b.Input.Slices[k]
	p.triggers = slices.DeleteFunc(p.triggers, func(tr trigger) bool { return tr.gen <= b.gen })
	t.recheck(k, p)
}

func (t *Tracker) rebaseNode(b *Batch) {
	if t.nodePending && t.nodeGen <= b.gen {
		t.nodePending = false
		return
	}
	if !b.NodeChanged && !t.nodePending {
		return
	}
	// b programmed b.Input.Node; whatever came later is pending against it.
	t.nodeBase = b.Input.Node
	t.nodePending = !equalNode(t.nodeBase, t.node)
}

// Pending returns the number of pending changes: Services with changes not
// yet synced, plus one when the Node changed, plus one when the ServiceCIDRs
// changed.
func (t *Tracker) Pending() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := len(t.pending)
	if t.nodePending {
		n++
	}
	if t.cidrsPending {
		n++
	}
	return n
}

// Synced reports whether Services and EndpointSlices have both been listed
// completely (the Node is reported by NodeSynced). ServiceCIDRs do not count:
// as upstream, the proxy does not wait for them.
func (t *Tracker) Synced() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.synced[source.Services] && t.synced[source.EndpointSlices]
}

// NodeSynced reports whether the source has listed this node's Node object
// (whether or not it exists).
func (t *Tracker) NodeSynced() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.synced[source.Nodes]
}

// Node returns this node's current Node object, nil when unknown.
func (t *Tracker) Node() *objects.Node {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.node
}

// writableServices unshares the Service map before a write.
func (t *Tracker) writableServices() {
	if t.sharedServices {
		t.services = maps.Clone(t.services)
		t.sharedServices = false
	}
}

// writableSlices unshares the slice map before a write.
func (t *Tracker) writableSlices() {
	if t.sharedSlices {
		t.bySvc = maps.Clone(t.bySvc)
		t.sharedSlices = false
	}
}

type nopObserver struct{}

func (nopObserver) ServiceChanged(int)      {}
func (nopObserver) EndpointsChanged(int)    {}
func (nopObserver) ChangesPending(int, int) {}
