package nftables

import (
	"maps"
	"math"
	"math/rand/v2"
	"net/netip"
	"slices"
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

func TestPairStarts(t *testing.T) {
	a, b, c := netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("198.18.0.2"), netip.MustParseAddr("198.18.0.3")
	starts := []kernelRange{{lo: 10, addr: b, port: 80}, {lo: 0, addr: a, port: 80}, {lo: 4294967290, addr: c, port: 80}}
	got := rangesText(pairStarts(starts, []uint32{20, 10}))
	want := map[string]string{"0-9": "198.18.0.1 . 80", "10-19": "198.18.0.2 . 80", "4294967290-4294967295": "198.18.0.3 . 80"}
	if len(got) != len(want) {
		t.Fatalf("pairStarts = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("pairStarts[%q] = %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
}

// pairStarts pairs range edges, whatever their order, as the definition
// does (each first key runs to the key before the next greater edge, or
// to the top of the key space), for edges kproxy writes and for
// duplicates and overlaps it does not.
func TestPairStartsByDefinition(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 500 {
		n := 1 + rng.IntN(12)
		var starts []kernelRange
		var ends []uint32
		for range n {
			k := uint32(rng.IntN(40))
			if round%5 == 0 && rng.IntN(8) == 0 {
				k = 4294967295 - uint32(rng.IntN(3))
			}
			if rng.IntN(3) == 0 {
				ends = append(ends, k)
				continue
			}
			addr := netip.AddrFrom4([4]byte{198, 18, 0, byte(rng.IntN(4))})
			starts = append(starts, kernelRange{lo: k, addr: addr, port: 80})
		}
		want := pairByDefinition(starts, ends)
		input := slices.Clone(starts)
		paired := pairStarts(starts, ends)
		prev := -1
		for _, r := range paired {
			if int(r.lo) <= prev {
				t.Fatalf("round %d: ranges not sorted by first key: %v", round, input)
			}
			prev = int(r.lo)
		}
		got := rangesText(paired)
		if !maps.Equal(got, want) {
			t.Fatalf("round %d: starts %v, ends %v: pairStarts %v, want %v", round, input, ends, got, want)
		}
	}
}

// pairByDefinition pairs range starts with the edges after them the slow
// way: each first key (the start read last with it) runs to the key before
// the next greater start or end, or to the top of the key space.
func pairByDefinition(starts []kernelRange, ends []uint32) map[string]string {
	last := map[uint32]kernelRange{}
	for _, s := range starts {
		last[s.lo] = s
	}
	out := map[string]string{}
	for lo, s := range last {
		next := uint64(math.MaxUint32) + 1
		for _, o := range starts {
			if o.lo > lo {
				next = min(next, uint64(o.lo))
			}
		}
		for _, e := range ends {
			if e > lo {
				next = min(next, uint64(e))
			}
		}
		out[rangeKey(lo, uint32(next-1))] = addrPort(s.addr, s.port)
	}
	return out
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
	return rangesText(ranges)
}
