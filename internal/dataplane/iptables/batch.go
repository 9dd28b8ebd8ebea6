package iptables

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/kproxy/kproxy/internal/model"
)

// Batching: iptables-nft-restore (1.8.9 measured here) spends time that grows
// with the product of the chains and the jump rules of one input, so a
// single input with 110k chains (10k Services × 10 endpoints) runs for many
// minutes. Per-Service chains are therefore written ahead, in inputs of at
// most batchChains chains or batchRules rules each (the dispatch leaves
// too), and the final input holds only the other shared chains, the jumps
// and the deletions. Filter phase 1 is applied before the first batch.
// Only on nf_tables: legacy restores replace the whole table every time.
//
// This keeps every packet's view consistent: a batch never splits one
// service port's chains (each restore is atomic), new chains are not
// referenced until the final input adds the dispatch rules, and chains
// that are no longer wanted are deleted only by the final input, after the
// filter table's REJECTs are in place (see filterPhases).

// batchChains and batchRules bound one ahead-of-time restore input. Below
// them the whole sync is a single input.
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
// (the expensive part, in user space) and committed as its own
// transaction. Legacy restores take the xtables lock, so they run one by one.
var aheadWorkers = 2

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
	if err := p.restore(ctx, fam, restoreText(pre)); err != nil {
		return nil, true, fmt.Errorf("filter rules before the Service chains: %w", err)
	}
	// The leaves jump to the per-port chains: they go in a second round.
	for _, round := range []portGroups{ports, leaves} {
		if err := p.restoreAll(ctx, fam, batchTexts(round, markMasq)); err != nil {
			return nil, true, fmt.Errorf("writing Service chains ahead: %w", err)
		}
	}
	return nil, true, nil
}

// batchTexts cuts groups into restore inputs that fit the bounds (a group
// larger than the bounds gets an input of its own).
func batchTexts(groups portGroups, markMasq *Chain) []string {
	var texts []string
	batch := portGroups{{markMasq}}
	flush := func() {
		if len(batch) == 1 {
			return
		}
		var chains []*Chain
		for _, cs := range batch {
			chains = append(chains, cs...)
		}
		texts = append(texts, restoreText(&tableWrite{table: tableNAT, chains: chains}))
		batch = portGroups{{markMasq}}
	}
	for _, cs := range groups {
		if !fits(append(batch, cs).size()) {
			flush()
		}
		batch = append(batch, cs)
	}
	flush()
	return texts
}

// restoreAll runs the inputs, aheadWorkers at a time on nf_tables, and
// returns the first error (the remaining inputs are skipped).
func (p *Proxier) restoreAll(ctx context.Context, fam model.Family, texts []string) error {
	workers := 1
	if p.backend == BackendNFT {
		workers = aheadWorkers
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	next := make(chan string)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for text := range next {
				if err := p.restore(ctx, fam, text); err != nil {
					errs <- err
					cancel()
					return
				}
			}
		}()
	}
	for _, text := range texts {
		select {
		case next <- text:
		case <-ctx.Done():
		}
	}
	close(next)
	wg.Wait()
	close(errs)
	return <-errs
}
