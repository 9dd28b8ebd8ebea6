package userspace

import (
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kproxy/kproxy/internal/model"
)

// backend is one endpoint of a frontend's pool. Its counters outlive pool
// updates that keep the endpoint (pools share backends by address).
type backend struct {
	addr netip.AddrPort
	// active is the relays open to it (least-connections reads it).
	active atomic.Int64
	// The metrics' counters: relays opened, those opened after another
	// endpoint's connect failed, failed connects, payload bytes.
	total, retries, connectErrors atomic.Uint64
	bytesIn, bytesOut             atomic.Uint64
	// downUntil is when a failed connect stops counting against it (unix
	// nanoseconds; 0: up), and failures how many in a row (the backoff
	// doubles with each).
	downUntil atomic.Int64
	failures  atomic.Int32
}

// up reports whether the backend may be tried at now.
func (b *backend) up(now time.Time) bool { return b.downUntil.Load() <= now.UnixNano() }

// failed marks the backend down for the backoff of its failure count:
// base, doubling, at most maxBackoff.
func (b *backend) failed(now time.Time, base time.Duration) {
	n := b.failures.Add(1)
	d := base << min(n-1, 6)
	d = min(d, maxBackoff)
	b.downUntil.Store(now.Add(d).UnixNano())
}

// succeeded clears the failure count.
func (b *backend) succeeded() {
	if b.failures.Load() != 0 {
		b.failures.Store(0)
		b.downUntil.Store(0)
	}
}

// maxBackoff bounds how long a failing endpoint is skipped.
const maxBackoff = time.Minute

// pool is the endpoints of one frontend and how to pick among them. It is
// immutable but for the backends' counters and the affinity table: an
// endpoint change makes a new pool.
type pool struct {
	sp       *model.ServicePort
	backends []*backend
	// table and seed are source-hash's (model.SourceHashTable of the
	// endpoints, in backends' order); nil for the other algorithms.
	table []int32
	seed  uint32
	// drop refuses every client; ranges, when set, those outside it.
	drop   bool
	ranges []netip.Prefix
	// next is round-robin's counter.
	next atomic.Uint64
	// affinity holds ClientIP session affinity (nil without).
	affinity *affinityTable
	// cluster is the pool of the clients nearby says are the node's own
	// (externalTrafficPolicy Local's short-circuit); nil without.
	cluster *pool
	nearby  func(netip.Addr) bool
}

// forClient is the pool that serves client: cluster for the node and its
// pods under externalTrafficPolicy Local, else p.
func (p *pool) forClient(client netip.Addr) *pool {
	if p.cluster != nil && p.nearby(client) {
		return p.cluster
	}
	return p
}

// admits says whether the frontend takes client's traffic.
func (p *pool) admits(client netip.Addr) bool {
	if p.drop {
		return false
	}
	if len(p.ranges) == 0 {
		return true
	}
	for _, r := range p.ranges {
		if r.Contains(client) {
			return true
		}
	}
	return false
}

// pick returns the backends to try for a connection from client, in
// order: the first by the algorithm (or the client's affinity), then the
// others that are up, so a failed connect moves on at once. Backends in
// backoff come last, in case every one is.
func (p *pool) pick(client netip.Addr, now time.Time) []*backend {
	n := len(p.backends)
	if n == 0 {
		return nil
	}
	first := -1
	if p.affinity != nil {
		if b, ok := p.affinity.get(client, now); ok {
			for i, be := range p.backends {
				if be.addr == b && be.up(now) {
					first = i
				}
			}
		}
	}
	if first < 0 {
		first = p.choose(client, now)
	}
	out := make([]*backend, 0, n)
	out = append(out, p.backends[first])
	var down []*backend
	for k := 1; k < n; k++ {
		b := p.backends[(first+k)%n]
		if b.up(now) {
			out = append(out, b)
		} else {
			down = append(down, b)
		}
	}
	return append(out, down...)
}

// choose is the algorithm's pick among the backends that are up (any
// backend when none is).
func (p *pool) choose(client netip.Addr, now time.Time) int {
	n := len(p.backends)
	switch p.sp.Balancing {
	case model.BalanceRoundRobin:
		start := int(p.next.Add(1)-1) % n
		for k := range n {
			if i := (start + k) % n; p.backends[i].up(now) {
				if k > 0 {
					p.next.Add(uint64(k))
				}
				return i
			}
		}
		return start
	case model.BalanceLeastConnections:
		best, bestN := -1, int64(0)
		start := int(p.next.Add(1)-1) % n // ties go round
		for k := range n {
			i := (start + k) % n
			b := p.backends[i]
			if !b.up(now) {
				continue
			}
			if a := b.active.Load(); best < 0 || a < bestN {
				best, bestN = i, a
			}
		}
		if best >= 0 {
			return best
		}
		return start
	case model.BalanceSourceHash:
		return model.SourceHashIndex(p.table, p.seed, client)
	}
	i := rand.IntN(n)
	for k := range n {
		if j := (i + k) % n; p.backends[j].up(now) {
			return j
		}
	}
	return i
}

// affinityTable is ClientIP session affinity: a client's endpoint for
// timeout after its last new connection.
type affinityTable struct {
	timeout time.Duration
	mu      sync.Mutex
	m       map[netip.Addr]affinityEntry
}

type affinityEntry struct {
	to      netip.AddrPort
	expires time.Time
}

// maxAffinityEntries bounds the table; past it, expired entries are
// dropped, and if none is, the table starts over.
const maxAffinityEntries = 1 << 16

func (a *affinityTable) get(client netip.Addr, now time.Time) (netip.AddrPort, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	e, ok := a.m[client]
	if !ok || now.After(e.expires) {
		return netip.AddrPort{}, false
	}
	return e.to, true
}

func (a *affinityTable) set(client netip.Addr, to netip.AddrPort, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.m) >= maxAffinityEntries {
		for k, e := range a.m {
			if now.After(e.expires) {
				delete(a.m, k)
			}
		}
		if len(a.m) >= maxAffinityEntries {
			a.m = map[netip.Addr]affinityEntry{}
		}
	}
	a.m[client] = affinityEntry{to: to, expires: now.Add(a.timeout)}
}

// newPool makes the pool of spec, reusing the backends (and so the
// counters) of prev that remain, and prev's affinity table when the
// timeout is the same.
func newPool(spec frontendSpec, prev *pool) *pool {
	p := poolOf(spec, prev)
	if spec.cluster != nil {
		var prevCluster *pool
		if prev != nil {
			prevCluster = prev.cluster
		}
		// The source ranges hold for the node and its pods too.
		p.cluster = poolOf(frontendSpec{sp: spec.sp, eps: spec.cluster, ranges: spec.ranges}, prevCluster)
		p.nearby = spec.nearby
	}
	return p
}

// poolOf is newPool without the short-circuit.
func poolOf(spec frontendSpec, prev *pool) *pool {
	sp, eps := spec.sp, spec.eps
	p := &pool{sp: sp, drop: spec.drop, ranges: spec.ranges}
	if sp.Balancing == model.BalanceSourceHash {
		p.table, p.seed = model.SourceHashTable(eps), sp.SourceHashSeed()
	}
	old := map[netip.AddrPort]*backend{}
	if prev != nil {
		for _, b := range prev.backends {
			old[b.addr] = b
		}
		p.next.Store(prev.next.Load())
	}
	for _, ep := range eps {
		b := old[ep.AddrPort()]
		if b == nil {
			b = &backend{addr: ep.AddrPort()}
		}
		p.backends = append(p.backends, b)
	}
	if sp.AffinityTimeout > 0 {
		timeout := time.Duration(sp.AffinityTimeout) * time.Second
		if prev != nil && prev.affinity != nil && prev.affinity.timeout == timeout {
			p.affinity = prev.affinity
		} else {
			p.affinity = &affinityTable{timeout: timeout, m: map[netip.Addr]affinityEntry{}}
		}
	}
	return p
}
