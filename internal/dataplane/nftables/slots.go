package nftables

import (
	"fmt"
	"hash/crc32"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/knftables"
)

// blockSpan is how many keys of an endpoint-ranges map one policy chain
// owns. The chain picks a key with `numgen random mod blockSpan offset
// BASE`, and its N endpoints split the block into N ranges (interval
// elements key range -> address . port). The rule never depends on N, so
// any endpoint change, the count included (0 <-> 1 too), changes map
// elements only: no rule, no chain, no goto element, and so no
// re-validation of the whole table by the kernel (which adding a rule with
// dnat or a goto element costs: 6-30 ms at 10k Services).
//
// The choice is exactly uniform when N divides 2^20 (any power of two) and
// within N/2^20 of uniform otherwise (ranges differ by one key): 1e-5
// relative for 10 endpoints. numgen itself is exact here, 2^20 dividing
// 2^32.
const blockSpan = 1 << 20

// blocksPerShard is how many blocks one map's 32-bit keys hold.
const blocksPerShard = 1 << 32 / blockSpan

// shardCount is how many endpoint-ranges maps each protocol has: each rule
// bound to a map with data makes the kernel check the map's elements, and
// each element added is checked against every bound rule (a loop over the
// map's bindings in nft_add_set_elem), so a map's load costs rules ×
// elements, and all maps' together ~1/shards; and smaller maps commit
// faster (the kernel's per-commit work on an interval map grows with its
// size). At 10k Services × 10 endpoints (a cold sync in a fresh process,
// 3d04ae6), 32 TCP maps took 0.96-1.01 s with 29 % of the CPU in that
// loop, 128 maps 0.60-0.72 s, 256 no better; one endpoint change 1.3-1.6
// ms p50 with 32 maps, 0.5 ms with 128. At 10k × 100 (2026-11-27, two
// runs each) 512 maps take the kernel's commit of the cold sync from
// 3.7-4.1 s to 2.7 s and the cold sync from 4.0-4.2 s to 3.0 s, one
// endpoint change from 2.1-2.2 to 1.4 ms p50; 1024 no better; at 10k × 10
// no difference beyond the noise, at 1k × 10 ~20 ms more cold sync (more
// maps to create). Measure with `KPROXY_SCALE=1 KPROXY_SCALE_TCP_SHARDS=N
// KPROXY_SCALE_ENDPOINTS=M go test -run 'PrivilegedScale$' -v
// ./internal/dataplane/nftables/` (root). It also bounds the ports per
// protocol and family: shards × blocksPerShard (2M TCP ports).
var shardCount = map[string]int{"tcp": 512, "udp": 32, "sctp": 8}

// endpointShard names an endpoint-ranges map.
func endpointShard(proto string, i int) string {
	return fmt.Sprintf("%s-%s-%02d", mapEndpoints, proto, i)
}

// shardNames are the names of each protocol's endpoint-ranges maps.
var shardNames = makeShardNames()

func makeShardNames() map[string][]string {
	out := map[string][]string{}
	for proto, n := range shardCount {
		for i := range n {
			out[proto] = append(out[proto], endpointShard(proto, i))
		}
	}
	return out
}

// shardOf is the map a policy chain's block lives in, from its allocator
// key ("svc ns/name/proto/port"): a hash, so that a restart finds it again.
func shardOf(key, proto string) string {
	names := shardNames[proto]
	return names[crc32.ChecksumIEEE([]byte(key))%uint32(len(names))]
}

// block is one policy chain's range of keys in one endpoint-ranges map.
type block struct {
	shard string
	index uint32
}

// offset is the block's first key.
func (b block) offset() uint32 { return b.index * blockSpan }

// keyShard is the map of an allocator key's block ("svc ns/name/proto/port",
// see shardOf) and its protocol; both "" when the protocol has no maps.
func keyShard(key string) (name, proto string) {
	_, rest, _ := strings.Cut(key, "/")
	_, rest, _ = strings.Cut(rest, "/")
	proto, _, _ = strings.Cut(rest, "/")
	if _, ok := shardCount[proto]; !ok {
		return "", ""
	}
	return shardOf(key, proto), proto
}

// slotAlloc hands out the blocks of the endpoint-ranges maps, per map.
type slotAlloc struct {
	owner map[string]block    // chain key -> block
	next  map[string]uint32   // shard -> first index never handed out
	free  map[string][]uint32 // shard -> released indexes
	// owned counts the blocks in each map that have an owner.
	owned map[string]int
	// idle are the maps that may have no owned block: those whose last
	// one was released and those a kernel read found, until unusedMaps
	// deletes them or finds them in use.
	idle map[string]bool
	// used marks the indexes of blocks reserved from the kernel, until
	// compact.
	used map[string]map[uint32]bool
}

func newSlotAlloc() *slotAlloc {
	return &slotAlloc{owner: map[string]block{}, next: map[string]uint32{}, free: map[string][]uint32{}}
}

// get returns key's block, allocating one in key's map when it has none;
// false when that map is full.
func (a *slotAlloc) get(key, proto string) (block, bool) {
	if b, ok := a.owner[key]; ok {
		return b, true
	}
	shard := shardOf(key, proto)
	b := block{shard: shard}
	if list := a.free[shard]; len(list) > 0 {
		b.index = list[len(list)-1]
		a.free[shard] = list[:len(list)-1]
	} else {
		if a.next[shard] >= blocksPerShard {
			return block{}, false
		}
		b.index = a.next[shard]
		a.next[shard]++
	}
	a.own(key, b)
	return b, true
}

// own records b as key's block.
func (a *slotAlloc) own(key string, b block) {
	a.owner[key] = b
	if a.owned == nil {
		a.owned = map[string]int{}
	}
	a.owned[b.shard]++
}

// inUse reports whether some key owns a block of the map shard.
func (a *slotAlloc) inUse(shard string) bool { return a != nil && a.owned[shard] > 0 }

// shardOfKey is the map of key's block, from its owner when it has one
// (a is nil for a rendering that has no allocator of its own).
func (a *slotAlloc) shardOfKey(key string) string {
	if a != nil {
		if b, ok := a.owner[key]; ok {
			return b.shard
		}
	}
	name, _ := keyShard(key)
	return name
}

// maybeIdle marks the map shard as one that may have no owned block.
func (a *slotAlloc) maybeIdle(shard string) {
	if a.idle == nil {
		a.idle = map[string]bool{}
	}
	a.idle[shard] = true
}

// release returns key's block, if any, to its map's free list.
func (a *slotAlloc) release(key string) {
	if b, ok := a.owner[key]; ok {
		delete(a.owner, key)
		if a.owned[b.shard]--; a.owned[b.shard] == 0 {
			a.maybeIdle(b.shard)
		}
		a.free[b.shard] = append(a.free[b.shard], b.index)
	}
}

// retain releases every block whose key is not in keep: after a full
// render, blocks of ports that are gone or no longer have that policy
// chain, and blocks reserved from stale chains found in the kernel. A
// released block's stale chain (if any) is unreferenced, and a new owner's
// chain has another name, so the block can be reused at once.
func (a *slotAlloc) retain(keep map[string]bool) {
	for key := range a.owner {
		if !keep[key] {
			a.release(key)
		}
	}
}

// reserve records a block found in the kernel (from a chain name) so that a
// restarted proxy keeps it. It returns false when the block is unusable.
func (a *slotAlloc) reserve(key, proto string, index uint32) bool {
	if _, ok := shardCount[proto]; !ok {
		return false
	}
	shard := shardOf(key, proto)
	if _, ok := a.owner[key]; ok || index >= blocksPerShard || a.used[shard][index] {
		return false
	}
	if a.used == nil {
		a.used = map[string]map[uint32]bool{}
	}
	if a.used[shard] == nil {
		a.used[shard] = map[uint32]bool{}
	}
	a.used[shard][index] = true
	a.own(key, block{shard: shard, index: index})
	a.next[shard] = max(a.next[shard], index+1)
	return true
}

// compact rebuilds the free lists after reservations: every index below a
// map's next that no reservation took is free.
func (a *slotAlloc) compact() {
	a.free = map[string][]uint32{}
	for shard, next := range a.next {
		for i := uint32(0); i < next; i++ {
			if !a.used[shard][i] {
				a.free[shard] = append(a.free[shard], i)
			}
		}
	}
	a.used = nil
}

// blockSuffix is how a policy chain's name records its block index.
func blockSuffix(b block) string { return "/" + strconv.FormatUint(uint64(b.index), 10) }

// parseBlockName splits a policy chain name "svc-HASH-ns/name/proto/port/INDEX"
// into the allocator key ("svc ns/name/proto/port"), protocol and index.
func parseBlockName(name string) (key, proto string, index uint32, ok bool) {
	prefix, rest, ok := strings.Cut(name, "-")
	if !ok || (prefix != "svc" && prefix != "loc") {
		return "", "", 0, false
	}
	_, human, ok := strings.Cut(rest, "-")
	i := strings.LastIndex(human, "/")
	if !ok || i < 0 {
		return "", "", 0, false
	}
	parts := strings.Split(human[:i], "/")
	n, err := strconv.ParseUint(human[i+1:], 10, 32)
	if err != nil || len(parts) != 4 {
		return "", "", 0, false
	}
	return prefix + " " + human[:i], parts[2], uint32(n), true
}

// blockRanges splits a block into n ranges, one per endpoint (their
// endpoints left for the caller): sizes differ by at most one key.
func blockRanges(b block, n int) []rangeElem {
	out := make([]rangeElem, n)
	base := uint64(b.offset())
	for i := range n {
		out[i].lo = uint32(base + uint64(i)*blockSpan/uint64(n))
		out[i].hi = uint32(base + uint64(i+1)*blockSpan/uint64(n) - 1)
	}
	return out
}

// blockKeys are the first n keys of a block, one per endpoint, as
// one-key ranges.
func blockKeys(b block, n int) []rangeElem {
	out := make([]rangeElem, n)
	for i := range n {
		k := b.offset() + uint32(i)
		out[i].lo, out[i].hi = k, k
	}
	return out
}

// tableRuns turns a source-hash table into ranges of the block: one per
// run of buckets with the same endpoint, and that endpoint's index in
// owners.
func tableRuns(b block, table []int32) (keys []rangeElem, owners []int) {
	base := b.offset()
	for lo := 0; lo < len(table); {
		hi := lo
		for hi+1 < len(table) && table[hi+1] == table[lo] {
			hi++
		}
		keys = append(keys, rangeElem{lo: base + uint32(lo), hi: base + uint32(hi)})
		owners = append(owners, int(table[lo]))
		lo = hi + 1
	}
	return keys, owners
}

// endpointMapOps adds to t the endpoint-ranges maps of ps's blocks that t
// does not add yet. They go before the rules that refer to them: t.sets
// precedes every chain, and each stage carries the maps added since the
// stage before (cutStage). A full sync adds every map in use, as it adds
// every fixed set (adding an existing one changes nothing); an
// incremental one only those the kernel lacks.
func (st *famState) endpointMapOps(ps *portState, t *txn, full bool) {
	for _, f := range ps.Fills {
		key := f.key
		if name := st.slots.shardOfKey(key); t.maps[name] || (!full && st.kMaps[name]) {
			continue
		}
		name, proto := keyShard(key)
		if name == "" {
			continue
		}
		if t.maps == nil {
			t.maps = map[string]bool{}
		}
		t.maps[name] = true
		t.sets = append(t.sets, op{verb: opAdd, obj: endpointSet(string(nftFamily(st.fam)), proto, name).object()})
	}
}

// unusedMaps deletes the endpoint-ranges maps in the kernel that have no
// owned block and that no chain waiting for deletion refers to (the kernel
// refuses to delete a map a rule refers to). deleteStale calls it after
// picking the chains it deletes, which go first in its transaction: a
// map's last chain and the map go together. A table written when every
// map was always there (or by a restart's predecessor) loses its unused
// maps the same way. It looks only at the maps slotAlloc.idle names.
func (st *famState) unusedMaps() []op {
	if st.slots == nil {
		return nil
	}
	var gone []string
	for name := range st.slots.idle {
		if st.slots.inUse(name) || !st.kMaps[name] {
			delete(st.slots.idle, name)
		} else {
			gone = append(gone, name)
		}
	}
	if len(gone) == 0 {
		return nil
	}
	busy := map[string]bool{}
	for name := range st.stale {
		if key, _, _, ok := parseBlockName(name); ok && st.kChains[name] {
			shard, _ := keyShard(key)
			busy[shard] = true
		}
	}
	slices.Sort(gone)
	var out []op
	for _, name := range gone {
		if !busy[name] {
			delete(st.kMaps, name)
			delete(st.slots.idle, name)
			out = append(out, op{verb: opDelete, obj: &knftables.Map{Name: name}})
		}
	}
	return out
}
