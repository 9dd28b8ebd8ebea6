package iptables

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/nfnl"
)

// Batching: iptables-nft-restore (1.8.9 measured here) keeps, per COMMIT,
// a sorted linked list of every chain name the section's commands mention
// (chains and jump targets) and inserts into it once or twice per rule, so
// one section with C chains costs O(rules × C) in string compares: one
// input with 12k chains (1k Services × 10 endpoints) spends 8 s there, one
// with 110k chains many minutes. The list is rebuilt for every COMMIT, so
// per-Service chains are written ahead in sections of at most batchChains
// chains or batchRules rules, many sections to one input (one process per
// worker), and the final input holds only the other shared chains, the
// jumps and the deletions. Sections cannot be tiny either: the kernel walks
// every chain of the table on each commit (nft_table_validate), a few ms
// per commit at 10k Services. Measured at 10k Services × 10 endpoints
// (2 cores): 4000-rule sections in 2 inputs sync in 13.4-13.9 s (17 CPU-s
// of iptables-nft-restore), 750-rule sections 15.9 s, one process per
// 4000-rule input (95 inputs) 15-18 s (20-21 CPU-s). Filter phase 1 is
// applied before the first section. Only on nf_tables: legacy restores
// replace the whole table every time.
//
// This keeps every packet's view consistent: a section never splits one
// service port's chains (each COMMIT is atomic), new chains are not
// referenced until the final input adds the dispatch rules, and chains
// that are no longer wanted are deleted only by the final input, after the
// filter table's REJECTs are in place (see filterPhases).

// batchChains and batchRules bound one ahead-of-time section. Below them
// the whole sync is a single input.
var (
	batchChains = 2000
	batchRules  = 4000
)

// groupList is chains to write ahead in groups: each group (a service
// port's chains, or one dispatch leaf) goes whole into one transaction.
type groupList interface {
	len() int
	size(i int) (chains, rules int)
	chains(i int) []*Chain
}

// portGroups is a groupList of chains at hand.
type portGroups [][]*Chain

func (g portGroups) len() int              { return len(g) }
func (g portGroups) chains(i int) []*Chain { return g[i] }
func (g portGroups) size(i int) (chains, rules int) {
	for _, c := range g[i] {
		chains++
		rules += len(c.Rules)
	}
	return chains, rules
}

// lazyPorts is the chains of every service port, rendered when they are
// written: a full sync first renders each port once for its shared-chain
// entries and sizes, keeping only sums of its chains (compact), so that
// the text of all Services (~55 MB at 10k Services × 10 endpoints) never
// exists at once. The renderer is pure, so both renderings agree.
type lazyPorts struct {
	r     *renderer
	order []*model.ServicePort
	ports map[model.PortID]*portRules
}

func (l lazyPorts) len() int { return len(l.order) }
func (l lazyPorts) size(i int) (chains, rules int) {
	pr := l.ports[l.order[i].ID]
	return len(pr.sums), pr.rules
}
func (l lazyPorts) chains(i int) []*Chain { return l.r.port(l.order[i]).nat }

// total is the size of all groups.
func total(g groupList) (chains, rules int) {
	for i := range g.len() {
		c, r := g.size(i)
		chains, rules = chains+c, rules+r
	}
	return chains, rules
}

// all returns the chains of every group, in order.
func all(g groupList) []*Chain {
	var out []*Chain
	for i := range g.len() {
		out = append(out, g.chains(i)...)
	}
	return out
}

func fits(chains, rules int) bool { return chains <= batchChains && rules <= batchRules }

// splitLeaves separates the dispatch leaf chains (buckets whose rules jump
// to per-Service chains; a leaf has no -g rule) from the other shared nat
// chains. Leaves can be written ahead like per-Service chains: a new leaf
// is unreferenced until its bucket's rule appears in the final input.
func splitLeaves(shared []*Chain) (fixed []*Chain, leaves portGroups) {
	for _, c := range shared {
		if isBucket(c.Name) && !slices.ContainsFunc(c.Rules, func(r rule) bool { return r.target.kind == targetGoto }) {
			leaves = append(leaves, []*Chain{c})
			continue
		}
		fixed = append(fixed, c)
	}
	return fixed, leaves
}

func isBucket(name string) bool {
	return strings.HasPrefix(name, prefixServicesBucket) || strings.HasPrefix(name, prefixNodePortsBucket)
}

// aheadWorkers is how many restore inputs run at once when writing ahead
// on the nf_tables backend: each is parsed by its own iptables-nft-restore
// (the expensive part, in user space) and commits its sections as their own
// transactions. Legacy restores take the xtables lock, so they never batch.
var aheadWorkers = 2

// netlinkInputs is how many netlink transactions the chains written ahead
// are cut into when the table already holds Services (a restart): each
// commit then re-validates the loaded table (~0.4 s at 10k Services × 10
// endpoints), so not many; two are encoded while the kernel takes
// another. Into a table without Services (a node's first start), new
// chains are unreferenced until the final input and commits cost no
// validation, so inputs are cut at about coldInputRules rules instead:
// each input is held whole in memory (~350 bytes per rule), and smaller
// ones keep a cold start's peak down, but every commit also walks every
// chain of the table. Daemon at 10k Services × 10 endpoints, no affinity,
// two cold starts each: 40k rules 4.69 s / 160 MiB, 30k 4.57 s / 142 MiB,
// 20k 5.29 s / 130 MiB.
const (
	netlinkInputs  = 4
	coldInputRules = 30000
)

// writeAhead writes ports, then leaves, in batches when they are too many
// for one input, and returns the chains left for the final input (all of
// them when no batching is needed, none otherwise) and whether it batched.
// Before the first batch it applies pre (filter phase 1: the REJECTs that
// must exist before a DNAT goes away), which the caller must then leave
// out of the final input. markMasq goes first into every batch: per-port
// chains jump to it, and it may not exist yet. loaded tells whether the
// table already holds Services.
func (p *Proxier) writeAhead(ctx context.Context, fam model.Family, ports groupList, leaves portGroups, markMasq *Chain, pre *tableWrite, loaded bool) ([]*Chain, bool, error) {
	chains, rules := total(ports)
	lc, lr := total(leaves)
	// Legacy iptables-restore reads and replaces the whole table for every
	// input, so more inputs only cost more there: never batch.
	if p.backend == BackendLegacy || fits(chains+lc, rules+lr) {
		return append(all(ports), all(leaves)...), false, nil
	}
	if err := p.restore(ctx, fam, pre); err != nil {
		return nil, true, fmt.Errorf("filter rules before the Service chains: %w", err)
	}
	inputs := aheadWorkers
	if _, ok := p.netlinkRunner(); ok {
		inputs = netlinkInputs
		if !loaded {
			inputs = max(inputs, rules/coldInputRules)
		}
		p.pool = &nfnl.Pool{}
		defer func() { p.pool = nil }()
	}
	// The leaves jump to the per-port chains: they go in a second round.
	for _, round := range []groupList{ports, leaves} {
		if err := p.restoreAll(ctx, fam, round, markMasq, planInputs(round, inputs)); err != nil {
			return nil, true, fmt.Errorf("writing Service chains ahead: %w", err)
		}
	}
	return nil, true, nil
}

// section is the groups [lo, hi) of a groupList: one `*nat … COMMIT`
// transaction.
type section struct{ lo, hi int }

// planInputs cuts the groups into sections that fit the bounds (a group
// larger than the bounds gets a section of its own) and deals them, in
// order, into at most inputs inputs of about equal length. One
// iptables-restore process per input instead of one per section saves a
// process start and a cache fetch per section; over netlink an input is
// one transaction.
func planInputs(g groupList, inputs int) [][]section {
	sections := cutSections(g)
	if len(sections) == 0 {
		return nil
	}
	inputs = max(1, min(inputs, len(sections)))
	out := make([][]section, 0, inputs)
	for i := range inputs {
		out = append(out, sections[i*len(sections)/inputs:(i+1)*len(sections)/inputs])
	}
	return out
}

// inputWrites is one planned input: each section starts with markMasq,
// and renders its chains when it is written.
func inputWrites(g groupList, markMasq *Chain, in []section) []*tableWrite {
	ws := make([]*tableWrite, 0, len(in))
	for _, s := range in {
		rules := len(markMasq.Rules)
		for i := s.lo; i < s.hi; i++ {
			_, r := g.size(i)
			rules += r
		}
		ws = append(ws, &tableWrite{table: tableNAT, rules: rules, render: func() []*Chain {
			chains := []*Chain{markMasq}
			for i := s.lo; i < s.hi; i++ {
				chains = append(chains, g.chains(i)...)
			}
			return chains
		}})
	}
	return ws
}

// cutSections groups the groups into sections within the bounds, counting
// the KUBE-MARK-MASQ chain that opens each.
func cutSections(g groupList) []section {
	var sections []section
	lo, chains, rules := 0, 1, 1
	for i := range g.len() {
		c, r := g.size(i)
		if i > lo && !fits(chains+c, rules+r) {
			sections = append(sections, section{lo, i})
			lo, chains, rules = i, 1, 1
		}
		chains, rules = chains+c, rules+r
	}
	if g.len() > lo {
		sections = append(sections, section{lo, g.len()})
	}
	return sections
}

// restoreAll renders and runs the planned inputs, aheadWorkers at a time on
// nf_tables, and returns the first error (the remaining inputs are
// skipped).
func (p *Proxier) restoreAll(ctx context.Context, fam model.Family, g groupList, markMasq *Chain, inputs [][]section) error {
	workers := 1
	if p.backend == BackendNFT {
		workers = aheadWorkers
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	next := make(chan []section)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for in := range next {
				if err := p.restore(ctx, fam, inputWrites(g, markMasq, in)...); err != nil {
					errs <- err
					cancel()
					return
				}
			}
		}()
	}
	for _, in := range inputs {
		select {
		case next <- in:
		case <-ctx.Done():
		}
	}
	close(next)
	wg.Wait()
	close(errs)
	return <-errs
}
