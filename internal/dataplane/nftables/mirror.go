package nftables

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"k8s.io/klog/v2"
	"sigs.k8s.io/knftables"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/model"
)

// staleDelay is how long an unreferenced chain is kept before it is deleted:
// kernels before 6.2 release a chain's references from deleted map elements
// only some time after the transaction.
const staleDelay = time.Second

// emptyMirror is the mirror of a table known to be empty (a render
// written from scratch).
func emptyMirror() kernelMirror {
	return kernelMirror{kChains: map[string]bool{}, kSets: map[string]bool{}, kElems: map[string]map[string]string{},
		kRanges: map[string][]kernelRange{}, kMaps: map[string]bool{}, stale: map[string]time.Time{}}
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
	st.kRanges = map[string][]kernelRange{}
	st.stale = map[string]time.Time{}
	st.slots = newSlotAlloc()
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
	if isEndpointShard(s.Name) {
		ranges, err := st.kern.ListRanges(ctx, s)
		if err != nil {
			return fmt.Errorf("listing elements of %s: %w", s.Name, err)
		}
		st.kRanges[s.Name] = ranges
		return nil
	}
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
		st.cleanupFailed = true
	}
}

func chainRank(name string) int {
	if strings.HasPrefix(name, "ext-") || strings.HasPrefix(name, "fw-") {
		return 0
	}
	return 1
}
