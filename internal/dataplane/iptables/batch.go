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

// portGroups lists chains that must be written together, one group per
// service port (or per dispatch leaf chain).
type portGroups [][]*Chain

func (g portGroups) size() (chains, rules int) {
	for _, cs := range g {
		for _, c := range cs {
			chains++
			rules += len(c.Rules)
		}
	}
	return chains, rules
}

func fits(chains, rules int) bool { return chains <= batchChains && rules <= batchRules }

// splitLeaves separates the dispatch leaf chains (buckets whose rules jump
// to per-Service chains; a leaf has no -g rule) from the other shared nat
// chains. Leaves can be written ahead like per-Service chains: a new leaf
// is unreferenced until its bucket's rule appears in the final input.
func splitLeaves(shared []*Chain) (fixed []*Chain, leaves portGroups) {
	for _, c := range shared {
		if isBucket(c.Name) && !slices.ContainsFunc(c.Rules, func(r string) bool { return strings.Contains(r, " -g ") }) {
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
// are cut into. Each is held whole in memory (~330 bytes per rule: 30 MB
// per input at 10k Services × 10 endpoints) and, on a restart, each commit
// re-validates the table that is already loaded (~0.4 s at that size), so
// neither one input nor many; two are encoded while the kernel takes
// another.
const netlinkInputs = 4

// writeAhead writes ports, then leaves, in batches when they are too many
// for one input, and returns the chains left for the final input (all of
// them when no batching is needed, none otherwise) and whether it batched.
// Before the first batch it applies pre (filter phase 1: the REJECTs that
// must exist before a DNAT goes away), which the caller must then leave
// out of the final input. markMasq goes first into every batch: per-port
// chains jump to it, and it may not exist yet.
func (p *Proxier) writeAhead(ctx context.Context, fam model.Family, ports, leaves portGroups, markMasq *Chain, pre *tableWrite) ([]*Chain, bool, error) {
	all := append(slices.Clone(ports), leaves...)
	// Legacy iptables-restore reads and replaces the whole table for every
	// input, so more inputs only cost more there: never batch.
	if p.backend == BackendLegacy || fits(all.size()) {
		var chains []*Chain
		for _, cs := range all {
			chains = append(chains, cs...)
		}
		return chains, false, nil
	}
	if err := p.restore(ctx, fam, pre); err != nil {
		return nil, true, fmt.Errorf("filter rules before the Service chains: %w", err)
	}
	inputs := aheadWorkers
	if _, ok := p.netlinkRunner(); ok {
		inputs = netlinkInputs
		p.pool = &nfnl.Pool{}
		defer func() { p.pool = nil }()
	}
	// The leaves jump to the per-port chains: they go in a second round.
	for _, round := range []portGroups{ports, leaves} {
		if err := p.restoreAll(ctx, fam, batchInputs(round, markMasq, inputs)); err != nil {
			return nil, true, fmt.Errorf("writing Service chains ahead: %w", err)
		}
	}
	return nil, true, nil
}

// batchInputs cuts groups into sections that fit the bounds (a group larger
// than the bounds gets a section of its own) and writes them, in order,
// into at most inputs restore inputs of about equal length: each section
// is one `*nat … COMMIT` transaction that starts with markMasq. One
// iptables-restore process per input instead of one per section saves a
// process start and a cache fetch per section.
func batchInputs(groups portGroups, markMasq *Chain, inputs int) [][]*tableWrite {
	sections := cutSections(groups, markMasq)
	if len(sections) == 0 {
		return nil
	}
	inputs = max(1, min(inputs, len(sections)))
	out := make([][]*tableWrite, 0, inputs)
	for i := range inputs {
		ws := make([]*tableWrite, 0, len(sections)/inputs+1)
		for _, chains := range sections[i*len(sections)/inputs : (i+1)*len(sections)/inputs] {
			ws = append(ws, &tableWrite{table: tableNAT, chains: chains})
		}
		out = append(out, ws)
	}
	return out
}

// cutSections groups the chains of groups into sections within the bounds,
// markMasq first in each.
func cutSections(groups portGroups, markMasq *Chain) [][]*Chain {
	var sections [][]*Chain
	batch := portGroups{{markMasq}}
	flush := func() {
		if len(batch) == 1 {
			return
		}
		var chains []*Chain
		for _, cs := range batch {
			chains = append(chains, cs...)
		}
		sections = append(sections, chains)
		batch = portGroups{{markMasq}}
	}
	chains, rules := portGroups{{markMasq}}.size()
	for _, cs := range groups {
		c, r := portGroups{cs}.size()
		if !fits(chains+c, rules+r) {
			flush()
			chains, rules = portGroups{{markMasq}}.size()
		}
		batch = append(batch, cs)
		chains, rules = chains+c, rules+r
	}
	flush()
	return sections
}

// restoreAll runs the inputs, aheadWorkers at a time on nf_tables, and
// returns the first error (the remaining inputs are skipped).
func (p *Proxier) restoreAll(ctx context.Context, fam model.Family, inputs [][]*tableWrite) error {
	workers := 1
	if p.backend == BackendNFT {
		workers = aheadWorkers
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	next := make(chan []*tableWrite)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ws := range next {
				if err := p.restore(ctx, fam, ws...); err != nil {
					errs <- err
					cancel()
					return
				}
			}
		}()
	}
	for _, ws := range inputs {
		select {
		case next <- ws:
		case <-ctx.Done():
		}
	}
	close(next)
	wg.Wait()
	close(errs)
	return <-errs
}
