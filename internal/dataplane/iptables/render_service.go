package iptables

import (
	"hash/maphash"
	"net/netip"
	"slices"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/nfacct"
)

// portRules is what one service port contributes: its own nat chains and
// its rules in the shared chains. Once written, a port keeps only sums of
// its chains (compact): syncs need to know which chains changed, not
// their text, which at 10k Services is ~55 MB.
type portRules struct {
	nat     []*Chain
	entries []entry
	sums    []chainSum // nat's chains, set by compact
	rules   int        // how many rules nat has
}

// chainSum stands for a chain whose text is no longer kept.
type chainSum struct {
	name string
	sum  uint64
}

// compact replaces the port's chains by their sums; a compact port's
// chains are only compared, never written again.
func (pr *portRules) compact() {
	if pr.nat == nil {
		return
	}
	pr.sums, pr.rules = make([]chainSum, len(pr.nat)), 0
	for i, c := range pr.nat {
		pr.sums[i] = chainSum{c.Name, sumRules(c.Rules)}
		pr.rules += len(c.Rules)
	}
	pr.nat = nil
}

// sumRules is a 64-bit hash of the rules' text, each ended by a newline,
// seeded per process: rules are made from API objects, and an unseeded
// hash would let someone craft a change whose chain sums like the written
// one.
func sumRules(rules []rule) uint64 {
	var h maphash.Hash
	h.SetSeed(sumSeed)
	var buf [256]byte
	for i := range rules {
		h.Write(append(rules[i].appendText(buf[:0]), '\n'))
	}
	return h.Sum64()
}

var sumSeed = maphash.MakeSeed()

// entry is one rule of a service port in a shared chain. nat entries are
// dispatched by destination (see dispatch.go); filter entries are kept in
// order in their chain.
type entry struct {
	table, chain string
	key          dispatchKey
	rule         rule
}

// svcCtx is the per-port view upstream's rules are derived from.
type svcCtx struct {
	sp      *model.ServicePort
	name    string // "ns/name:port"
	proto   string // tcp, udp, sctp
	protoN  uint8  // its number
	ch      portChains
	hasEPs  bool
	hasInt  bool   // internal traffic has endpoints
	hasExt  bool   // external traffic has endpoints
	intTo   string // chain for internal traffic
	extPol  string // policy chain for external traffic
	lbTo    string // chain for load-balancer traffic
	useFW   bool
	filtTgt target // target of filter rules for internal traffic: REJECT or DROP
	filtCmt string
	extTgt  target
	extCmt  string
	chains  map[string]*Chain
	order   []string
	refs    map[string]bool // port chains rules jump to
	large   bool            // no per-endpoint comments (renderer.large)
	eps     map[*model.Endpoint]epNames
}

// epNames caches what rules say about one endpoint.
type epNames struct {
	ap    netip.AddrPort
	str   string // "ip:port"
	chain string // KUBE-SEP-...
	cmt   string // "ns/name:port -> ip:port"; "" in large clusters
}

func (s *svcCtx) ep(ep *model.Endpoint) epNames {
	if n, ok := s.eps[ep]; ok {
		return n
	}
	ap := ep.AddrPort()
	str := ap.String()
	n := epNames{ap: ap, str: str, chain: prefixSEP + hash16(s.name+s.proto+str)}
	if !s.large {
		n.cmt = s.name + " -> " + str
	}
	s.eps[ep] = n
	return n
}

func (r *renderer) newSvcCtx(sp *model.ServicePort) *svcCtx {
	s := &svcCtx{sp: sp, name: portName(sp.ID), proto: protoLower(sp.Protocol), ch: chainsOf(sp.ID),
		hasEPs: sp.HasEndpoints, large: r.large, chains: map[string]*Chain{}, refs: map[string]bool{}, eps: map[*model.Endpoint]epNames{}}
	s.protoN = ipProto(s.proto)
	s.hasInt, s.intTo = s.hasEPs, s.ch.svc
	if sp.InternalPolicyLocal {
		s.intTo, s.hasInt = s.ch.svl, s.hasEPs && len(sp.LocalEndpoints) > 0
	}
	s.hasExt, s.extPol = s.hasEPs, s.ch.svc
	if sp.ExternalPolicyLocal {
		s.extPol, s.hasExt = s.ch.svl, s.hasEPs && len(sp.LocalEndpoints) > 0
	}
	s.lbTo = s.ch.ext
	s.useFW = s.hasEPs && len(sp.LoadBalancerIPs) > 0 && len(sp.SourceRanges) > 0
	if s.useFW {
		s.lbTo = s.ch.fw
	}
	switch {
	case !s.hasEPs:
		s.filtTgt = rejectTarget(s.proto)
		s.extTgt = s.filtTgt
		s.filtCmt = s.name + " has no endpoints"
		s.extCmt = s.filtCmt
	default:
		s.filtTgt, s.filtCmt = target{kind: targetDrop}, s.name+" has no local endpoints"
		s.extTgt, s.extCmt = s.filtTgt, s.filtCmt
	}
	return s
}

// rejectTarget is the REJECT for a Service without endpoints. TCP gets a
// reset, as kproxy's nftables mode does: a TCP client acts on an ICMPv6
// error only at its first SYN retransmit (about 1 s later), which a client
// cannot tell from a dropped SYN. Other protocols get the ICMP default.
func rejectTarget(proto string) target {
	if proto == "tcp" {
		return target{kind: targetRejectTCPReset}
	}
	return target{kind: targetReject}
}

// chain returns the port's chain called name, creating it on first use.
func (s *svcCtx) chain(name string) *Chain {
	c := s.chains[name]
	if c == nil {
		c = &Chain{Name: name}
		s.chains[name] = c
		s.order = append(s.order, name)
	}
	return c
}

func (s *svcCtx) add(chain string, r rule) { c := s.chain(chain); c.Rules = append(c.Rules, r) }

// frontend is a rule commented cmt matching one frontend address and the
// service port.
func (s *svcCtx) frontend(cmt string, ip netip.Addr, port uint16) *builder {
	return rb().comment(cmt).portMatch(s.protoN).dst(bareAddr(ip)).dport(port, port)
}

// nodePortMatch is a rule commented cmt matching the node port on local
// addresses (with local) or any.
func (s *svcCtx) nodePortMatch(cmt string, local bool) *builder {
	b := rb().comment(cmt)
	if local {
		b.dstType(addrLocal)
	}
	return b.portMatch(s.protoN).dport(s.sp.NodePort, s.sp.NodePort)
}

// port renders one service port, one feature per function.
func (r *renderer) port(sp *model.ServicePort) *portRules {
	s := r.newSvcCtx(sp)
	pr := &portRules{}
	r.clusterIP(s, pr)
	r.externalIPs(s, pr)
	r.loadBalancer(s, pr)
	r.nodePort(s, pr)
	r.healthCheck(s, pr)
	r.externalChain(s)
	r.firewallChain(s)
	r.policyChains(s)
	r.endpointChains(s)
	for _, name := range s.order {
		pr.nat = append(pr.nat, s.chains[name])
	}
	return pr
}

func natEntry(chain string, key dispatchKey, r rule) entry {
	return entry{table: tableNAT, chain: chain, key: key, rule: r}
}

func filterEntry(chain string, r rule) entry {
	return entry{table: tableFilter, chain: chain, rule: r}
}

// clusterIP captures the cluster IP, or rejects/drops it in filter, and
// marks off-cluster traffic for masquerade.
func (r *renderer) clusterIP(s *svcCtx, pr *portRules) {
	sp := s.sp
	if !sp.ClusterIP.IsValid() {
		return
	}
	ip := sp.ClusterIP
	cmt := s.name + " cluster IP"
	if !s.hasInt {
		pr.entries = append(pr.entries, filterEntry(chainServices, s.frontend(s.filtCmt, ip, sp.Port).to(s.filtTgt)))
		return
	}
	pr.entries = append(pr.entries, natEntry(chainServices, addrKey(ip), s.frontend(cmt, ip, sp.Port).jump(s.intTo)))
	s.refs[s.intTo] = true
	switch {
	case r.masqAll:
		s.add(s.intTo, s.frontend(cmt, ip, sp.Port).jump(chainMarkMasq))
	case r.local.known():
		s.add(s.intTo, s.frontend(cmt, ip, sp.Port).not().local(r.local).jump(chainMarkMasq))
	}
}

// externalIPs captures spec.externalIPs.
func (r *renderer) externalIPs(s *svcCtx, pr *portRules) {
	for _, a := range s.sp.ExternalIPs {
		if s.hasEPs {
			pr.entries = append(pr.entries, natEntry(chainServices, addrKey(a), s.frontend(s.name+" external IP", a, s.sp.Port).jump(s.ch.ext)))
		}
		if !s.hasExt {
			pr.entries = append(pr.entries, filterEntry(chainExternalServices, s.frontend(s.extCmt, a, s.sp.Port).to(s.extTgt)))
		}
	}
}

// loadBalancer captures load-balancer ingress IPs, through KUBE-FW when
// loadBalancerSourceRanges restrict them.
func (r *renderer) loadBalancer(s *svcCtx, pr *portRules) {
	for _, a := range s.sp.LoadBalancerIPs {
		if s.hasEPs {
			pr.entries = append(pr.entries, natEntry(chainServices, addrKey(a), s.frontend(s.name+" loadbalancer IP", a, s.sp.Port).jump(s.lbTo)))
		}
		if s.useFW {
			pr.entries = append(pr.entries, filterEntry(chainProxyFirewall,
				s.frontend(s.name+" traffic not accepted by "+s.ch.fw, a, s.sp.Port).drop()))
		}
	}
	if s.hasExt {
		return
	}
	for _, a := range s.sp.LoadBalancerIPs {
		pr.entries = append(pr.entries, filterEntry(chainExternalServices, s.frontend(s.extCmt, a, s.sp.Port).to(s.extTgt)))
	}
}

// nodePort captures the NodePort on the node's addresses.
func (r *renderer) nodePort(s *svcCtx, pr *portRules) {
	np := s.sp.NodePort
	if np == 0 {
		return
	}
	if s.hasEPs {
		if r.localhostNP && r.counters.LocalhostAccepted {
			// Upstream's count of NodePort packets to 127.0.0.0/8, on a
			// rule of their own that goes where the NodePort's goes.
			lo := rb().comment(s.name).portMatch(s.protoN).dst(prefixAddr(loopback4)).dport(np, np).
				nfacct(nfacct.LocalhostNodePortsAccepted).jump(s.ch.ext)
			pr.entries = append(pr.entries, natEntry(chainNodePorts, portKey(s.proto, np), lo))
		}
		pr.entries = append(pr.entries, natEntry(chainNodePorts, portKey(s.proto, np), s.nodePortMatch(s.name, false).jump(s.ch.ext)))
	}
	if !s.hasExt {
		pr.entries = append(pr.entries, filterEntry(chainExternalServices, s.nodePortMatch(s.extCmt, true).to(s.extTgt)))
	}
}

// healthCheck accepts the health-check node port in filter, endpoints or not.
func (r *renderer) healthCheck(s *svcCtx, pr *portRules) {
	if hc := s.sp.HealthCheckNodePort; hc != 0 {
		pr.entries = append(pr.entries, filterEntry(chainNodePorts,
			rb().comment(s.name+" health check node port").portMatch(unix.IPPROTO_TCP).dport(hc, hc).accept()))
	}
}

// externalChain is KUBE-EXT: masquerade for Cluster policy; for Local
// policy, pods and the host short-circuit to the cluster chain.
func (r *renderer) externalChain(s *svcCtx) {
	if !s.hasEPs || !s.sp.ExternallyAccessible() {
		return
	}
	ext := s.ch.ext
	if !s.sp.ExternalPolicyLocal {
		s.add(ext, rb().comment("masquerade traffic for "+s.name+" external destinations").jump(chainMarkMasq))
	} else {
		if r.local.known() {
			s.add(ext, rb().comment("pod traffic for "+s.name+" external destinations").local(r.local).jump(s.ch.svc))
		}
		s.add(ext, rb().comment("masquerade LOCAL traffic for "+s.name+" external destinations").srcType(addrLocal).jump(chainMarkMasq))
		s.add(ext, rb().comment("route LOCAL traffic for "+s.name+" external destinations").srcType(addrLocal).jump(s.ch.svc))
		s.refs[s.ch.svc] = true
	}
	if s.hasExt {
		s.add(ext, rb().jump(s.extPol))
		s.refs[s.extPol] = true
	}
}

// firewallChain is KUBE-FW: loadBalancerSourceRanges. What it does not
// send on is dropped by KUBE-PROXY-FIREWALL in filter.
func (r *renderer) firewallChain(s *svcCtx) {
	if !s.useFW {
		return
	}
	cmt := s.name + " loadbalancer IP"
	fromNode := false
	for _, c := range s.sp.SourceRanges {
		s.add(s.ch.fw, rb().comment(cmt).src(prefixAddr(c)).jump(s.ch.ext))
		fromNode = fromNode || (r.nodeIP.IsValid() && c.Contains(r.nodeIP))
	}
	if fromNode {
		for _, a := range s.sp.LoadBalancerIPs {
			s.add(s.ch.fw, rb().comment(cmt).src(bareAddr(a)).jump(s.ch.ext))
		}
	}
	s.add(s.ch.fw, rb().comment("other traffic to "+s.name+" will be dropped by KUBE-PROXY-FIREWALL").none())
}

// policyChains are KUBE-SVC (Cluster policy) and KUBE-SVL (Local policy):
// affinity first, then a random choice among the endpoints.
func (r *renderer) policyChains(s *svcCtx) {
	sp := s.sp
	// Upstream's UsesClusterEndpoints: ETP=Local still needs the cluster
	// chain for short-circuited pod and host traffic.
	usesCluster := !sp.InternalPolicyLocal || sp.ExternallyAccessible()
	if (usesCluster && len(sp.ClusterEndpoints) > 0) || s.refs[s.ch.svc] {
		r.balance(s, s.ch.svc, sp.ClusterEndpoints)
	}
	if (sp.UsesLocalEndpoints() && len(sp.LocalEndpoints) > 0) || s.refs[s.ch.svl] {
		r.balance(s, s.ch.svl, sp.LocalEndpoints)
	}
}

// balance fills a policy chain with affinity and load-balancing rules.
func (r *renderer) balance(s *svcCtx, chain string, eps []*model.Endpoint) {
	c := s.chain(chain)
	n := len(eps)
	if s.sp.AffinityTimeout > 0 {
		n *= 2
	}
	c.Rules = slices.Grow(c.Rules, n) // rules are large: no regrowth copies
	if s.sp.AffinityTimeout > 0 {
		for _, ep := range eps {
			n := s.ep(ep)
			check := recentMatch{name: n.chain, seconds: uint32(s.sp.AffinityTimeout), ops: recentRcheck | recentReap}
			c.Rules = append(c.Rules, s.epRule(n.cmt).recent(check).jump(n.chain))
		}
	}
	for i, ep := range eps {
		n := s.ep(ep)
		b := s.epRule(n.cmt)
		if k := len(eps) - i; k > 1 {
			// Rule i sees the connections the rules before it let
			// through: 1 in k at random, or (round-robin) every k-th
			// of them, which takes the endpoints exactly in turn.
			if s.sp.Balancing == model.BalanceRoundRobin {
				b.everyNth(k)
			} else {
				b.oneIn(k)
			}
		}
		c.Rules = append(c.Rules, b.jump(n.chain))
	}
}

// endpointChains are the KUBE-SEP chains: hairpin masquerade, affinity
// record, DNAT. The DNAT rule names its protocol without upstream's
// port-less "-m tcp": that match tests nothing, and at 10k Services × 10
// endpoints its 100k xtables instances cost ~0.6 s of a cold start.
func (r *renderer) endpointChains(s *svcCtx) {
	cmt := ""
	if !s.large {
		cmt = s.name
	}
	for _, ep := range s.sp.AllReachable {
		n := s.ep(ep)
		c := s.chain(n.chain)
		c.Rules = slices.Grow(c.Rules, 2)
		hairpin := s.epRule(cmt).src(bareAddr(ep.IP)).jump(chainMarkMasq)
		b := s.epRule(cmt)
		if s.sp.AffinityTimeout > 0 {
			b.recent(recentMatch{name: n.chain, ops: recentSet})
		}
		c.Rules = append(c.Rules, hairpin, b.proto(s.protoN).dnat(n.ap))
	}
}

// epRule starts a per-endpoint rule: commented cmt, or not commented in
// large clusters (cmt "": upstream leaves these comments out past 1000
// endpoints).
func (s *svcCtx) epRule(cmt string) *builder {
	if cmt == "" {
		return rb()
	}
	return rb().comment(cmt)
}

var probabilities = func() []string {
	p := make([]string, 64)
	for i := range p {
		p[i] = formatProbability(i)
	}
	return p
}()

func formatProbability(n int) string {
	if n == 0 {
		return ""
	}
	return strconv.FormatFloat(1/float64(n), 'f', 10, 64)
}

// probability is 1/n with ten decimals, as upstream writes it.
func probability(n int) string {
	if n < len(probabilities) {
		return probabilities[n]
	}
	return formatProbability(n)
}
