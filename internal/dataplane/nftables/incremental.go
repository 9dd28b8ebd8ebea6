package nftables

import (
	"cmp"
	"maps"
	"slices"
	"strings"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/objects"
)

// An incremental sync renders only the ports whose Service changed and
// diffs each against its last render.

// prepareIncremental re-renders only the changed ports and diffs each
// against what it rendered before.
func (st *famState) prepareIncremental(fs *model.FamilySnapshot, req dataplane.SyncRequest, t *txn) {
	touched := map[string]map[string]prior{}
	hairpins := map[hairpinKey]bool{}
	for _, id := range st.changedPorts(fs, req) {
		old := st.cur.Ports[id]
		var next *portState
		if sp := fs.Port(id); sp != nil {
			next = st.r.port(sp)
			st.endpointMapOps(next, t, false)
			t.rendered = append(t.rendered, next)
			st.cur.Ports[id] = next
		} else {
			delete(st.cur.Ports, id)
		}
		st.diffPort(old, next, t, touched)
		st.countHairpins(old, next, hairpins)
		st.noteAffinityGone(old, next)
	}
	for name, keys := range touched {
		st.diffElems(name, keys, t)
	}
	st.diffHairpinCounts(hairpins, t)
	st.last = fs
}

// countHairpins moves the hairpin counts from one rendering of a port to
// the next (either may be nil), noting in before whether each key it
// touches was in the set before this sync.
func (st *famState) countHairpins(old, next *portState, before map[hairpinKey]bool) {
	if st.hairpins == nil {
		st.hairpins = map[hairpinKey]int32{}
	}
	for _, ps := range []*portState{old, next} {
		if ps == nil {
			continue
		}
		for k := range ps.hairpinKeys {
			if _, ok := before[k]; !ok {
				before[k] = st.hairpins[k] > 0
			}
		}
	}
	if old != nil {
		for k := range old.hairpinKeys {
			if st.hairpins[k]--; st.hairpins[k] <= 0 {
				delete(st.hairpins, k)
			}
		}
	}
	if next != nil {
		for k := range next.hairpinKeys {
			st.hairpins[k]++
		}
	}
}

// diffHairpinCounts emits the hairpin elements that appeared or went.
func (st *famState) diffHairpinCounts(before map[hairpinKey]bool, t *txn) {
	for _, k := range slices.SortedFunc(maps.Keys(before), hairpinKey.compare) {
		now := st.hairpins[k] > 0
		if now == before[k] {
			continue
		}
		e := k.element()
		if now {
			t.adds = append(t.adds, elemOp(opAdd, &e, false))
		} else {
			t.dels = append(t.dels, elemOp(opDelete, &e, false))
		}
	}
}

// changedPorts lists the ports to re-render. With req.Changed set, only the
// ports (present or gone) of the Services it names; without it, every port
// that is new, gone, or a different ServicePort value than last time.
func (st *famState) changedPorts(fs *model.FamilySnapshot, req dataplane.SyncRequest) []model.PortID {
	if req.Changed != nil {
		return st.portsOf(fs, req.Changed)
	}
	// Both port lists are sorted by ID: one merge walk.
	var ids []model.PortID
	before := st.last.Ports
	i := 0
	for _, sp := range fs.Ports {
		for ; i < len(before) && before[i].ID.Less(sp.ID); i++ {
			ids = append(ids, before[i].ID) // gone
		}
		if i < len(before) && before[i].ID == sp.ID {
			if before[i] != sp {
				ids = append(ids, sp.ID)
			}
			i++
			continue
		}
		ids = append(ids, sp.ID) // new
	}
	for ; i < len(before); i++ {
		ids = append(ids, before[i].ID)
	}
	return ids
}

// portsOf returns the ports of the named Services in fs (found by binary
// search, Ports being sorted) and those kproxy last programmed for them.
func (st *famState) portsOf(fs *model.FamilySnapshot, svcs map[objects.Key]struct{}) []model.PortID {
	var ids []model.PortID
	for key := range svcs {
		i, _ := slices.BinarySearchFunc(fs.Ports, key, func(sp *model.ServicePort, k objects.Key) int {
			return cmp.Or(strings.Compare(sp.ID.Namespace, k.Namespace), strings.Compare(sp.ID.Name, k.Name))
		})
		for ; i < len(fs.Ports) && fs.Ports[i].ID.Service() == key; i++ {
			ids = append(ids, fs.Ports[i].ID)
		}
		for _, sp := range st.last.ServicePorts(key) {
			if fs.Port(sp.ID) == nil {
				ids = append(ids, sp.ID)
			}
		}
	}
	return ids
}

// diffPort emits what changes from one rendering of a port to the next
// (either may be nil) and notes the shared-set keys it touches.
func (st *famState) diffPort(old, next *portState, t *txn, touched map[string]map[string]prior) {
	keep := map[string]bool{}
	if next != nil {
		for _, c := range next.Chains {
			keep[c.Name] = true
			st.ensureChain(c, t, false)
		}
	}
	for _, ps := range []*portState{old, next} {
		if ps == nil {
			continue
		}
		for _, e := range ps.Elems {
			if touched[e.Set] == nil {
				touched[e.Set] = map[string]prior{}
			}
			// The first touch records what the kernel holds: the
			// last commit's want (incremental syncs follow a
			// successful one), before this sync changes want.
			k := e.Key
			if _, seen := touched[e.Set][k]; !seen {
				touched[e.Set][k] = priorOf(nil, st.want[e.Set], k)
			}
		}
	}
	diffFills(old, next, t)
	if old == nil {
		st.addWant(next.Elems)
		return
	}
	for _, f := range old.Fills {
		if next == nil || !slices.ContainsFunc(next.Fills, func(n fill) bool { return n.key == f.key }) {
			st.slots.release(f.key)
		}
	}
	st.dropWant(old.Elems)
	if next != nil {
		st.addWant(next.Elems)
	}
	for _, c := range old.Chains {
		if !keep[c.Name] && st.kChains[c.Name] {
			st.stale[c.Name] = st.now
		}
	}
}

// diffFills emits what changes in the endpoint-ranges maps from one
// rendering of a port to the next (either may be nil), block by block.
func diffFills(old, next *portState, t *txn) {
	byKey := map[string]*fill{}
	if old != nil {
		for i := range old.Fills {
			byKey[old.Fills[i].key] = &old.Fills[i]
		}
	}
	if next != nil {
		for i := range next.Fills {
			f := &next.Fills[i]
			diffFill(byKey[f.key], f, t)
			delete(byKey, f.key)
		}
	}
	if old != nil {
		for i := range old.Fills { // in order, for a deterministic transaction
			if f := &old.Fills[i]; byKey[f.key] == f {
				diffFill(f, nil, t)
			}
		}
	}
}
