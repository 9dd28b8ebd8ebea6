package model

import (
	"hash/fnv"
	"net/netip"
	"slices"

	"github.com/kproxy/kproxy/internal/jhash"
)

// sourceHashSizes are the sizes of source-hash tables, primes, by the
// largest endpoint count each serves (about 20 buckets per endpoint, which
// keeps Maglev's extra disruption near 4 % of clients on average and about
// 10 % at worst: see TestSourceHashRemap, and docs/performance.md for
// smaller tables). A port whose endpoint count crosses a bound gets a
// table of another size, which remaps clients as a new table does.
var sourceHashSizes = []struct{ maxEndpoints, size int }{
	{12, 251}, {50, 1021}, {200, 4093}, {800, 16381}, {1 << 30, 65521},
}

// SourceHashSize is the size of the source-hash table of a port with n
// endpoints.
func SourceHashSize(n int) int {
	for _, s := range sourceHashSizes {
		if n <= s.maxEndpoints {
			return s.size
		}
	}
	return sourceHashSizes[len(sourceHashSizes)-1].size
}

// SourceHashTable is the Maglev lookup table of eps (Eisenbud et al.,
// NSDI 2016): bucket b's endpoint is eps[table[b]]. Every endpoint gets
// within one bucket of len/len(eps); when one endpoint goes, the buckets
// of the others mostly stay. The table depends only on the endpoints'
// addresses and ports, not their order, so every node computes the same
// one. Nil when eps is empty.
func SourceHashTable(eps []*Endpoint) []int32 {
	n := len(eps)
	if n == 0 {
		return nil
	}
	m := SourceHashSize(n)
	// Each endpoint walks the table from offset by skip (coprime to the
	// prime m) and takes the first free bucket on its turn.
	type walker struct{ pos, skip, idx int }
	w := make([]walker, n)
	for i, ep := range order(eps) {
		h := hashAddrPort(ep.ap)
		w[i] = walker{pos: int(h % uint64(m)), skip: int((h>>32)%uint64(m-1)) + 1, idx: ep.index}
	}
	table := make([]int32, m)
	for i := range table {
		table[i] = -1
	}
	for filled := 0; ; {
		for i := range w {
			for table[w[i].pos] >= 0 {
				w[i].pos = (w[i].pos + w[i].skip) % m
			}
			table[w[i].pos] = int32(w[i].idx)
			w[i].pos = (w[i].pos + w[i].skip) % m
			if filled++; filled == m {
				return table
			}
		}
	}
}

// indexed is an endpoint with its index in the caller's list.
type indexed struct {
	ap    netip.AddrPort
	index int
}

// order returns eps with their indexes, sorted by address and port: the
// turn order of the table's fill must not depend on the caller's order.
func order(eps []*Endpoint) []indexed {
	out := make([]indexed, len(eps))
	for i, ep := range eps {
		out[i] = indexed{ap: ep.AddrPort(), index: i}
	}
	slices.SortFunc(out, func(a, b indexed) int { return a.ap.Compare(b.ap) })
	return out
}

// hashAddrPort is FNV-1a of the address's 16 bytes and the port, mixed so
// that both halves of the result are usable.
func hashAddrPort(ap netip.AddrPort) uint64 {
	h := fnv.New64a()
	a := ap.Addr().As16()
	h.Write(a[:])
	h.Write([]byte{byte(ap.Port() >> 8), byte(ap.Port())})
	x := h.Sum64()
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	return x
}

// SourceHashSeed is the seed of the port's client-address hash: the same on
// every node (so a client reaches the same endpoint through any node) and
// never 0 (which would make the kernel pick a random seed).
func (p *ServicePort) SourceHashSeed() uint32 {
	h := fnv.New32a()
	h.Write([]byte(p.ID.Namespace + "/" + p.ID.Name + "/" + p.ID.Port + "/" + string(p.ID.Protocol)))
	return max(h.Sum32(), 1)
}

// SourceHashPick is the endpoint of eps (one of p's endpoint lists) that
// source-hash balancing gives client: the bucket is the kernel's `jhash
// saddr mod size seed SourceHashSeed` of the client's address bytes. Nil
// when eps is empty.
func (p *ServicePort) SourceHashPick(eps []*Endpoint, client netip.Addr) *Endpoint {
	table := SourceHashTable(eps)
	if table == nil {
		return nil
	}
	return eps[SourceHashIndex(table, p.SourceHashSeed(), client)]
}

// SourceHashIndex is the index, in the endpoint list table was made from,
// of client's endpoint: table[jhash(client) mod len(table)]. For callers
// that keep the table and seed of a port (one per connection would
// rebuild the table each time).
func SourceHashIndex(table []int32, seed uint32, client netip.Addr) int {
	return int(table[jhash.Bucket(client.Unmap().AsSlice(), seed, uint32(len(table)))])
}
