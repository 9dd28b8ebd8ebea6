package iptables

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/kproxy/kproxy/internal/model"
)

// Dispatch: upstream puts one rule per frontend into nat KUBE-SERVICES and
// one per NodePort into KUBE-NODEPORTS, so the first packet of every
// connection walks O(Services) rules. kproxy keeps those chains (and the
// per-Service rules with their comments) but splits them into a two-level
// tree of sub-chains:
//
//	KUBE-SERVICES    -d 0.0.0.7/0.0.0.15   -j KUBE-SVC-IP-7    (low 4 bits of the destination)
//	KUBE-SVC-IP-7    -d 0.0.0.167/0.0.0.255 -g KUBE-SVC-IP-A7   (low 8 bits)
//	KUBE-SVC-IP-A7   <upstream's per-frontend rules for addresses ending in 0xA7>
//
//	KUBE-NODEPORTS          -p tcp --dport 29952:30207 -j KUBE-SVC-NP-TCP-75   (port >> 8)
//	KUBE-SVC-NP-TCP-75      -p tcp --dport 30000:30015 -g KUBE-SVC-NP-TCP-753  (port >> 4)
//	KUBE-SVC-NP-TCP-753     <upstream's per-NodePort rules>
//
// The buckets' KUBE-SVC- prefix is what lets upstream kube-proxy, started
// after kproxy, delete them (names.go).
//
// Non-contiguous masks and port ranges are plain xtables matches that both
// the legacy and the nf_tables backends support. Only non-empty buckets
// exist, so small clusters see a few short chains. A first packet now walks
// at most 16 + 16 dispatch rules plus one leaf (about Services/256 rules).

// dispatchKey says where a nat entry goes: by destination address
// (KUBE-SERVICES) or by protocol and destination port (KUBE-NODEPORTS).
type dispatchKey struct {
	addr  netip.Addr
	proto string
	port  uint16
}

func addrKey(a netip.Addr) dispatchKey           { return dispatchKey{addr: a.Unmap()} }
func portKey(proto string, p uint16) dispatchKey { return dispatchKey{proto: proto, port: p} }

// lowByte is the last byte of an address.
func lowByte(a netip.Addr) uint8 {
	b := a.AsSlice()
	return b[len(b)-1]
}

// dispatcher collects nat entries into buckets.
type dispatcher struct {
	fam       model.Family
	services  [256][]rule                  // by the destination's last byte
	nodePorts map[string]map[uint16][]rule // proto -> port>>4 -> rules
	// sizes of the buckets (reserve), so that each is allocated once
	servicesSize  [256]int
	nodePortsSize map[dispatchKey]int // proto and port>>4
}

func newDispatcher(fam model.Family) *dispatcher {
	return &dispatcher{fam: fam, nodePorts: map[string]map[uint16][]rule{},
		nodePortsSize: map[dispatchKey]int{}}
}

// reserve counts a nat entry that add will be given.
func (d *dispatcher) reserve(e *entry) {
	if e.chain == chainServices {
		d.servicesSize[lowByte(e.key.addr)]++
		return
	}
	d.nodePortsSize[portKey(e.key.proto, e.key.port>>4)]++
}

func (d *dispatcher) add(e *entry) {
	if e.chain == chainServices {
		b := lowByte(e.key.addr)
		if d.services[b] == nil {
			d.services[b] = make([]rule, 0, d.servicesSize[b])
		}
		d.services[b] = append(d.services[b], e.rule)
		return
	}
	m := d.nodePorts[e.key.proto]
	if m == nil {
		m = map[uint16][]rule{}
		d.nodePorts[e.key.proto] = m
	}
	b := e.key.port >> 4
	if m[b] == nil {
		m[b] = make([]rule, 0, d.nodePortsSize[portKey(e.key.proto, b)])
	}
	m[b] = append(m[b], e.rule)
}

// maskMatch matches addresses whose low bits (under mask) equal v.
func (d *dispatcher) maskMatch(v, mask uint8) *builder {
	return rb().dst(lowBitsAddr(d.fam == model.IPv6, v, mask))
}

// chains returns KUBE-SERVICES (ending in tail), KUBE-NODEPORTS and their
// buckets, in a deterministic order.
func (d *dispatcher) chains(tail []rule) []*Chain {
	top := &Chain{Name: chainServices}
	var subs []*Chain
	for mid := 0; mid < 16; mid++ {
		midChain := &Chain{Name: fmt.Sprintf("%s%X", prefixServicesBucket, mid)}
		for i := mid; i < len(d.services); i += 16 {
			b := uint8(i)
			if len(d.services[b]) == 0 {
				continue
			}
			leaf := fmt.Sprintf("%s%02X", prefixServicesBucket, b)
			midChain.Rules = append(midChain.Rules, d.maskMatch(b, 0xff).goTo(leaf))
			subs = append(subs, &Chain{Name: leaf, Rules: d.services[b]})
		}
		if len(midChain.Rules) > 0 {
			top.Rules = append(top.Rules, d.maskMatch(uint8(mid), 0xf).jump(midChain.Name))
			subs = append(subs, midChain)
		}
	}
	top.Rules = append(top.Rules, tail...)
	np, npSubs := d.nodePortChains()
	out := append([]*Chain{top, np}, subs...)
	return append(out, npSubs...)
}

func (d *dispatcher) nodePortChains() (*Chain, []*Chain) {
	top := &Chain{Name: chainNodePorts}
	var subs []*Chain
	for _, proto := range sortedKeys(d.nodePorts) {
		buckets := d.nodePorts[proto]
		p := ipProto(proto)
		var mid *Chain
		for _, b := range sortedKeys(buckets) {
			if mid == nil || mid.Name != nodePortBucket(proto, "%02X", b>>4) {
				mid = &Chain{Name: nodePortBucket(proto, "%02X", b>>4)}
				lo := b >> 4 << 8
				top.Rules = append(top.Rules, rb().portMatch(p).dport(lo, lo+255).jump(mid.Name))
				subs = append(subs, mid)
			}
			leaf := nodePortBucket(proto, "%03X", b)
			lo := b << 4
			mid.Rules = append(mid.Rules, rb().portMatch(p).dport(lo, lo+15).goTo(leaf))
			subs = append(subs, &Chain{Name: leaf, Rules: buckets[b]})
		}
	}
	return top, subs
}

func nodePortBucket(proto, format string, v uint16) string {
	return prefixNodePortsBucket + upper(proto) + "-" + fmt.Sprintf(format, v)
}

func upper(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c >= 'a' && c <= 'z' {
			b[i] = c - 'a' + 'A'
		}
	}
	return string(b)
}

func sortedKeys[K interface{ ~uint8 | ~uint16 | ~string }, V any](m map[K]V) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
