package nftables

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// Sweeping the affinity set. The packet path fills the affinity set with
// `client . id` elements, id naming a (service port, endpoint) pair. When
// an endpoint stops being reachable its rules go, but its elements would
// stay until they time out: an endpoint back within the timeout (a
// readiness flap) would get its old clients back, ahead of the endpoint
// they moved to meanwhile. Upstream deletes the endpoint's own set when the
// endpoint goes, so those clients keep where they moved. kproxy deletes the
// endpoint's elements once the transaction that removed its rules has
// committed: no rule can add one after that.

// noteAffinityGone records the affinity ids old has and next (nil: the
// port went) lacks, for sweepAffinity.
func (st *famState) noteAffinityGone(old, next *portState) {
	if old == nil || len(old.Affinity) == 0 {
		return
	}
	var keep []uint32
	if next != nil {
		keep = next.Affinity
	}
	for _, id := range old.Affinity {
		if _, found := slices.BinarySearch(keep, id); found {
			continue
		}
		if st.affinityGone == nil {
			st.affinityGone = map[uint32]bool{}
		}
		st.affinityGone[id] = true
	}
}

// sweepAffinity deletes the affinity elements of the ids noted gone, and
// after a full sync (affinityAll) every element whose id no port has now:
// kproxy may have restarted after endpoints left. It lists the set (one
// dump; nothing when the set is empty) and deletes in one transaction. An
// element can time out between the two, failing the deletion, so it tries
// twice; what fails stays noted for the next sync.
func (st *famState) sweepAffinity(ctx context.Context) error {
	if len(st.affinityGone) == 0 && !st.affinityAll {
		return nil
	}
	var err error
	for range 2 {
		if err = st.sweepOnce(ctx); err == nil {
			st.affinityGone, st.affinityAll = nil, false
			return nil
		}
	}
	return err
}

func (st *famState) sweepOnce(ctx context.Context) error {
	elems, err := st.kern.ListElements(ctx, st.r.affinitySet())
	if err != nil || len(elems) == 0 {
		return err
	}
	// An id some port has now is never swept: its endpoint may be back
	// (after a failed sync or sweep), or two ports' 32-bit ids collide.
	live := map[uint32]bool{}
	for _, ps := range st.cur.Ports {
		for _, id := range ps.Affinity {
			live[id] = true
		}
	}
	var dels []op
	for _, k := range slices.Sorted(maps.Keys(elems)) {
		id, ok := affinityID(k)
		if ok && !live[id] && (st.affinityGone[id] || st.affinityAll) {
			dels = append(dels, elemOp(opDelete, &element{Set: setAffinity, Key: k}, false))
		}
	}
	if len(dels) == 0 {
		return nil
	}
	return st.kern.Apply(ctx, opList{dels})
}

// affinityID reads the id of an affinity element's key, "client . 0xID".
func affinityID(key string) (uint32, bool) {
	_, id, ok := strings.Cut(key, fieldSep)
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseUint(id, 0, 32)
	return uint32(v), err == nil
}
