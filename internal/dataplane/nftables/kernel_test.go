package nftables

import (
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

// A full sync at 10k Services holds ~130k ops at once.
func TestOpSize(t *testing.T) {
	if n := unsafe.Sizeof(op{}); n != 32 {
		t.Errorf("op is %d bytes, want 32 (small fields last)", n)
	}
}
