package nftables

import (
	"maps"
	"math/rand/v2"
	"net/netip"
	"strconv"
	"testing"
	"unsafe"
)

func TestSlotAlloc(t *testing.T) {
	a := newSlotAlloc()
	b1, ok1 := a.get("svc ns/a/tcp/p", "tcp")
	b2, ok2 := a.get("svc ns/b/tcp/p", "tcp")
	if !ok1 || !ok2 || b1 == b2 {
		t.Fatalf("blocks %v %v", b1, b2)
	}
	if again, _ := a.get("svc ns/a/tcp/p", "tcp"); again != b1 {
		t.Errorf("a chain's block moved: %v -> %v", b1, again)
	}
	a.release("svc ns/a/tcp/p")
	// A key hashing to the same map reuses the freed block.
	for i := range 1000 {
		key := "svc ns/c" + strconv.Itoa(i) + "/tcp/p"
		if shardOf(key, "tcp") != b1.shard {
			continue
		}
		if reused, _ := a.get(key, "tcp"); reused != b1 {
			t.Errorf("freed block not reused: got %v want %v", reused, b1)
		}
		break
	}
	key, proto, index, ok := parseBlockName("svc-ABCDEFGHIJ-ns/name/tcp/p" + blockSuffix(block{index: 77}))
	if !ok || key != "svc ns/name/tcp/p" || proto != "tcp" || index != 77 {
		t.Errorf("parseBlockName = %q %q %d %v", key, proto, index, ok)
	}
	if _, _, _, ok := parseBlockName("svc-ABCDEFGHIJ-ns/name/tcp/p/1.4"); ok {
		t.Error("an older version's block name parsed")
	}
	r := newSlotAlloc()
	if !r.reserve("svc ns/x/tcp/p", "tcp", 9) || r.reserve("svc ns/x/tcp/p", "tcp", 3) || r.reserve("svc ns/y/tcp/p", "tcp", blocksPerShard) {
		t.Error("duplicate or out-of-range reservation accepted, or a valid one refused")
	}
	r.compact()
	key = "svc ns/z/tcp/p"
	shard := shardOf(key, "tcp")
	if got, _ := r.get(key, "tcp"); shard == shardOf("svc ns/x/tcp/p", "tcp") && got.index >= 9 {
		t.Errorf("compact did not free the indexes below the reservation: %v", got)
	}
}

func TestSlotAllocFull(t *testing.T) {
	a := newSlotAlloc()
	shard := shardOf("svc ns/s/tcp/p", "tcp")
	a.next[shard] = blocksPerShard
	if _, ok := a.get("svc ns/s/tcp/p", "tcp"); ok {
		t.Error("a block was handed out of a full map")
	}
}

func TestBlockRanges(t *testing.T) {
	for _, n := range []int{1, 2, 3, 7, 10, 1000} {
		b := block{index: 4095} // the last block: ranges end at the top of the key space
		rs := blockRanges(b, n)
		next := uint64(b.offset())
		minSize, maxSize := uint64(blockSpan), uint64(0)
		for _, r := range rs {
			first, last := r.lo, r.hi
			if uint64(first) != next {
				t.Fatalf("n=%d: range %d-%d does not start at %d", n, first, last, next)
			}
			size := uint64(last) - uint64(first) + 1
			minSize, maxSize = min(minSize, size), max(maxSize, size)
			next = uint64(last) + 1
		}
		if next != uint64(b.offset())+blockSpan || maxSize-minSize > 1 {
			t.Errorf("n=%d: ranges %v… cover up to %d, sizes %d..%d", n, rs[:min(3, n)], next, minSize, maxSize)
		}
	}
}

func TestPairRanges(t *testing.T) {
	edges := []rangeEdge{
		{key: 20, end: true}, {key: 10, value: "b"}, {key: 0, value: "a"},
		{key: 10, end: true}, {key: 4294967290, value: "c"},
	}
	got := pairRanges(edges)
	want := map[string]string{"0-9": "a", "10-19": "b", "4294967290-4294967295": "c"}
	if len(got) != len(want) {
		t.Fatalf("pairRanges = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("pairRanges[%q] = %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
}

// pairStarts (the restart's compact read) pairs range edges as
// pairRanges (verify's text read) does, whatever their order, for edges
// kproxy writes and for duplicates and overlaps it does not.
func TestPairStartsAsPairRanges(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 500 {
		n := 1 + rng.IntN(12)
		var edges []rangeEdge
		var starts []kernelRange
		var ends []uint32
		for range n {
			k := uint32(rng.IntN(40))
			if round%5 == 0 && rng.IntN(8) == 0 {
				k = 4294967295 - uint32(rng.IntN(3))
			}
			if rng.IntN(3) == 0 {
				edges = append(edges, rangeEdge{key: k, end: true})
				ends = append(ends, k)
				continue
			}
			addr := netip.AddrFrom4([4]byte{198, 18, 0, byte(rng.IntN(4))})
			edges = append(edges, rangeEdge{key: k, value: addrPort(addr, 80)})
			starts = append(starts, kernelRange{lo: k, addr: addr, port: 80})
		}
		want := pairRanges(edges)
		got := map[string]string{}
		prev := -1
		for _, r := range pairStarts(starts, ends) {
			if int(r.lo) <= prev {
				t.Fatalf("round %d: ranges not sorted by first key: %v", round, starts)
			}
			prev = int(r.lo)
			got[rangeKey(r.lo, r.hi)] = addrPort(r.addr, r.port)
		}
		// Duplicate starts keep one of them in either; which one may
		// differ (pairRanges's sort is not stable), so compare keys, and
		// values where the first key is not duplicated.
		if !maps.EqualFunc(got, want, func(a, b string) bool { return true }) {
			t.Fatalf("round %d: edges %v: pairStarts %v, pairRanges %v", round, edges, got, want)
		}
		dup := map[uint32]int{}
		for _, s := range starts {
			dup[s.lo]++
		}
		for k, v := range want {
			lo, _, _ := parseRange(k)
			if dup[lo] == 1 && got[k] != v {
				t.Fatalf("round %d: %s = %q, want %q", round, k, got[k], v)
			}
		}
	}
}

// A full sync at 10k Services holds ~130k ops at once.
func TestOpSize(t *testing.T) {
	if n := unsafe.Sizeof(op{}); n != 32 {
		t.Errorf("op is %d bytes, want 32 (small fields last)", n)
	}
}

// readText is the kernel read of a shared set or map (kElems, or kRanges
// for an endpoint-ranges map) as key -> value text.
func (st *famState) readText(name string) map[string]string {
	ranges, ok := st.kRanges[name]
	if !ok {
		return st.kElems[name]
	}
	out := make(map[string]string, len(ranges))
	for _, r := range ranges {
		out[rangeKey(r.lo, r.hi)] = addrPort(r.addr, r.port)
	}
	return out
}
