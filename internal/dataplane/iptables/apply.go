package iptables

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/nfnl"
	"github.com/kproxy/kproxy/internal/objects"
)

// famState is what kproxy last wrote for one family.
type famState struct {
	fam model.Family
	// valid is false until a full sync succeeds, and again after a failed
	// sync or a detected drift: the next sync is then full.
	valid bool
	large bool
	// full is whether the family's last sync was full (asked for, or a
	// partial one that had to rewrite everything).
	full  bool
	ports map[model.PortID]*portRules
	// shared holds the rules of the non-per-port chains last written,
	// keyed by "table/chain".
	shared map[string][]rule
	// written counts the rules the last sync wrote, by table; restores of
	// one sync run in parallel (restoreAll), hence the lock.
	writtenMu sync.Mutex
	written   map[string]int
}

// ruleCounts returns, by table, the rules kproxy owns in this family (as
// last written) and the rules the last sync wrote.
func (st *famState) ruleCounts() (total, written map[string]int) {
	total = map[string]int{tableNAT: 0, tableFilter: 0}
	for k, rules := range st.shared {
		table, _, _ := strings.Cut(k, "/")
		total[table] += len(rules)
	}
	for _, pr := range st.ports {
		if pr == nil {
			continue
		}
		n := pr.rules
		if pr.nat != nil {
			n = 0
			for _, c := range pr.nat {
				n += len(c.Rules)
			}
		}
		total[tableNAT] += n
	}
	written = map[string]int{tableNAT: 0, tableFilter: 0}
	st.writtenMu.Lock()
	for t, n := range st.written {
		written[t] = n
	}
	st.writtenMu.Unlock()
	return total, written
}

func key(table, chain string) string { return table + "/" + chain }

// restore applies the sections, in order, for the family: on the
// nf_tables backend as one netlink transaction when they translate (see
// netlink.go), otherwise (and when that fails) with one
// iptables-restore --noflush.
func (p *Proxier) restore(ctx context.Context, fam model.Family, ws ...*tableWrite) error {
	if !slices.ContainsFunc(ws, func(w *tableWrite) bool { return !w.empty() }) {
		return nil
	}
	if st := p.fams[fam]; st != nil {
		st.writtenMu.Lock()
		for _, w := range ws {
			if w.empty() {
				continue
			}
			st.written[w.table] += w.ruleCount()
		}
		st.writtenMu.Unlock()
	}
	if run, ok := p.netlinkRunner(); ok {
		err := p.netlinkRestore(ctx, run, fam, ws)
		if err == nil {
			p.writes.netlink.Add(1)
			return nil
		}
		logger := klog.FromContext(ctx)
		switch {
		case errors.Is(err, errJumpsAfterCommit):
			return err // the rules are in; writing them again would not help
		case errors.Is(err, errNotNetlink):
			logger.V(4).Info("Writing with iptables-restore", "family", fam, "reason", err)
		case errors.Is(err, unix.ENOENT):
			logger.V(2).Info("A table or chain is missing; iptables-restore creates it", "family", fam, "err", err)
		default:
			logger.Error(err, "The netlink write failed; writing with iptables-restore instead", "family", fam)
		}
	}
	p.writes.restore.Add(1)
	text := restoreText(ws...)
	start := time.Now()
	_, err := p.exec.Run(ctx, []byte(text), p.backend.cmd(fam, "-restore"), "--noflush", "--wait")
	klog.FromContext(ctx).V(2).Info("iptables-restore", "family", fam, "bytes", len(text), "elapsed", time.Since(start), "err", err)
	return err
}

// netlinkRunner tells whether writes go over netlink (chooseWriter), and
// how to reach the namespace the iptables programs work in.
func (p *Proxier) netlinkRunner() (nsRunner, bool) {
	if p.writer != WriterNetlink {
		return nil, false
	}
	return p.nsReader()
}

// nsReader tells whether chain names can be read over netlink (the
// nf_tables backend, whatever writes the rules), and how to reach the
// namespace.
func (p *Proxier) nsReader() (nsRunner, bool) {
	if p.backend != BackendNFT {
		return nil, false
	}
	run, ok := p.exec.(nsRunner)
	return run, ok
}

// netlinkRestore writes the sections as one nf_tables transaction. Jumps
// from built-in chains go last through iptables-restore, which creates a
// missing built-in chain the way iptables-nft expects it (they are only
// missing on a node's first sync, or after someone removed them).
func (p *Proxier) netlinkRestore(ctx context.Context, run nsRunner, fam model.Family, ws []*tableWrite) error {
	start := time.Now()
	var inserts []*tableWrite
	body := make([]*tableWrite, 0, len(ws))
	for _, w := range ws {
		if w == nil {
			continue
		}
		if len(w.inserts) > 0 {
			inserts = append(inserts, &tableWrite{table: w.table, inserts: w.inserts})
			c := *w
			c.inserts = nil
			w = &c
		}
		body = append(body, w)
	}
	b, err := encodeSections(fam, body, p.pool)
	if err != nil {
		return err
	}
	size := b.Len()
	if err := run.InNamespace(b.Send); err != nil {
		return err
	}
	klog.FromContext(ctx).V(2).Info("netlink write", "family", fam, "bytes", size, "elapsed", time.Since(start))
	if len(inserts) == 0 {
		return nil
	}
	text := restoreText(inserts...)
	_, err = p.exec.Run(ctx, []byte(text), p.backend.cmd(fam, "-restore"), "--noflush", "--wait")
	if err != nil {
		// The chains are written; only the jumps failed. Not a reason to
		// write everything again with iptables-restore: report it (the
		// sync fails, and the next one is full).
		return fmt.Errorf("%w: %w", errJumpsAfterCommit, err)
	}
	return nil
}

// errJumpsAfterCommit: the netlink transaction is in, the jumps from
// built-in chains that follow it through iptables-restore are not.
var errJumpsAfterCommit = errors.New("adding jumps from built-in chains")

// save reads one table of the family.
func (p *Proxier) save(ctx context.Context, fam model.Family, table string) (*savedTable, error) {
	out, err := p.exec.Run(ctx, nil, p.backend.cmd(fam, "-save"), "-t", table)
	if err != nil {
		return nil, fmt.Errorf("reading %s table: %w", table, err)
	}
	return parseSave(string(out)), nil
}

// readTable reads what a full sync needs of a table: the name of every
// chain, and the rules of the chains rulesOf picks. On the nf_tables
// backend the names come over netlink and each picked chain from
// `iptables -S <chain>` (a few ms each), since iptables-nft-save (1.8) reads
// the whole ruleset, whatever table it is asked for: at 10k Services × 10
// endpoints ~3 s per call, most of a restart's reading.
func (p *Proxier) readTable(ctx context.Context, fam model.Family, table string, rulesOf func(chain string) bool) (*savedTable, error) {
	run, ok := p.nsReader()
	if !ok {
		return p.save(ctx, fam, table)
	}
	var names []string
	err := run.InNamespace(func() error {
		var err error
		names, err = nfnl.ChainNames(nfproto(fam), table)
		return err
	})
	if err != nil {
		klog.FromContext(ctx).Error(err, "Listing chains over netlink failed; reading them with iptables-save", "family", fam, "table", table)
		return p.save(ctx, fam, table)
	}
	st := &savedTable{chains: make(map[string]bool, len(names)), rules: map[string][]string{}, order: names}
	for _, n := range names {
		st.chains[n] = true
	}
	for _, n := range names {
		if !rulesOf(n) {
			continue
		}
		out, err := p.exec.Run(ctx, nil, p.backend.cmd(fam, ""), "-t", table, "-S", n)
		if err != nil {
			return nil, fmt.Errorf("reading %s chain %s: %w", table, n, err)
		}
		st.rules[n] = parseSave(string(out)).rules[n]
	}
	return st, nil
}

// jumpSources returns whether a chain of table holds one of the jumps.
func jumpSources(jumps []Jump, table string) func(string) bool {
	return func(chain string) bool {
		return slices.ContainsFunc(jumps, func(j Jump) bool { return j.Table == table && j.Chain == chain })
	}
}

// fullSync rewrites every chain, re-adds missing jumps and deletes stale
// chains found in the kernel. Nothing is flushed as a whole, so traffic
// keeps flowing across a restart.
func (p *Proxier) fullSync(ctx context.Context, st *famState, snap *model.Snapshot) error {
	st.full = true
	if err := p.prepareSysctls(ctx); err != nil {
		return err
	}
	p.ensureCounters(ctx)
	fs := snap.Family(st.fam)
	r := newRenderer(p.params(), fs, snap.Node)
	// Each port is rendered here for its entries and sizes, and again when
	// its chains are written (lazyPorts).
	ports := make(map[model.PortID]*portRules, len(fs.Ports))
	for _, sp := range fs.Ports {
		pr := r.port(sp)
		pr.compact()
		ports[sp.ID] = pr
	}
	filter, natShared := r.sharedChains(fs.Ports, ports)
	natWant := chainNames(natShared)
	for _, sp := range fs.Ports {
		for _, c := range ports[sp.ID].sums {
			natWant[c.name] = true
		}
	}
	jumps := r.jumps()
	savedNAT, err := p.readTable(ctx, st.fam, tableNAT, jumpSources(jumps, tableNAT))
	if err != nil {
		return err
	}
	fromFilter := jumpSources(jumps, tableFilter)
	savedFilter, err := p.readTable(ctx, st.fam, tableFilter, func(c string) bool {
		return strings.HasPrefix(c, "KUBE-") || fromFilter(c)
	})
	if err != nil {
		return err
	}
	f1, f3 := fullFilterPhases(filter, savedFilter)
	f1.inserts = missingJumps(savedFilter, jumps, tableFilter)
	f3.deletes = staleChains(tableFilter, savedFilter, chainNames(filter))
	fixed, leaves := splitLeaves(natShared)
	loaded := slices.ContainsFunc(savedNAT.order, func(name string) bool { return strings.HasPrefix(name, prefixSVC) })
	rest, batched, err := p.writeAhead(ctx, st.fam, lazyPorts{r: r, order: fs.Ports, ports: ports}, leaves, r.markMasqChain(), f1, loaded)
	if err != nil {
		return err
	}
	if batched {
		f1 = nil
	}
	nat := &tableWrite{table: tableNAT, chains: append(fixed, rest...),
		deletes: staleChains(tableNAT, savedNAT, natWant), inserts: missingJumps(savedNAT, jumps, tableNAT)}
	mangle := &tableWrite{table: tableMangle, chains: []*Chain{canaryChain()}}
	if err := p.restore(ctx, st.fam, mangle, f1, nat, f3); err != nil {
		return err
	}
	st.valid, st.large, st.ports = true, r.large, ports
	st.shared = sharedState(filter, natShared)
	return nil
}

// chainNames is the set of the chains' names.
func chainNames(chains []*Chain) map[string]bool {
	m := make(map[string]bool, len(chains))
	for _, c := range chains {
		m[c.Name] = true
	}
	return m
}

func sharedState(filter, nat []*Chain) map[string][]rule {
	m := make(map[string][]rule, len(filter)+len(nat))
	for _, c := range filter {
		m[key(tableFilter, c.Name)] = c.Rules
	}
	for _, c := range nat {
		m[key(tableNAT, c.Name)] = c.Rules
	}
	return m
}

// missingJumps are the jumps of table not found in the saved built-in chains.
func missingJumps(saved *savedTable, jumps []Jump, table string) []Jump {
	var out []Jump
	for _, j := range jumps {
		if j.Table == table && !hasJump(saved, j) {
			out = append(out, j)
		}
	}
	return out
}

// filterPhases splits a filter update in two so that no connection is
// dropped or wrongly rejected in between: phase 1 (before nat) adds new
// REJECT/DROP rules while keeping old ones; phase 3 (after nat) removes the
// old ones. A REJECT for a Service IP never matches a packet nat already
// DNATed, so keeping it while the DNAT appears is harmless; adding it before
// the DNAT disappears closes the window in the other direction.
func filterPhases(desired []*Chain, old map[string][]rule) (*tableWrite, *tableWrite) {
	f1, f3 := &tableWrite{table: tableFilter}, &tableWrite{table: tableFilter}
	for _, c := range desired {
		o, had := old[c.Name]
		if had && slices.Equal(o, c.Rules) {
			continue
		}
		adds, removes := diffRules(c.Rules, o)
		if len(adds) > 0 || !had {
			f1.chains = append(f1.chains, &Chain{Name: c.Name, Rules: append(slices.Clone(c.Rules), removes...)})
			if len(removes) == 0 {
				continue
			}
		}
		f3.chains = append(f3.chains, c)
	}
	return f1, f3
}

// fullFilterPhases is filterPhases for a full sync, which knows what the
// kernel holds only as iptables-save text (the kernel's spelling, not
// kproxy's): phase 1 appends the desired rules to every chain that holds
// rules, keeping those whatever they are, and phase 3 replaces each such
// chain by the desired rules. Chains without rules get theirs in phase 1.
func fullFilterPhases(desired []*Chain, saved *savedTable) (*tableWrite, *tableWrite) {
	f1, f3 := &tableWrite{table: tableFilter}, &tableWrite{table: tableFilter}
	for _, c := range desired {
		if len(saved.rules[c.Name]) == 0 {
			f1.chains = append(f1.chains, c)
			continue
		}
		if len(c.Rules) > 0 {
			f1.appends = append(f1.appends, c)
		}
		f3.chains = append(f3.chains, c)
	}
	return f1, f3
}

// diffRules returns the rules of a not in b and of b not in a.
func diffRules(a, b []rule) (onlyA, onlyB []rule) {
	inA := make(map[rule]bool, len(a))
	for _, r := range a {
		inA[r] = true
	}
	inB := make(map[rule]bool, len(b))
	for _, r := range b {
		inB[r] = true
		if !inA[r] {
			onlyB = append(onlyB, r)
		}
	}
	for _, r := range a {
		if !inB[r] {
			onlyA = append(onlyA, r)
		}
	}
	return onlyA, onlyB
}

// partialSync re-renders only the ports of changed Services, then writes
// the chains whose rules differ from what was last written.
func (p *Proxier) partialSync(ctx context.Context, st *famState, snap *model.Snapshot, changed map[objects.Key]struct{}) error {
	fs := snap.Family(st.fam)
	r := newRenderer(p.params(), fs, snap.Node)
	if r.large != st.large {
		return p.fullSync(ctx, st, snap) // every endpoint comment changes
	}
	ports := maps.Clone(st.ports)
	touched := map[model.PortID]bool{}
	for id := range st.ports {
		if _, ok := changed[id.Service()]; ok {
			delete(ports, id)
			touched[id] = true
		}
	}
	for _, sp := range fs.Ports {
		if _, ok := changed[sp.ID.Service()]; ok {
			ports[sp.ID] = r.port(sp)
			touched[sp.ID] = true
		}
	}
	filter, natShared := r.sharedChains(fs.Ports, ports)
	nat := sharedNATWrite(natShared, st.shared)
	oldFilter := map[string][]rule{}
	for _, c := range filter {
		if rules, ok := st.shared[key(tableFilter, c.Name)]; ok {
			oldFilter[c.Name] = rules
		}
	}
	f1, f3 := filterPhases(filter, oldFilter)
	fixed, leaves := splitLeaves(nat.chains)
	var groups portGroups
	for _, id := range sortedPortIDs(touched) {
		changedChains, deletes := portDiff(st.ports[id], ports[id])
		groups = append(groups, changedChains)
		nat.deletes = append(nat.deletes, deletes...)
	}
	rest, batched, err := p.writeAhead(ctx, st.fam, groups, leaves, r.markMasqChain(), f1, true)
	if err != nil {
		return err
	}
	if batched {
		f1 = nil
	}
	nat.chains = append(fixed, rest...)
	if err := p.restore(ctx, st.fam, f1, nat, f3); err != nil {
		return err
	}
	for id := range touched {
		if pr := ports[id]; pr != nil {
			pr.compact()
		}
	}
	st.ports, st.shared = ports, sharedState(filter, natShared)
	return nil
}

// sharedNATWrite writes the shared nat chains that changed and deletes the
// dispatch buckets that emptied.
func sharedNATWrite(natShared []*Chain, old map[string][]rule) *tableWrite {
	w := &tableWrite{table: tableNAT}
	now := make(map[string]bool, len(natShared))
	for _, c := range natShared {
		now[c.Name] = true
		if o, ok := old[key(tableNAT, c.Name)]; !ok || !slices.Equal(o, c.Rules) {
			w.chains = append(w.chains, c)
		}
	}
	for k := range old {
		if name, ok := cutPrefix(k, tableNAT+"/"); ok && !now[name] {
			w.deletes = append(w.deletes, name)
		}
	}
	slices.Sort(w.deletes)
	return w
}

func cutPrefix(s, p string) (string, bool) {
	if len(s) >= len(p) && s[:len(p)] == p {
		return s[len(p):], true
	}
	return "", false
}

// portDiff returns the chains of one port that differ between old (as
// written: compact) and new (freshly rendered), either may be nil, and the
// names of the chains new no longer has.
func portDiff(old, new *portRules) (changed []*Chain, deletes []string) {
	prev := map[string]uint64{}
	if old != nil {
		for _, c := range old.sums {
			prev[c.name] = c.sum
		}
	}
	if new != nil {
		for _, c := range new.nat {
			if sum, ok := prev[c.Name]; !ok || sum != sumRules(c.Rules) {
				changed = append(changed, c)
			}
			delete(prev, c.Name)
		}
	}
	return changed, sortedKeys(prev)
}

// sortedPortIDs returns the set's ports in a stable order.
func sortedPortIDs(set map[model.PortID]bool) []model.PortID {
	ids := make([]model.PortID, 0, len(set))
	for id := range set {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, b model.PortID) int {
		return strings.Compare(a.String()+string(a.Protocol), b.String()+string(b.Protocol))
	})
	return ids
}
