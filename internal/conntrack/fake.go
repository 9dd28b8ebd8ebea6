package conntrack

import (
	"net/netip"
	"slices"
	"sync"

	"github.com/kproxy/kproxy/internal/model"
)

// FakeTable is an in-memory Table for tests.
type FakeTable struct {
	mu    sync.Mutex
	flows map[model.Family][]Flow
	// Err, when set, is returned by DeleteFlows after deleting nothing.
	Err error
	// Walks counts DeleteFlows calls per family.
	Walks map[model.Family]int
	// Scopes lists the scope of every DeleteFlows call.
	Scopes []Scope
	// LocalAddrs are the node's addresses Local reports; nil: Local
	// cannot tell. Set it before the cleaner runs.
	LocalAddrs []netip.Addr
}

// Local implements Table. It takes no lock: the cleaner asks from inside
// DeleteFlows' walk, as the netlink table allows.
func (t *FakeTable) Local(model.Family) (func(netip.Addr) bool, error) {
	if t.LocalAddrs == nil {
		return nil, nil
	}
	addrs := slices.Clone(t.LocalAddrs)
	return func(a netip.Addr) bool { return a.IsLoopback() || slices.Contains(addrs, a) }, nil
}

// NewFakeTable returns an empty FakeTable.
func NewFakeTable() *FakeTable {
	return &FakeTable{flows: map[model.Family][]Flow{}, Walks: map[model.Family]int{}}
}

// Add puts flows into the table of family.
func (t *FakeTable) Add(family model.Family, flows ...Flow) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.flows[family] = append(t.flows[family], flows...)
}

// Flows returns the flows of family that are left.
func (t *FakeTable) Flows(family model.Family) []Flow {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]Flow(nil), t.flows[family]...)
}

// DeleteFlows implements Table.
// Like a kernel with dump filters, it shows stale only the flows within
// scope (an unanswered flow being a TCP SYN: Flow has no reply state).
func (t *FakeTable) DeleteFlows(family model.Family, scope Scope, stale func(Flow) bool) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.Walks[family]++
	t.Scopes = append(t.Scopes, scope)
	if t.Err != nil {
		return 0, t.Err
	}
	kept := t.flows[family][:0]
	for _, f := range t.flows[family] {
		in := (scope.Protocol == "" || f.Protocol == scope.Protocol) && (!scope.Unreplied || f.SynSent)
		if !in || !stale(f) {
			kept = append(kept, f)
		}
	}
	n := len(t.flows[family]) - len(kept)
	t.flows[family] = kept
	return n, nil
}
