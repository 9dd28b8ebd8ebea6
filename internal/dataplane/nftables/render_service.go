package nftables

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kproxy/kproxy/internal/model"
)

// portCtx is what the feature functions of one service port share.
type portCtx struct {
	sp    *model.ServicePort
	ps    *portState
	proto string // tcp, udp, sctp
	human string // ns/name/proto/port, the readable part of names
	// affinity maps an endpoint to its key in the affinity set (ClientIP
	// affinity only).
	affinity map[netip.AddrPort]key
	// cluster and local are the policy chains; "" when not used.
	cluster, local string
	// ext is the chain external destinations go to; "" when not used.
	ext string
}

// port renders one service port: endpoint chains, then each frontend kind.
func (r *renderer) port(sp *model.ServicePort) *portState {
	proto := strings.ToLower(string(sp.Protocol))
	c := &portCtx{
		sp: sp, ps: &portState{Elems: r.elems[:0]}, proto: proto,
		human: sp.ID.Namespace + "/" + sp.ID.Name + "/" + proto + "/" + sp.ID.Port,
	}
	defer func() {
		r.elems = c.ps.Elems[:0]
		c.ps.Elems = slices.Clone(c.ps.Elems)
	}()
	r.affinityKeys(c)
	r.policyChains(c)
	r.hairpin(c)
	r.externalChain(c)
	r.clusterIP(c)
	r.externalIPs(c)
	r.loadBalancer(c)
	r.nodePort(c)
	return c.ps
}

// affinityKeys gives each reachable endpoint of a Service with ClientIP
// affinity its key in the shared affinity set: the client address and an id
// of (service port, endpoint). Two pairs sharing an id (a 32-bit hash) could
// only send a client to a valid endpoint of the right Service: each key is
// looked up in that endpoint's own rule.
func (r *renderer) affinityKeys(c *portCtx) {
	if c.sp.AffinityTimeout <= 0 {
		return
	}
	n := len(c.sp.AllReachable)
	c.affinity = make(map[netip.AddrPort]key, n)
	ids := make([]uint32, 0, n)
	parts := make([]keyPart, 2*n) // every key's two fields, one allocation
	var buf [64]byte
	for i, ep := range c.sp.AllReachable {
		id := affinityHash(c.human, ep, buf[:0])
		k := key(parts[2*i : 2*i+2 : 2*i+2])
		k[0], k[1] = keyPart{sel: r.saddr}, keyPart{mark: id}
		c.affinity[ep.AddrPort()] = k
		ids = append(ids, id)
	}
	slices.Sort(ids)
	c.ps.Affinity = slices.Compact(ids)
}

// affinityHash is the 32-bit FNV-1a hash of "HUMAN/ADDRESS/PORT", the
// address's colons written as dots, computed without allocating: it names a
// (service port, endpoint) pair in the affinity set, so it must not change
// between versions (TestAffinityHash).
func affinityHash(human string, ep *model.Endpoint, buf []byte) uint32 {
	buf = append(buf, '/')
	buf = ep.IP.AppendTo(buf)
	for i, c := range buf {
		if c == ':' {
			buf[i] = '.'
		}
	}
	buf = strconv.AppendUint(append(buf, '/'), uint64(ep.Port), 10)
	const offset32, prime32 = 2166136261, 16777619
	h := uint32(offset32)
	for i := range len(human) {
		h = (h ^ uint32(human[i])) * prime32
	}
	for _, c := range buf {
		h = (h ^ uint32(c)) * prime32
	}
	return h
}

// policyChains renders the chains that pick an endpoint for the Cluster and
// the Local traffic policy. They exist whether or not there are endpoints
// to pick (with none, the chain DNATs nothing and the no-endpoints sets
// reject or drop): an endpoint change then never adds or removes a chain.
func (r *renderer) policyChains(c *portCtx) {
	if c.sp.UsesClusterEndpoints() {
		c.cluster = r.endpointChain(c, "svc", c.sp.ClusterEndpoints)
	}
	if c.sp.UsesLocalEndpoints() {
		c.local = r.endpointChain(c, "loc", c.sp.LocalEndpoints)
	}
}

// endpointChain picks one of eps by the port's algorithm. Without affinity
// one rule does it, `numgen random mod SPAN offset BASE map
// @endpoint-ranges-…` (or numgen inc, or jhash), over the chain's block of
// a shared map: endpoint changes then touch map elements only. With
// affinity (or when the map has no block left), plain rules: known clients
// first go back to their endpoint, else rule i DNATs with probability
// 1/(M-i) or every (M-i)-th time (the last one always); source-hash with
// affinity is hashedChain.
func (r *renderer) endpointChain(c *portCtx, prefix string, eps []*model.Endpoint) string {
	if c.affinity == nil {
		if name, ok := r.mappedChain(c, prefix, eps); ok {
			return name
		}
		r.full = append(r.full, c.human)
	}
	var rules []rule
	for _, ep := range eps {
		if k, ok := c.affinity[ep.AddrPort()]; ok {
			// The update reads the key the lookup left in the
			// registers: two expressions fewer per endpoint.
			rules = append(rules, rule{lookup{key: k, set: setAffinity}, r.affinityUpdate(c, k, true), dnatTo{to: ep.AddrPort()}})
		}
	}
	if c.sp.Balancing == model.BalanceSourceHash && c.affinity != nil {
		if name, ok := r.hashedChain(c, prefix, eps, rules); ok {
			return name
		}
	}
	// Rule i takes 1 in m-i of the connections the rules before it let
	// through: at random, or (round-robin) every (m-i)-th of them, which
	// takes the endpoints exactly in turn.
	m := len(eps)
	for i, ep := range eps {
		var pick rule
		if i < m-1 {
			pick = rule{numgenZero{mod: uint32(m - i), inc: c.sp.Balancing == model.BalanceRoundRobin}}
		}
		rules = append(rules, append(pick, r.dnat(c, ep)...))
	}
	ch := &chain{Rules: rules}
	ch.Name = contentName(prefix, c.human, rules...)
	c.ps.Chains = append(c.ps.Chains, ch)
	return ch.Name
}

// hashedChain renders the policy chain of a source-hash port with session
// affinity: after the affinity rules (known clients), one rule per
// endpoint matches the clients whose bucket in the chain's block of an
// endpoint-ranges map is that endpoint's, records them and DNATs. The
// block index is part of the chain's name, as for mappedChain.
func (r *renderer) hashedChain(c *portCtx, prefix string, eps []*model.Endpoint, rules []rule) (string, bool) {
	return r.blockChain(c, prefix, eps, func(d dnatMap) []rule {
		for _, ep := range eps {
			rules = append(rules, append(rule{mapIs{m: d, to: ep.AddrPort()}}, r.dnat(c, ep)...))
		}
		return rules
	})
}

// mappedChain renders a policy chain whose endpoints are ranges of its
// block of an endpoint-ranges map; the block index is part of the chain's
// name (a restart recovers it from there).
func (r *renderer) mappedChain(c *portCtx, prefix string, eps []*model.Endpoint) (string, bool) {
	return r.blockChain(c, prefix, eps, func(d dnatMap) []rule {
		return []rule{{protoCmp{proto: c.proto}, d}}
	})
}

// blockChain gives the policy chain prefix of c a block of an
// endpoint-ranges map, fills it with eps (fillBlock) and renders the chain
// of the rules rules makes from the block's map DNAT; false when the map
// has no block left.
func (r *renderer) blockChain(c *portCtx, prefix string, eps []*model.Endpoint, rules func(dnatMap) []rule) (string, bool) {
	key := prefix + " " + c.human
	b, ok := r.slots.get(key, c.proto)
	if !ok {
		return "", false
	}
	rs := rules(r.fillBlock(c, key, b, eps))
	ch := &chain{Rules: rs, Name: contentName(prefix, c.human+blockSuffix(b), rs...)}
	c.ps.Chains = append(c.ps.Chains, ch)
	return ch.Name, true
}

// fillBlock puts eps into block b (of allocator key key) as the port's
// algorithm needs them and returns the map DNAT that picks among them.
func (r *renderer) fillBlock(c *portCtx, key string, b block, eps []*model.Endpoint) dnatMap {
	d := dnatMap{v6: r.v6, mod: blockSpan, offset: b.offset(), set: b.shard}
	var elems []rangeElem
	switch c.sp.Balancing {
	case model.BalanceRoundRobin:
		// One key per endpoint, taken in turn: the rule changes with the
		// endpoint count (a new chain), unlike random's.
		d.gen, d.mod = genInc, uint32(max(len(eps), 1))
		elems = blockKeys(b, len(eps))
	case model.BalanceSourceHash:
		table := model.SourceHashTable(eps)
		d.gen, d.mod, d.seed = genHash, uint32(model.SourceHashSize(len(eps))), c.sp.SourceHashSeed()
		var owners []int
		elems, owners = tableRuns(b, table)
		eps = permute(eps, owners)
	default:
		elems = blockRanges(b, len(eps))
	}
	for i := range elems {
		elems[i].ep = eps[i]
	}
	c.ps.Fills = append(c.ps.Fills, fill{key: key, b: b, elems: elems})
	return d
}

// permute returns eps[idx[0]], eps[idx[1]], ….
func permute(eps []*model.Endpoint, idx []int) []*model.Endpoint {
	out := make([]*model.Endpoint, len(idx))
	for i, j := range idx {
		out[i] = eps[j]
	}
	return out
}

// dnat are the statements sending a packet to ep (recording the client
// for affinity when the Service has it).
//
// Affinity rules carry no `meta l4proto` before the DNAT: the policy chain
// is reached only through maps keyed by the protocol, and the kernel pays
// for every expression of every rule it loads. At 10k Services × 100
// endpoints with 10 % affinity those two expressions per rule (200,000
// rules) were ~1 s of the kernel's 6 s commit (`KPROXY_SCALE=1
// KPROXY_SCALE_SIZES=10000 KPROXY_SCALE_ENDPOINTS=100 KPROXY_SCALE_AFFINITY=1
// go test -run 'TestPrivilegedScale$' -v ./internal/dataplane/nftables/`).
// The nft CLI wants the protocol before a port mapping, so it lists these
// rules but cannot parse them back (nor the affinity lookups).
func (r *renderer) dnat(c *portCtx, ep *model.Endpoint) rule {
	if k, ok := c.affinity[ep.AddrPort()]; ok {
		return rule{r.affinityUpdate(c, k, false), dnatTo{to: ep.AddrPort()}}
	}
	return rule{protoCmp{proto: c.proto}, dnatTo{to: ep.AddrPort()}}
}

// affinityUpdate records the client under key k for the Service's timeout;
// loaded says the rule's lookup left k in the registers.
func (r *renderer) affinityUpdate(c *portCtx, k key, loaded bool) setUpdate {
	return setUpdate{set: setAffinity, key: k, timeout: time.Duration(c.sp.AffinityTimeout) * time.Second, keyLoaded: loaded}
}

// hairpin lists local endpoints so that an endpoint reaching itself through
// the Service is masqueraded (else it would answer itself directly).
func (r *renderer) hairpin(c *portCtx) {
	n := 0
	for _, ep := range c.sp.AllReachable {
		if ep.IsLocal {
			n++
		}
	}
	if n == 0 {
		return
	}
	c.ps.Hairpin, c.ps.HairpinProto = make([]*model.Endpoint, 0, n), protoNumbers[c.proto]
	for _, ep := range c.sp.AllReachable {
		if ep.IsLocal {
			c.ps.Hairpin = append(c.ps.Hairpin, ep)
		}
	}
}

// externalChain renders the chain all external destinations (NodePort,
// external IPs, load-balancer IPs) go to: masquerade for the Cluster policy;
// for the Local policy keep the client IP, but send pods and the node itself
// to the cluster endpoints as upstream does. Like the policy chains it
// exists with or without endpoints.
func (r *renderer) externalChain(c *portCtx) {
	if !c.sp.ExternallyAccessible() {
		return
	}
	// Both policy chains a rule names here always exist for an externally
	// accessible port (UsesClusterEndpoints, UsesLocalEndpoints).
	var rules []rule
	target := c.cluster
	if c.sp.ExternalPolicyLocal {
		target = c.local
		if r.ifLocal != nil {
			rules = append(rules, rule{r.ifLocal, goTo(c.cluster)})
		}
		rules = append(rules, rule{fibLocal{saddr: true}, r.masq}, rule{fibLocal{saddr: true}, goTo(c.cluster)})
	} else {
		rules = append(rules, rule{r.masq})
	}
	rules = append(rules, rule{goTo(target)})
	ch := &chain{Rules: rules, Name: contentName("ext", c.human, rules...)}
	c.ps.Chains = append(c.ps.Chains, ch)
	c.ext = ch.Name
}

// addNoEndpoints puts a frontend's key in the reject set of a pair when the
// port has no endpoint at all, or the Cluster policy (local false) has
// none; in the drop set when the Local policy has no local endpoint; in
// neither when there is an endpoint to pick. The filter chains act on new
// connections that no policy chain DNATed.
func (c *portCtx) addNoEndpoints(local bool, reject, drop string, key string) {
	switch {
	case !c.sp.HasEndpoints, !local && len(c.sp.ClusterEndpoints) == 0:
		c.add(reject, key, "")
	case local && len(c.sp.LocalEndpoints) == 0:
		c.add(drop, key, "")
	}
}

// dstKey is the key "address . protocol . port" of a frontend.
func (c *portCtx) dstKey(ip netip.Addr) string {
	b := make([]byte, 0, 64)
	b = ip.AppendTo(b)
	b = append(append(append(b, fieldSep...), c.proto...), fieldSep...)
	return string(strconv.AppendUint(b, uint64(c.sp.Port), 10))
}

// addrPort is the map value "address . port" of an endpoint.
func addrPort(ip netip.Addr, port uint16) string {
	b := make([]byte, 0, 64)
	b = append(ip.AppendTo(b), fieldSep...)
	return string(strconv.AppendUint(b, uint64(port), 10))
}

func (c *portCtx) add(set, key, value string) {
	c.ps.Elems = append(c.ps.Elems, element{Set: set, Key: key, Value: value})
}

// clusterIP dispatches the cluster IP, or drops/rejects it.
func (r *renderer) clusterIP(c *portCtx) {
	if !c.sp.ClusterIP.IsValid() {
		return
	}
	c.add(setClusterIPs, c.sp.ClusterIP.String(), "")
	key := c.dstKey(c.sp.ClusterIP)
	target := c.cluster
	if c.sp.InternalPolicyLocal {
		target = c.local
	}
	c.add(mapServiceIPs, key, "goto "+target)
	c.addNoEndpoints(c.sp.InternalPolicyLocal, setServicesNoEndpoints, setServicesNoLocal, key)
}

// externalIPs dispatches spec.externalIPs to the external chain.
func (r *renderer) externalIPs(c *portCtx) {
	for _, ip := range c.sp.ExternalIPs {
		r.externalDest(c, ip)
	}
}

func (r *renderer) externalDest(c *portCtx, ip netip.Addr) {
	key := c.dstKey(ip)
	c.add(mapServiceIPs, key, "goto "+c.ext)
	c.addNoEndpoints(c.sp.ExternalPolicyLocal, setServicesNoEndpoints, setServicesNoLocal, key)
}

// loadBalancer dispatches load-balancer IPs and, with source ranges, sends
// new connections to them through a firewall chain first.
func (r *renderer) loadBalancer(c *portCtx) {
	for _, ip := range c.sp.LoadBalancerIPs {
		r.externalDest(c, ip)
	}
	if len(c.sp.LoadBalancerIPs) == 0 || len(c.sp.SourceRanges) == 0 {
		return
	}
	var allowed []netip.Prefix
	fromNode := false
	for _, p := range c.sp.SourceRanges {
		allowed = append(allowed, p.Masked())
		fromNode = fromNode || (r.nodeIP.IsValid() && p.Contains(r.nodeIP))
	}
	if fromNode {
		// A VIP configured on the node makes node traffic to it come from
		// the VIP itself.
		for _, ip := range c.sp.LoadBalancerIPs {
			allowed = append(allowed, netip.PrefixFrom(ip, ip.BitLen()))
		}
	}
	fw := rule{allowOnly{sel: r.saddr, allowed: allowed}}
	ch := &chain{Rules: []rule{fw}, Name: contentName("fw", c.human, fw)}
	c.ps.Chains = append(c.ps.Chains, ch)
	for _, ip := range c.sp.LoadBalancerIPs {
		c.add(mapFirewallIPs, c.dstKey(ip), "goto "+ch.Name)
	}
}

// nodePort dispatches the NodePort on node addresses.
func (r *renderer) nodePort(c *portCtx) {
	if c.sp.NodePort == 0 {
		return
	}
	key := c.proto + fieldSep + strconv.Itoa(int(c.sp.NodePort))
	c.add(mapServiceNodePorts, key, "goto "+c.ext)
	c.addNoEndpoints(c.sp.ExternalPolicyLocal, setNodePortsNoEndpoints, setNodePortsNoLocal, key)
}
