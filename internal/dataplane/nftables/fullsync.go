package nftables

import (
	"cmp"
	"maps"
	"slices"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/model"
)

// A full sync renders every port and diffs the render against what the
// kernel holds (read back when unsure) or against the last render.

// renderFull renders every port and diffs the whole desired state against
// the kernel mirror into t. With emit (staging), each stage of port chains
// the kernel lacks is handed to it as soon as it is rendered, and the
// final transaction (t.ops) last; it stops early when emit returns false.
func (st *famState) renderFull(cfg dataplane.Config, fs *model.FamilySnapshot, node model.NodeInfo, t *txn, emit func(func() opList) bool) {
	st.r = newRenderer(cfg, fs.Family, node)
	if st.slots == nil {
		st.slots = newSlotAlloc()
	}
	st.r.slots = st.slots
	prev := st.cur
	d := st.r.fixed()
	st.cur = d
	st.last = fs
	used := make(map[string]bool, len(fs.Ports))
	t.staging = emit != nil
	// Most ports have one or two chains (endpoints are map elements).
	if t.staging {
		t.fresh = make([]*chain, 0, 2*len(fs.Ports))
	}
	st.fixedOps(d, t)
	d.Ports = make(map[model.PortID]*portState, len(fs.Ports))
	order := make([]*portState, 0, len(fs.Ports))
	wantChains := make(map[string]bool, 2*len(fs.Ports))
	for _, sp := range fs.Ports {
		ps := st.r.port(sp)
		st.endpointMapOps(ps, t, true)
		d.Ports[sp.ID] = ps
		order = append(order, ps)
		for _, f := range ps.Fills {
			used[f.key] = true
		}
		st.portChains(ps, t, wantChains)
		if t.staging && t.pending >= stageOps && !emit(t.cutStage(d)) {
			return
		}
	}
	st.slots.retain(used)
	st.elemOps(prev, order, wantChains, t)
	t.rendered = order
	if !t.staging {
		return
	}
	if stage := t.cutStage(d); stage != nil && !emit(stage) {
		return
	}
	emit(t.ops)
}

// fullOps writes the whole of a rendered d into t, from an empty or known
// kernel mirror: the fixed objects, every port object the kernel lacks,
// then the element difference; unwanted port objects become stale.
func (st *famState) fullOps(d *desired, t *txn) {
	st.fixedOps(d, t)
	order := make([]*portState, 0, len(d.Ports))
	wantChains := map[string]bool{}
	for _, id := range sortedIDs(d.Ports) {
		order = append(order, d.Ports[id])
		st.endpointMapOps(d.Ports[id], t, true)
		st.portChains(d.Ports[id], t, wantChains)
	}
	st.elemOps(nil, order, wantChains, t)
}

// fixedOps writes the table, the fixed sets and chains (flushed and
// rewritten) and the configuration's elements.
func (st *famState) fixedOps(d *desired, t *txn) {
	table := &knftables.Table{Comment: knftables.PtrTo(tableComment)}
	if st.replace {
		t.head = append(t.head, op{verb: opAdd, obj: table}, op{verb: opDelete, obj: &knftables.Table{}})
	}
	t.head = append(t.head, op{verb: opAdd, obj: table})
	for _, s := range d.Sets {
		t.sets = append(t.sets, op{verb: opAdd, obj: s.object()})
	}
	for _, c := range d.Chains {
		t.addChain(c, true)
	}
	configElemOps(d.Elems, t)
}

// portChains writes the chains of one port the kernel lacks (or that must
// be rewritten) and notes them in wantChains.
func (st *famState) portChains(ps *portState, t *txn, wantChains map[string]bool) {
	for _, c := range ps.Chains {
		if !wantChains[c.Name] {
			wantChains[c.Name] = true
			st.ensureChain(c, t, st.distrust || st.suspects[c.Name])
		}
	}
}

// elemOps, once every port is rendered (order: the ports in order), marks
// unwanted port objects stale and writes the element difference of every
// shared set, from the kernel read or else from prev (the last render).
func (st *famState) elemOps(prev *desired, order []*portState, wantChains map[string]bool, t *txn) {
	st.markStale(st.kChains, wantChains)
	// Ports have no sets of their own any more: port sets in the kernel
	// are older versions' per-endpoint affinity sets, like fixed sets that
	// are no longer rendered.
	st.markStale(st.kSets, nil)
	prevWant := st.want
	// Sized up front: growing 40 maps to 200k entries costs a tenth of
	// the user-space time of a cold sync at 10k Services.
	sizes := map[string]int{}
	n := 0
	for _, ps := range order {
		for i := range ps.Elems {
			sizes[ps.Elems[i].Set]++
		}
		// A fresh or whole block is one op (fillOp).
		n += len(ps.Elems) + len(ps.Fills)
	}
	st.want = make(map[string]map[string]elemRef, len(sizes))
	bySet := make(map[string][]*element, len(sizes))
	for name, n := range sizes {
		st.want[name] = make(map[string]elemRef, n)
		bySet[name] = make([]*element, 0, n)
	}
	fills := map[string][]*fill{}
	prevHairpins := st.hairpins
	st.hairpins = make(map[hairpinKey]int32, len(prevHairpins))
	var hairpins []hairpinKey // each once, in port order
	for _, ps := range order {
		for k := range ps.hairpinKeys {
			if st.hairpins[k]++; st.hairpins[k] == 1 {
				hairpins = append(hairpins, k)
			}
		}
		st.addWant(ps.Elems)
		for i := range ps.Elems {
			e := &ps.Elems[i]
			bySet[e.Set] = append(bySet[e.Set], e)
		}
		for i := range ps.Fills {
			f := &ps.Fills[i]
			fills[f.b.shard] = append(fills[f.b.shard], f)
		}
	}
	// Sized once, not regrown; hairpin keys count once each (ports that
	// share a local endpoint share its key).
	t.adds = slices.Grow(t.adds, n+len(hairpins))
	var prevFills map[string]*fill
	if st.kElems == nil {
		prevFills = fillsByKey(prev)
	}
	for _, s := range sharedSets {
		switch {
		case isEndpointShard(s.Name):
			st.diffShard(s.Name, fills[s.Name], prevFills, t)
		case s.Name == setHairpin:
			st.diffHairpins(hairpins, prevHairpins, t)
		default:
			st.diffFull(s.Name, prevWant[s.Name], bySet[s.Name], t)
		}
	}
}

// diffHairpins emits the changes of the hairpin set, whose elements are
// now keys (each once, in port order): against the kernel's elements when
// they were read, else against prev, the last render's counts.
func (st *famState) diffHairpins(keys []hairpinKey, prev map[hairpinKey]int32, t *txn) {
	if st.kElems != nil {
		kernel := st.kElems[setHairpin] // taken apart as diffShard does
		for _, k := range keys {
			e := k.element()
			if _, ok := kernel[e.Key]; ok {
				delete(kernel, e.Key)
				continue
			}
			t.adds = append(t.adds, elemOp(opAdd, &e, false))
		}
		deleteLeft(setHairpin, kernel, t)
		return
	}
	for _, k := range keys {
		if prev[k] == 0 {
			e := k.element()
			t.adds = append(t.adds, elemOp(opAdd, &e, false))
		}
	}
	var gone []hairpinKey
	for k := range prev {
		if st.hairpins[k] == 0 {
			gone = append(gone, k)
		}
	}
	slices.SortFunc(gone, hairpinKey.compare)
	for _, k := range gone {
		e := k.element()
		t.dels = append(t.dels, elemOp(opDelete, &e, false))
	}
}

// deleteLeft deletes, in key order, the elements of set name a kernel
// read holds that no port wanted (those left after the wanted ones were
// taken out of it).
func deleteLeft(name string, kernel map[string]string, t *txn) {
	for _, k := range slices.Sorted(maps.Keys(kernel)) {
		t.dels = append(t.dels, elemOp(opDelete, &element{Set: name, Key: k}, false))
	}
}

// isEndpointShard reports whether a shared map is an endpoint-ranges map.
func isEndpointShard(name string) bool { return strings.HasPrefix(name, mapEndpoints+"-") }

// fillsByKey indexes the blocks of a render by allocator key.
func fillsByKey(d *desired) map[string]*fill {
	out := map[string]*fill{}
	if d == nil {
		return out
	}
	for _, ps := range d.Ports {
		for i := range ps.Fills {
			out[ps.Fills[i].key] = &ps.Fills[i]
		}
	}
	return out
}

// diffShard emits the element changes of one endpoint-ranges map, whose
// blocks are now fills (in port order): against the kernel's elements
// when they were read, else block by block against the last render's
// (prev, by key; those of shard no fill has any more are deleted).
func (st *famState) diffShard(name string, fills []*fill, prev map[string]*fill, t *txn) {
	if st.kElems != nil {
		// Each range found in the read is marked taken: what is left
		// is what no block wants. The read is dropped at commit (and
		// re-done after a failure), so nothing else needs it.
		kernel := st.kRanges[name]
		taken := make([]bool, len(kernel))
		for _, f := range fills {
			if len(kernel) == 0 { // a fresh map
				t.adds = append(t.adds, fillOp(opAdd, f))
				continue
			}
			for i, e := range f.elems {
				j, ok := slices.BinarySearchFunc(kernel, e.lo, func(r kernelRange, lo uint32) int { return cmp.Compare(r.lo, lo) })
				if ok && kernel[j].hi == e.hi && !taken[j] {
					taken[j] = true
					if kernel[j].addr == e.ep.IP && kernel[j].port == e.ep.Port {
						continue
					}
					t.dels = append(t.dels, elemOp(opDelete, &element{Set: name, Key: rangeKey(e.lo, e.hi)}, true))
				}
				t.adds = append(t.adds, rangeOp(opAdd, f, i))
			}
		}
		for j, r := range kernel {
			if !taken[j] {
				t.dels = append(t.dels, elemOp(opDelete, &element{Set: name, Key: rangeKey(r.lo, r.hi)}, true))
			}
		}
		return
	}
	seen := make(map[string]bool, len(fills))
	for _, f := range fills {
		seen[f.key] = true
		diffFill(prev[f.key], f, t)
	}
	var gone []*fill
	for key, f := range prev {
		if f.b.shard == name && !seen[key] {
			gone = append(gone, f)
		}
	}
	slices.SortFunc(gone, func(a, b *fill) int { return cmp.Compare(a.b.index, b.b.index) })
	for _, f := range gone {
		diffFill(f, nil, t)
	}
}

// diffFill emits what turns block old's elements into next's (either may
// be nil). Both list their elements in key order; in the same block an
// element whose range and endpoint are unchanged is left alone, any other
// is deleted and added. Deletions go before additions in the transaction,
// so a range deleted and added again ends up added.
func diffFill(old, next *fill, t *txn) {
	if old != nil && next != nil && old.b == next.b {
		i, j := 0, 0
		for i < len(old.elems) || j < len(next.elems) {
			switch {
			case j == len(next.elems) || (i < len(old.elems) && old.elems[i].lo < next.elems[j].lo):
				t.dels = append(t.dels, rangeOp(opDelete, old, i))
				i++
			case i == len(old.elems) || next.elems[j].lo < old.elems[i].lo:
				t.adds = append(t.adds, rangeOp(opAdd, next, j))
				j++
			default: // the same first key
				if !old.elems[i].sameTarget(next.elems[j]) {
					t.dels = append(t.dels, rangeOp(opDelete, old, i))
					t.adds = append(t.adds, rangeOp(opAdd, next, j))
				}
				i++
				j++
			}
		}
		return
	}
	if old != nil {
		t.dels = append(t.dels, fillOp(opDelete, old))
	}
	if next != nil {
		t.adds = append(t.adds, fillOp(opAdd, next))
	}
}

// configElemOps flushes the sets filled from the configuration and adds
// elems (their complete new content).
func configElemOps(elems []element, t *txn) {
	t.sets = append(t.sets,
		op{verb: opFlush, obj: &knftables.Set{Name: setNodePortIPs}},
		op{verb: opFlush, obj: &knftables.Set{Name: setServiceCIDRs}})
	for i := range elems {
		t.adds = append(t.adds, elemOp(opAdd, &elems[i], false))
	}
}

// refreshServiceCIDRs rewrites the service-cidrs set in an incremental sync
// when the ranges changed (SetServiceCIDRs); nothing else is touched.
func (st *famState) refreshServiceCIDRs(cfg dataplane.Config, t *txn) {
	cidrs := familyCIDRs(cfg.ServiceCIDRs, st.fam)
	if slices.Equal(cidrs, st.r.serviceCIDRs) {
		return
	}
	st.r.serviceCIDRs = cidrs
	st.cur.Elems = st.r.configElems()
	configElemOps(st.cur.Elems, t)
}

// ensureChain adds a port chain the kernel lacks (staged when t stages)
// or, with rewrite, rewrites it; a chain waiting for deletion is simply
// kept.
func (st *famState) ensureChain(c *chain, t *txn, rewrite bool) {
	delete(st.stale, c.Name)
	switch in := st.kChains[c.Name]; {
	case !in && t.staging:
		t.stageChain(c)
	case !in || rewrite:
		t.addChain(c, in)
	}
}

func (st *famState) addWant(elems []element) {
	for i := range elems {
		e := &elems[i]
		m := st.want[e.Set]
		if m == nil {
			m = map[string]elemRef{}
			st.want[e.Set] = m
		}
		r := m[e.Key]
		m[e.Key] = elemRef{e: e, n: r.n + 1}
	}
}

func (st *famState) dropWant(elems []element) {
	for _, e := range elems {
		m, k := st.want[e.Set], e.Key
		if r, ok := m[k]; ok {
			if r.n--; r.n <= 0 {
				delete(m, k)
			} else {
				m[k] = r
			}
		}
	}
}

// prior is a shared-set element's value in the kernel before this sync.
type prior struct {
	value   string
	present bool
}

// priorOf returns k's element in a kernel read (kernel non-nil) or else in
// the want of the last successful commit, which the kernel then holds.
func priorOf(kernel map[string]string, wanted map[string]elemRef, k string) prior {
	if kernel != nil {
		v, ok := kernel[k]
		return prior{v, ok}
	}
	if r, ok := wanted[k]; ok {
		return prior{r.e.Value, true}
	}
	return prior{}
}

// diffFull emits the element changes of one shared set from what the
// kernel holds (a fresh read, or else the previous want) to st.want, whose
// elements elems lists in port order (a key several ports want appears
// several times).
func (st *famState) diffFull(name string, prevWant map[string]elemRef, elems []*element, t *txn) {
	kernel := st.kElems[name]
	if st.kElems != nil && kernel == nil {
		kernel = map[string]string{} // read, and empty
	}
	want := st.want[name]
	// The wanted keys in port order, each once (where its element is the
	// one want keeps): deterministic without sorting 130k keys. Then
	// those only the kernel has, sorted.
	for _, e := range elems {
		if want[e.Key].e == e {
			st.diffElem(name, e.Key, priorOf(kernel, prevWant, e.Key), t)
		}
	}
	var gone []string
	if kernel != nil {
		gone = keysNotIn(kernel, want)
	} else {
		gone = keysNotIn(prevWant, want)
	}
	for _, k := range gone {
		st.diffElem(name, k, priorOf(kernel, prevWant, k), t)
	}
}

// keysNotIn returns the keys of m that want lacks, sorted.
func keysNotIn[V any](m map[string]V, want map[string]elemRef) []string {
	var out []string
	for k := range m {
		if _, ok := want[k]; !ok {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// diffElems emits the element changes of one shared set for the given
// keys, each with what the kernel held before.
func (st *famState) diffElems(name string, keys map[string]prior, t *txn) {
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		st.diffElem(name, k, keys[k], t)
	}
}

// diffElem emits what turns the kernel's element k (h) into the wanted one.
func (st *famState) diffElem(name, k string, h prior, t *txn) {
	w, wanted := st.want[name][k]
	isMap := isMapName(name)
	switch {
	case !wanted && h.present:
		t.dels = append(t.dels, elemOp(opDelete, &element{Set: name, Key: k}, isMap))
	case wanted && !h.present:
		t.adds = append(t.adds, elemOp(opAdd, w.e, isMap))
	case wanted && h.value != w.e.Value:
		t.dels = append(t.dels, elemOp(opDelete, &element{Set: name, Key: w.e.Key}, isMap))
		t.adds = append(t.adds, elemOp(opAdd, w.e, isMap))
	}
}

func sortedIDs(m map[model.PortID]*portState) []model.PortID {
	ids := slices.Collect(maps.Keys(m))
	slices.SortFunc(ids, func(a, b model.PortID) int {
		if a.Less(b) {
			return -1
		}
		if b.Less(a) {
			return 1
		}
		return 0
	})
	return ids
}
