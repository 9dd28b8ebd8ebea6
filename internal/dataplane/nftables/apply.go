package nftables

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"runtime/debug"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"
	"sigs.k8s.io/knftables"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/objects"
)

// staleDelay is how long an unreferenced chain is kept before it is deleted:
// kernels before 6.2 release a chain's references from deleted map elements
// only some time after the transaction.
const staleDelay = time.Second

// elemRef is one desired element of a shared set or map and how many
// service ports want it.
type elemRef struct {
	e *element // in the portState that rendered it (immutable)
	n int
}

// famState is what the backend knows about one family's table: the desired
// state it last applied and what it believes the kernel holds.
type famState struct {
	fam  model.Family
	kern kernel
	// valid is false until the kernel was read (or after a failed apply);
	// the next sync is then full and re-reads the kernel.
	valid bool
	// distrust makes the next full sync rewrite every chain, not only the
	// missing ones (after drift: chains may have been flushed).
	distrust bool
	// suspects are port chains someone else changed: the next full sync
	// (which re-reads the kernel) rewrites them.
	suspects map[string]bool
	// replace makes the next full sync replace the whole table in its one
	// transaction (delete it, then write everything), set when the table
	// holds per-Service chains kproxy did not make (upstream kube-proxy's,
	// whose references kproxy's stale deletion does not know) or after a
	// full sync failed (a definition kproxy cannot take over in place).
	// The replacement is atomic, so traffic sees the old rules or the new
	// ones, never neither; it is never staged.
	replace bool
	// lastOps counts the changes the last sync sent (opList.changes).
	lastOps int

	r     *renderer
	slots *slotAlloc // endpoints-map blocks, kept across syncs
	cur   *desired
	seen  map[model.PortID]*model.ServicePort
	// bySvc indexes the ports in seen by Service.
	bySvc map[objects.Key][]model.PortID

	// want is the refcounted union of the ports' elements, per set.
	want map[string]map[string]elemRef
	// kChains, kSets mirror the kernel's port chains and port sets. kElems
	// holds the shared-set elements read from the kernel (key -> value),
	// only until the next successful commit: from then on the kernel holds
	// exactly want, so keeping a second copy of 100k+ elements is waste.
	kChains map[string]bool
	kSets   map[string]bool
	kElems  map[string]map[string]string
	// kMaps are the endpoint-ranges maps in the kernel.
	kMaps map[string]bool
	stale map[string]time.Time // port chains and sets to delete
	now   time.Time            // start of the current sync
}

// sharedSets are the sets and maps whose elements come from service ports.
var sharedSets = func() []*set {
	var out []*set
	for _, s := range (&renderer{addrType: "ipv4_addr", ipX: "ip"}).knownSets() {
		if !isConfigSet(s.Name) && !isDynamicSet(s.Name) {
			out = append(out, s)
		}
	}
	return out
}()

// sharedMaps names the shared sets that are maps.
var sharedMaps = func() map[string]bool {
	out := map[string]bool{}
	for _, s := range sharedSets {
		out[s.Name] = s.IsMap
	}
	return out
}()

// isMapName reports whether a shared set is a map.
func isMapName(name string) bool { return sharedMaps[name] }

func newFamState(fam model.Family, k kernel) *famState {
	return &famState{fam: fam, kern: k, stale: map[string]time.Time{}, kMaps: map[string]bool{}}
}

// txn accumulates the operations of one transaction in the order the kernel
// needs them: objects before the rules and elements that refer to them.
type txn struct {
	head, sets, chains, rules, dels, adds []op
	// maps are the endpoint-ranges maps sets adds (endpointMapOps).
	maps map[string]bool
	// staging (large full syncs only) sends the port chains the kernel
	// lacks ahead of the transaction, in stages of their own: fresh holds
	// them; those from cut on are not in a stage yet, and pending counts
	// their operations.
	staging bool
	fresh   []*chain
	cut     int
	pending int
	stages  int
	// setsCut is how much of sets the stages cut so far have added.
	setsCut int
	// rendered are the ports rendered for this sync: once it commits,
	// their chains' rules are dropped (see forgetRules).
	rendered []*portState
}

// Staging. A cold sync at 10k Services is one 23 MB batch that the kernel
// takes ~0.65 s to load while kproxy waits, and everything it is made of
// (ops, rule objects, the batch) is alive at once. But a chain the kernel
// lacks is unreachable until a map element or a rule of an existing chain
// points at it, and that happens only in the final transaction. So new
// port chains go first, in stages of ~stageOps operations, each its own
// transaction; the final transaction (fixed objects, rewritten chains,
// elements, deletions) stays one and atomic, so what traffic sees still
// changes at one instant. The stages are a pipeline: a stage is cut as
// soon as its ports are rendered (the rest are rendered meanwhile), then
// encoded in another goroutine while the kernel loads the stage before.
// Elements stay in the final transaction: a transaction that adds to an
// interval map costs the kernel time in proportion to what the map already
// holds, so filling the endpoint-ranges maps over many stages grows
// quadratically (at 10k Services: 35 ms for the first such stage, 395 ms
// for the 17th), and even stages of whole maps made the cold start slower
// (daemon cold starts at 10k, f8bfa28: 2.74 s median with elements in the
// final transaction, 3.09 s with map stages between the chain stages,
// 3.24 s with them after).
// Syncs of fewer than stageMinPorts ports send one transaction.
var (
	stageOps      = 8192
	stageMinPorts = 1000
)

// stageChain queues a chain the kernel lacks for the stages.
func (t *txn) stageChain(c *chain) {
	t.fresh = append(t.fresh, c)
	t.pending += 1 + len(c.Rules)
}

// cutStage returns the stage of the chains queued since the last cut (nil
// when there are none). The first stage also adds the table, its sets and
// its fixed chains, which staged rules refer to (adding what exists
// changes nothing); a later one the endpoint-ranges maps added since. A
// stage never splits a port (its chains jump to one another): call it
// between ports.
func (t *txn) cutStage(d *desired) func() opList {
	if t.cut == len(t.fresh) {
		return nil
	}
	part, n := t.fresh[t.cut:], t.pending
	t.cut, t.pending = len(t.fresh), 0
	var prelude []op
	if t.stages == 0 {
		prelude = t.prelude(d)
	} else {
		prelude = setAdds(nil, t.sets[t.setsCut:])
	}
	t.setsCut = len(t.sets)
	t.stages++
	return func() opList {
		ops := opList{prelude, chainOps(part, n)}
		forgetRules(part) // the ops hold them until they are encoded
		return ops
	}
}

// forgetRules drops the rules of port chains once written. A port
// chain's name is a digest of its content, so later syncs diff port chains
// by name alone and write only chains they render afresh: nobody reads the
// text of a written chain again, and staged chains' rules can be
// collected before the sync ends.
func forgetRules(chains []*chain) {
	for _, c := range chains {
		c.Rules = nil
	}
}

// prelude adds the table, every set and every fixed chain, empty (the
// final transaction flushes and fills them; an empty base chain accepts
// everything, like no chain), in the order of a single transaction, so
// that nft lists the table the same either way.
func (t *txn) prelude(d *desired) []op {
	out := setAdds(slices.Clone(t.head), t.sets)
	for _, c := range d.Chains {
		out = append(out, op{verb: opAdd, obj: c.object()})
	}
	return out
}

// setAdds appends the set and map additions among ops to out.
func setAdds(out, ops []op) []op {
	for _, o := range ops {
		switch o.obj.(type) {
		case *knftables.Set, *knftables.Map:
			if o.verb == opAdd {
				out = append(out, o)
			}
		}
	}
	return out
}

// chainOps adds chains, then their rules (n operations in all).
func chainOps(chains []*chain, n int) []op {
	out := make([]op, 0, n)
	for _, c := range chains {
		out = append(out, op{verb: opAdd, obj: c.object()})
	}
	for _, c := range chains {
		for _, r := range c.Rules {
			out = append(out, ruleAdd(c.Name, r))
		}
	}
	return out
}

// ops returns the transaction's operations in order, as parts (not
// copied into one slice: a full sync at 10k Services has 150k of them).
func (t *txn) ops() opList {
	return opList{t.head, t.sets, t.chains, t.rules, t.dels, t.adds}
}

func (t *txn) addChain(c *chain, flush bool) {
	t.chains = append(t.chains, op{verb: opAdd, obj: c.object()})
	if flush {
		t.chains = append(t.chains, op{verb: opFlush, obj: &knftables.Chain{Name: c.Name}})
	}
	for _, r := range c.Rules {
		t.rules = append(t.rules, ruleAdd(c.Name, r))
	}
}

// sync makes the kernel match fs. full re-renders everything; otherwise only
// ports whose ServicePort changed (by pointer) or whose Service is in changed.
func (st *famState) sync(ctx context.Context, cfg dataplane.Config, fs *model.FamilySnapshot, node model.NodeInfo, req dataplane.SyncRequest, now time.Time) error {
	logger := klog.FromContext(ctx)
	st.now = now
	st.deleteStale(ctx)
	full := req.Full || req.NodeChanged || !st.valid || st.cur == nil
	var t txn
	var err error
	if full {
		err = st.readIfUnsure(ctx)
	}
	switch {
	case err != nil:
	case full && len(fs.Ports) >= stageMinPorts && !st.replace:
		logger.V(4).Info("Applying a full sync in stages", "family", st.fam, "ports", len(fs.Ports))
		err = st.syncStaged(ctx, cfg, fs, node, &t)
	default:
		if full {
			st.renderFull(cfg, fs, node, &t, nil)
		} else {
			st.prepareIncremental(fs, req, &t)
			st.refreshServiceCIDRs(cfg, &t)
		}
		st.lastOps = t.ops().changes()
		logger.V(4).Info("Applying nftables changes", "family", st.fam, "full", full, "operations", t.ops().len(), "changes", st.lastOps, "replace", st.replace)
		err = st.kern.Apply(ctx, t.ops())
	}
	if st.r != nil && len(st.r.full) > 0 {
		logger.Info("No room left in an endpoint-ranges map; these Service ports pick endpoints with plain rules (their endpoint changes are rule changes)",
			"family", st.fam, "ports", st.r.full[:min(10, len(st.r.full))], "count", len(st.r.full))
		st.r.full = nil
	}
	if err != nil {
		st.valid = false
		if full && !st.replace {
			logger.Info("A full sync failed; the next one replaces the table", "family", st.fam)
			st.replace = true
		}
		return fmt.Errorf("syncing %s nftables table: %w", st.fam, err)
	}
	st.commit(&t)
	return nil
}

// syncStaged is a full sync whose new port chains go to the kernel in
// stages while the rest is still being rendered: rendering and diffing run
// in a goroutine of their own, the kernel reads (which must happen in the
// calling goroutine's network namespace) before it starts.
func (st *famState) syncStaged(ctx context.Context, cfg dataplane.Config, fs *model.FamilySnapshot, node model.NodeInfo, t *txn) error {
	// Room for every stage at 10k Services: rendering never waits for
	// the kernel.
	stages := make(chan func() opList, 64)
	stop, done := make(chan struct{}), make(chan struct{})
	var renderErr error
	var ops atomic.Int64 // stages are made in ApplyStages' encoding goroutine
	defer func() { st.lastOps = int(ops.Load()) }()
	go func() {
		defer close(done)
		defer close(stages)
		renderErr = catch("rendering the full sync", func() {
			st.renderFull(cfg, fs, node, t, func(stage func() opList) bool {
				counted := func() opList {
					l := stage()
					ops.Add(int64(l.changes()))
					return l
				}
				select {
				case stages <- counted:
					return true
				case <-stop:
					return false
				}
			})
		})
	}()
	err := st.kern.ApplyStages(ctx, stages)
	close(stop)
	<-done
	// A rendering that panicked closed the stages early: what was
	// applied is only some unreachable chains, and the sync failed.
	return cmp.Or(renderErr, err)
}

// catch runs f and turns a panic into an error carrying its stack: in a
// goroutine of a sync, a bug must fail that sync (which the runner
// retries, as it does when the sync itself panics), not end the process.
func catch(what string, f func()) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%s panicked: %v\n%s", what, p, debug.Stack())
		}
	}()
	f()
	return nil
}

// readIfUnsure re-reads the kernel unless the mirror is known good. When
// the table is to be replaced, the mirror is left empty: the replacing
// transaction writes everything.
func (st *famState) readIfUnsure(ctx context.Context) error {
	if st.valid && !st.distrust {
		return nil
	}
	if err := st.readKernel(ctx); err != nil {
		return err
	}
	if st.replace {
		st.forgetKernel()
	}
	return nil
}

// forgetKernel empties the kernel mirror.
func (st *famState) forgetKernel() {
	st.kChains, st.kSets, st.kElems, st.kMaps = map[string]bool{}, map[string]bool{}, map[string]map[string]string{}, map[string]bool{}
	st.stale = map[string]time.Time{}
	st.slots = newSlotAlloc()
}

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
	d := st.r.fixed()
	st.cur = d
	st.seen = make(map[model.PortID]*model.ServicePort, len(fs.Ports))
	st.bySvc = make(map[objects.Key][]model.PortID, len(fs.Ports))
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
		st.seen[sp.ID] = sp
		st.bySvc[sp.ID.Service()] = append(st.bySvc[sp.ID.Service()], sp.ID)
		for _, key := range ps.Blocks {
			used[key] = true
		}
		st.portChains(ps, t, wantChains)
		if t.staging && t.pending >= stageOps && !emit(t.cutStage(d)) {
			return
		}
	}
	st.slots.retain(used)
	st.elemOps(order, wantChains, t)
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
	st.elemOps(order, wantChains, t)
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
// shared set.
func (st *famState) elemOps(order []*portState, wantChains map[string]bool, t *txn) {
	st.markStale(st.kChains, wantChains)
	// Ports have no sets of their own any more: port sets in the kernel
	// are older versions' per-endpoint affinity sets, like fixed sets that
	// are no longer rendered.
	st.markStale(st.kSets, nil)
	prevWant := st.want
	// Sized up front: growing 40 maps to 200k entries costs a tenth of
	// the user-space time of a cold sync at 10k Services.
	sizes := map[string]int{}
	for _, ps := range order {
		for i := range ps.Elems {
			sizes[ps.Elems[i].Set]++
		}
	}
	st.want = make(map[string]map[string]elemRef, len(sizes))
	bySet := make(map[string][]*element, len(sizes))
	for name, n := range sizes {
		st.want[name] = make(map[string]elemRef, n)
		bySet[name] = make([]*element, 0, n)
	}
	for _, ps := range order {
		st.addWant(ps.Elems)
		for i := range ps.Elems {
			e := &ps.Elems[i]
			bySet[e.Set] = append(bySet[e.Set], e)
		}
	}
	n := 0
	for _, m := range st.want {
		n += len(m)
	}
	t.adds = slices.Grow(t.adds, n) // 130k at 10k Services: avoid regrowing
	for _, s := range sharedSets {
		st.diffFull(s.Name, prevWant[s.Name], bySet[s.Name], t)
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

// suspect records drift reported by the monitor: names of objects someone
// else changed ("" for the table). The next sync is full and re-reads the
// kernel (names and shared elements); changed port chains are rewritten
// (fixed chains always are), and a changed table rewrites every chain.
func (st *famState) suspect(names map[string]bool) {
	st.valid = false
	if st.suspects == nil {
		st.suspects = map[string]bool{}
	}
	for n := range names {
		st.suspects[n] = true
		st.distrust = st.distrust || n == ""
	}
}

// sortedNames returns at most n of names, sorted, for logs.
func sortedNames(names map[string]bool, n int) []string {
	out := slices.Sorted(maps.Keys(names))
	return out[:min(n, len(out))]
}

func (st *famState) markStale(have, want map[string]bool) {
	for name := range have {
		if !want[name] {
			if _, ok := st.stale[name]; !ok {
				st.stale[name] = st.now
			}
		}
	}
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

// commit records a successful transaction in the kernel mirror.
func (st *famState) commit(t *txn) {
	st.valid, st.distrust, st.suspects, st.replace = true, false, nil, false
	for _, o := range t.chains {
		if c, ok := o.obj.(*knftables.Chain); ok && isPortObject(c.Name) {
			st.kChains[c.Name] = true
		}
	}
	for _, c := range t.fresh {
		st.kChains[c.Name] = true
	}
	for name := range t.maps {
		st.kMaps[name] = true
	}
	for _, ps := range t.rendered {
		forgetRules(ps.Chains)
	}
	// The kernel now holds exactly want in every shared set.
	st.kElems = nil
}

// prepareIncremental re-renders only the changed ports and diffs each
// against what it rendered before.
func (st *famState) prepareIncremental(fs *model.FamilySnapshot, req dataplane.SyncRequest, t *txn) {
	touched := map[string]map[string]prior{}
	for _, id := range st.changedPorts(fs, req) {
		old := st.cur.Ports[id]
		var next *portState
		svc := id.Service()
		if sp := fs.Port(id); sp != nil {
			next = st.r.port(sp)
			st.endpointMapOps(next, t, false)
			t.rendered = append(t.rendered, next)
			if st.seen[id] == nil {
				st.bySvc[svc] = append(st.bySvc[svc], id)
			}
			st.seen[id], st.cur.Ports[id] = sp, next
		} else {
			delete(st.seen, id)
			delete(st.cur.Ports, id)
			st.bySvc[svc] = slices.DeleteFunc(st.bySvc[svc], func(o model.PortID) bool { return o == id })
			if len(st.bySvc[svc]) == 0 {
				delete(st.bySvc, svc)
			}
		}
		st.diffPort(old, next, t, touched)
	}
	for name, keys := range touched {
		st.diffElems(name, keys, t)
	}
}

// changedPorts lists the ports to re-render. With req.Changed set, only the
// ports (present or gone) of the Services it names; without it, every port
// that is new, gone, or a different ServicePort value than last time.
func (st *famState) changedPorts(fs *model.FamilySnapshot, req dataplane.SyncRequest) []model.PortID {
	if req.Changed != nil {
		return st.portsOf(fs, req.Changed)
	}
	var ids []model.PortID
	common := 0
	for _, sp := range fs.Ports {
		old, ok := st.seen[sp.ID]
		if ok {
			common++
		}
		if !ok || old != sp {
			ids = append(ids, sp.ID)
		}
	}
	if common < len(st.seen) {
		for id := range st.seen {
			if fs.Port(id) == nil {
				ids = append(ids, id)
			}
		}
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
		for _, id := range st.bySvc[key] {
			if fs.Port(id) == nil {
				ids = append(ids, id)
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
	if old == nil {
		st.addWant(next.Elems)
		return
	}
	for _, key := range old.Blocks {
		if next == nil || !slices.Contains(next.Blocks, key) {
			st.slots.release(key)
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

// readKernel rebuilds the kernel mirror from the table as it is: port chain
// and set names (their content is in their names) and the elements of the
// shared sets and maps. An absent table reads as empty.
func (st *famState) readKernel(ctx context.Context) error {
	st.forgetKernel()
	defer st.slots.compact()
	present := map[string]bool{}
	known := newRenderer(dataplane.Config{}, st.fam, model.NodeInfo{}).knownSets()
	isKnown := map[string]bool{}
	for _, s := range known {
		isKnown[s.Name] = true
	}
	for _, typ := range []string{"chain", "set", "map"} {
		names, err := st.kern.List(ctx, typ)
		if err != nil {
			return fmt.Errorf("listing %ss: %w", typ, err)
		}
		for _, n := range names {
			switch {
			case typ != "chain" && !isPortObject(n) && !isKnown[n]:
				// An older version's fixed set or map (its
				// endpoints or no-endpoint maps): deleted once the
				// chains that refer to it are gone.
				st.kSets[n] = true
			case !isPortObject(n):
				present[n] = true
				if typ == "map" && strings.HasPrefix(n, mapEndpoints+"-") {
					st.kMaps[n] = true
					st.slots.maybeIdle(n)
				}
			case typ == "chain":
				if isForeignChain(n) && !st.replace {
					klog.FromContext(ctx).Info("The nftables table holds another proxy's Service chains; the next sync replaces it in one transaction",
						"family", st.fam, "chain", n)
					st.replace = true
				}
				st.kChains[n] = true
				if key, proto, index, ok := parseBlockName(n); ok {
					st.slots.reserve(key, proto, index)
				}
			default:
				st.kSets[n] = true
			}
		}
	}
	for _, s := range known {
		if present[s.Name] && !isConfigSet(s.Name) && !isDynamicSet(s.Name) {
			if err := st.readElems(ctx, s); err != nil {
				return err
			}
		}
	}
	return nil
}

func (st *famState) readElems(ctx context.Context, s *set) error {
	elems, err := st.kern.ListElements(ctx, s)
	if err != nil {
		return fmt.Errorf("listing elements of %s: %w", s.Name, err)
	}
	st.kElems[s.Name] = elems
	return nil
}

// deleteStale deletes, in a transaction of its own, port chains and sets
// that have been unreferenced for staleDelay. A failure only makes the next
// sync full (which re-reads the kernel and finds leftovers again).
func (st *famState) deleteStale(ctx context.Context) {
	var chains, sets []op
	for name, since := range st.stale {
		if st.now.Sub(since) < staleDelay {
			continue
		}
		delete(st.stale, name)
		if st.kChains[name] {
			delete(st.kChains, name)
			chains = append(chains, op{verb: opDelete, obj: &knftables.Chain{Name: name}})
		} else if st.kSets[name] {
			delete(st.kSets, name)
			sets = append(sets, op{verb: opDelete, obj: &knftables.Set{Name: name}})
		}
	}
	sets = append(sets, st.unusedMaps()...)
	// Chains that refer to others (ext-, fw-) go before the ones they
	// refer to (svc-, loc-); sets after every chain.
	slices.SortFunc(chains, func(a, b op) int {
		return chainRank(a.obj.(*knftables.Chain).Name) - chainRank(b.obj.(*knftables.Chain).Name)
	})
	if err := st.kern.Apply(ctx, opList{chains, sets}); err != nil {
		klog.FromContext(ctx).Error(err, "Deleting stale nftables objects failed; the next sync re-reads the table", "family", st.fam)
		st.valid = false
	}
}

func chainRank(name string) int {
	if strings.HasPrefix(name, "ext-") || strings.HasPrefix(name, "fw-") {
		return 0
	}
	return 1
}
