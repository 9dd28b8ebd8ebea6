package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"sync"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/objects"
)

// fakeDataplane records Sync calls and fails on demand.
type fakeDataplane struct {
	mu       sync.Mutex
	fail     int // fail this many next Syncs
	calls    chan syncCall
	cleanups int
}

type syncCall struct {
	snap *model.Snapshot
	req  dataplane.SyncRequest
	err  error
}

func newFakeDataplane() *fakeDataplane { return &fakeDataplane{calls: make(chan syncCall, 100)} }

func (f *fakeDataplane) Name() string { return "nftables" }

func (f *fakeDataplane) Sync(_ context.Context, snap *model.Snapshot, req dataplane.SyncRequest) error {
	f.mu.Lock()
	var err error
	if f.fail > 0 {
		f.fail--
		err = errors.New("injected sync failure")
	}
	f.mu.Unlock()
	req.Changed = maps.Clone(req.Changed)
	f.calls <- syncCall{snap: snap, req: req, err: err}
	return err
}

func (f *fakeDataplane) failNext(n int) {
	f.mu.Lock()
	f.fail = n
	f.mu.Unlock()
}

func (f *fakeDataplane) Drifted(context.Context) (bool, error) { return false, nil }

func (f *fakeDataplane) Cleanup(context.Context) error {
	f.mu.Lock()
	f.cleanups++
	f.mu.Unlock()
	return nil
}

// fakeTracker is an in-memory Tracker with the contract's semantics: changes
// stay pending until a Done(ok=true) for a batch that held them.
type fakeTracker struct {
	mu           sync.Mutex
	synced       bool
	nodeUnlisted bool // NodeSynced false until listNode
	syncedCalls  int
	in           model.Input
	pending      map[objects.Key]struct{}
	notify       func()
}

func newFakeTracker(node *objects.Node) *fakeTracker {
	return &fakeTracker{
		in:      model.Input{Node: node, Services: map[objects.Key]*objects.Service{}, Slices: map[objects.Key][]*objects.EndpointSlice{}},
		pending: map[objects.Key]struct{}{},
	}
}

func (t *fakeTracker) Take() *Batch {
	t.mu.Lock()
	defer t.mu.Unlock()
	in := t.in
	in.Services = maps.Clone(t.in.Services)
	in.Slices = maps.Clone(t.in.Slices)
	return &Batch{Input: in, Changed: maps.Clone(t.pending)}
}

func (t *fakeTracker) Done(b *Batch, ok bool) {
	if !ok {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for k := range b.Changed {
		delete(t.pending, k)
	}
}

func (t *fakeTracker) Synced() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.syncedCalls++
	return t.synced
}

func (t *fakeTracker) NodeSynced() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return !t.nodeUnlisted
}

// listNode ends an unlisted Node's wait with node (nil: none exists).
func (t *fakeTracker) listNode(node *objects.Node) {
	t.mu.Lock()
	t.nodeUnlisted, t.in.Node = false, node
	t.mu.Unlock()
	t.notify()
}

func (t *fakeTracker) Node() *objects.Node {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.in.Node
}

func (t *fakeTracker) pollsOfSynced() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.syncedCalls
}

func (t *fakeTracker) pendingKeys() map[objects.Key]struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	return maps.Clone(t.pending)
}

// setSynced marks the inputs complete and notifies, as a source would.
func (t *fakeTracker) setSynced() {
	t.mu.Lock()
	t.synced = true
	t.mu.Unlock()
	t.notify()
}

// putService adds or replaces a Service and notifies.
func (t *fakeTracker) putService(s *objects.Service) {
	t.mu.Lock()
	t.in.Services[s.Key()] = s
	t.pending[s.Key()] = struct{}{}
	t.mu.Unlock()
	t.notify()
}

// blockingSource runs until ctx is done.
type blockingSource struct{}

func (blockingSource) Run(ctx context.Context) error {
	<-ctx.Done()
	return nil
}

// fakeDryRunner is a fakeDataplane that can render.
type fakeDryRunner struct{ *fakeDataplane }

func (fakeDryRunner) Render(w io.Writer, snap *model.Snapshot) error {
	_, err := fmt.Fprintf(w, "rendered v4=%d v6=%d\n", len(snap.V4.Ports), len(snap.V6.Ports))
	return err
}
