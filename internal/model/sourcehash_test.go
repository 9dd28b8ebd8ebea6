package model

import (
	"fmt"
	"net/netip"
	"testing"
)

func hashEndpoints(n int) []*Endpoint {
	eps := make([]*Endpoint, n)
	for i := range eps {
		eps[i] = &Endpoint{IP: netip.AddrFrom4([4]byte{198, 18, byte(1 + i/250), byte(1 + i%250)}), Port: 8080}
	}
	return eps
}

// TestSourceHashBalance: every endpoint owns within one bucket of its
// share, and the table does not depend on the order of the endpoints.
func TestSourceHashBalance(t *testing.T) {
	for _, n := range []int{1, 2, 3, 7, 12, 13, 50, 51, 300} {
		eps := hashEndpoints(n)
		table := SourceHashTable(eps)
		if len(table) != SourceHashSize(n) {
			t.Fatalf("n=%d: table of %d, want %d", n, len(table), SourceHashSize(n))
		}
		count := make([]int, n)
		for _, e := range table {
			count[e]++
		}
		lo, hi := len(table)/n, (len(table)+n-1)/n
		for i, c := range count {
			if c < lo || c > hi {
				t.Errorf("n=%d: endpoint %d owns %d buckets, want %d-%d", n, i, c, lo, hi)
			}
		}
		rev := make([]*Endpoint, n)
		for i, ep := range eps {
			rev[n-1-i] = ep
		}
		for b, e := range SourceHashTable(rev) {
			if rev[e] != eps[table[b]] {
				t.Fatalf("n=%d: bucket %d depends on the endpoints' order", n, b)
			}
		}
	}
	if SourceHashTable(nil) != nil {
		t.Error("no endpoints: want no table")
	}
}

// TestSourceHashRemap: removing any one of n endpoints moves at most 1/n
// + 10 % of the buckets (the clients of the endpoint that went, and a few
// more), within one table size.
func TestSourceHashRemap(t *testing.T) {
	for n := 2; n <= 60; n++ {
		if SourceHashSize(n) != SourceHashSize(n-1) {
			continue // a new table size remaps everything, by design
		}
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			eps := hashEndpoints(n)
			table := SourceHashTable(eps)
			for gone := range n {
				rest := append(append([]*Endpoint{}, eps[:gone]...), eps[gone+1:]...)
				moved := 0
				for b, e := range SourceHashTable(rest) {
					if rest[e] != eps[table[b]] {
						moved++
					}
				}
				if got, limit := float64(moved)/float64(len(table)), 1/float64(n)+0.10; got > limit {
					t.Errorf("removing endpoint %d of %d moved %.3f of the clients, want <= %.3f", gone, n, got, limit)
				}
			}
		})
	}
}

func BenchmarkSourceHashTable(b *testing.B) {
	for _, n := range []int{10, 100} {
		eps := hashEndpoints(n)
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			for b.Loop() {
				SourceHashTable(eps)
			}
		})
	}
}
