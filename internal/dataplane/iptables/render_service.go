package iptables

import (
	"hash/maphash"
	"strconv"

	"github.com/kproxy/kproxy/internal/model"
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

// sumRules is a 64-bit hash of the rules, each ended by a newline, seeded
// per process: rules are made from API objects, and an unseeded hash would
// let someone craft a change whose chain sums like the written one.
func sumRules(rules []string) uint64 {
	var h maphash.Hash
	h.SetSeed(sumSeed)
	for _, r := range rules {
		h.WriteString(r)
		h.WriteByte('\n')
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
	rule         string
}

// svcCtx is the per-port view upstream's rules are derived from.
type svcCtx struct {
	sp      *model.ServicePort
	name    string // "ns/name:port"
	proto   string // tcp, udp, sctp
	ch      portChains
	match   string // "-m tcp -p tcp"
	hasEPs  bool
	hasInt  bool   // internal traffic has endpoints
	hasExt  bool   // external traffic has endpoints
	intTo   string // chain for internal traffic
	extPol  string // policy chain for external traffic
	lbTo    string // chain for load-balancer traffic
	useFW   bool
	filtTgt string // target of filter rules for internal traffic: REJECT or DROP
	filtCmt string
	extTgt  string
	extCmt  string
	chains  map[string]*Chain
	order   []string
	refs    map[string]bool // port chains rules jump to
	eps     map[*model.Endpoint]epNames
}

// epNames caches what rules say about one endpoint.
type epNames struct {
	str   string // "ip:port"
	chain string // KUBE-SEP-...
}

func (s *svcCtx) ep(ep *model.Endpoint) epNames {
	if n, ok := s.eps[ep]; ok {
		return n
	}
	str := ep.String()
	n := epNames{str: str, chain: prefixSEP + hash16(s.name+s.proto+str)}
	s.eps[ep] = n
	return n
}

func (r *renderer) newSvcCtx(sp *model.ServicePort) *svcCtx {
	s := &svcCtx{sp: sp, name: portName(sp.ID), proto: protoLower(sp.Protocol), ch: chainsOf(sp.ID),
		hasEPs: sp.HasEndpoints, chains: map[string]*Chain{}, refs: map[string]bool{}, eps: map[*model.Endpoint]epNames{}}
	s.match = "-m " + s.proto + " -p " + s.proto
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
		s.filtCmt = comment(s.name + " has no endpoints")
		s.extCmt = s.filtCmt
	default:
		s.filtTgt, s.filtCmt = "DROP", comment(s.name+" has no local endpoints")
		s.extTgt, s.extCmt = s.filtTgt, s.filtCmt
	}
	return s
}

// rejectTarget is the REJECT for a Service without endpoints. TCP gets a
// reset, as kproxy's nftables mode does: a TCP client acts on an ICMPv6
// error only at its first SYN retransmit (about 1 s later), which a client
// cannot tell from a dropped SYN. Other protocols get the ICMP default.
func rejectTarget(proto string) string {
	if proto == "tcp" {
		return "REJECT --reject-with tcp-reset"
	}
	return "REJECT"
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

func (s *svcCtx) add(chain string, rule string) { c := s.chain(chain); c.Rules = append(c.Rules, rule) }

// dst is the match for one frontend address and the service port.
func (s *svcCtx) dst(ip string, port uint16) string {
	return s.match + " -d " + ip + " --dport " + strconv.Itoa(int(port))
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

func natEntry(chain string, key dispatchKey, rule string) entry {
	return entry{table: tableNAT, chain: chain, key: key, rule: rule}
}

func filterEntry(chain, rule string) entry {
	return entry{table: tableFilter, chain: chain, rule: rule}
}

// clusterIP captures the cluster IP, or rejects/drops it in filter, and
// marks off-cluster traffic for masquerade.
func (r *renderer) clusterIP(s *svcCtx, pr *portRules) {
	sp := s.sp
	if !sp.ClusterIP.IsValid() {
		return
	}
	ip := sp.ClusterIP.String()
	cmt := comment(s.name + " cluster IP")
	if !s.hasInt {
		pr.entries = append(pr.entries, filterEntry(chainServices, s.filtCmt+" "+s.dst(ip, sp.Port)+" -j "+s.filtTgt))
		return
	}
	pr.entries = append(pr.entries, natEntry(chainServices, addrKey(sp.ClusterIP), cmt+" "+s.dst(ip, sp.Port)+" -j "+s.intTo))
	s.refs[s.intTo] = true
	switch {
	case r.masqAll:
		s.add(s.intTo, cmt+" "+s.dst(ip, sp.Port)+" -j "+chainMarkMasq)
	case r.ifNotLocal != "":
		s.add(s.intTo, cmt+" "+s.dst(ip, sp.Port)+" "+r.ifNotLocal+" -j "+chainMarkMasq)
	}
}

// externalIPs captures spec.externalIPs.
func (r *renderer) externalIPs(s *svcCtx, pr *portRules) {
	for _, a := range s.sp.ExternalIPs {
		m := s.dst(a.String(), s.sp.Port)
		if s.hasEPs {
			pr.entries = append(pr.entries, natEntry(chainServices, addrKey(a), comment(s.name+" external IP")+" "+m+" -j "+s.ch.ext))
		}
		if !s.hasExt {
			pr.entries = append(pr.entries, filterEntry(chainExternalServices, s.extCmt+" "+m+" -j "+s.extTgt))
		}
	}
}

// loadBalancer captures load-balancer ingress IPs, through KUBE-FW when
// loadBalancerSourceRanges restrict them.
func (r *renderer) loadBalancer(s *svcCtx, pr *portRules) {
	for _, a := range s.sp.LoadBalancerIPs {
		m := s.dst(a.String(), s.sp.Port)
		if s.hasEPs {
			pr.entries = append(pr.entries, natEntry(chainServices, addrKey(a), comment(s.name+" loadbalancer IP")+" "+m+" -j "+s.lbTo))
		}
		if s.useFW {
			pr.entries = append(pr.entries, filterEntry(chainProxyFirewall,
				comment(s.name+" traffic not accepted by "+s.ch.fw)+" "+m+" -j DROP"))
		}
	}
	if s.hasExt {
		return
	}
	for _, a := range s.sp.LoadBalancerIPs {
		pr.entries = append(pr.entries, filterEntry(chainExternalServices, s.extCmt+" "+s.dst(a.String(), s.sp.Port)+" -j "+s.extTgt))
	}
}

// nodePort captures the NodePort on the node's addresses.
func (r *renderer) nodePort(s *svcCtx, pr *portRules) {
	np := s.sp.NodePort
	if np == 0 {
		return
	}
	port := strconv.Itoa(int(np))
	if s.hasEPs {
		pr.entries = append(pr.entries, natEntry(chainNodePorts, portKey(s.proto, np),
			comment(s.name)+" "+s.match+" --dport "+port+" -j "+s.ch.ext))
	}
	if !s.hasExt {
		pr.entries = append(pr.entries, filterEntry(chainExternalServices,
			s.extCmt+" -m addrtype --dst-type LOCAL "+s.match+" --dport "+port+" -j "+s.extTgt))
	}
}

// healthCheck accepts the health-check node port in filter, endpoints or not.
func (r *renderer) healthCheck(s *svcCtx, pr *portRules) {
	if hc := s.sp.HealthCheckNodePort; hc != 0 {
		pr.entries = append(pr.entries, filterEntry(chainNodePorts,
			comment(s.name+" health check node port")+" -m tcp -p tcp --dport "+strconv.Itoa(int(hc))+" -j ACCEPT"))
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
		s.add(ext, comment("masquerade traffic for "+s.name+" external destinations")+" -j "+chainMarkMasq)
	} else {
		if r.ifLocal != "" {
			s.add(ext, comment("pod traffic for "+s.name+" external destinations")+" "+r.ifLocal+" -j "+s.ch.svc)
		}
		s.add(ext, comment("masquerade LOCAL traffic for "+s.name+" external destinations")+" -m addrtype --src-type LOCAL -j "+chainMarkMasq)
		s.add(ext, comment("route LOCAL traffic for "+s.name+" external destinations")+" -m addrtype --src-type LOCAL -j "+s.ch.svc)
		s.refs[s.ch.svc] = true
	}
	if s.hasExt {
		s.add(ext, "-j "+s.extPol)
		s.refs[s.extPol] = true
	}
}

// firewallChain is KUBE-FW: loadBalancerSourceRanges. What it does not
// send on is dropped by KUBE-PROXY-FIREWALL in filter.
func (r *renderer) firewallChain(s *svcCtx) {
	if !s.useFW {
		return
	}
	cmt := comment(s.name + " loadbalancer IP")
	fromNode := false
	for _, c := range s.sp.SourceRanges {
		s.add(s.ch.fw, cmt+" -s "+c.String()+" -j "+s.ch.ext)
		fromNode = fromNode || (r.nodeIP.IsValid() && c.Contains(r.nodeIP))
	}
	if fromNode {
		for _, a := range s.sp.LoadBalancerIPs {
			s.add(s.ch.fw, cmt+" -s "+a.String()+" -j "+s.ch.ext)
		}
	}
	s.add(s.ch.fw, comment("other traffic to "+s.name+" will be dropped by KUBE-PROXY-FIREWALL"))
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
	if s.sp.AffinityTimeout > 0 {
		secs := strconv.Itoa(int(s.sp.AffinityTimeout))
		for _, ep := range eps {
			n := s.ep(ep)
			c.Rules = append(c.Rules, r.epComment(s.name, " -> ", n.str)+"-m recent --name "+n.chain+" --rcheck --seconds "+secs+" --reap -j "+n.chain)
		}
	}
	for i, ep := range eps {
		n := s.ep(ep)
		stat := ""
		if k := len(eps) - i; k > 1 {
			stat = "-m statistic --mode random --probability " + probability(k) + " "
		}
		c.Rules = append(c.Rules, r.epComment(s.name, " -> ", n.str)+stat+"-j "+n.chain)
	}
}

// endpointChains are the KUBE-SEP chains: hairpin masquerade, affinity
// record, DNAT. The DNAT rule names its protocol without upstream's
// port-less "-m tcp": that match tests nothing, and at 10k Services × 10
// endpoints its 100k xtables instances cost ~0.6 s of a cold start.
func (r *renderer) endpointChains(s *svcCtx) {
	cmt := r.epComment(s.name, "", "")
	for _, ep := range s.sp.AllReachable {
		n := s.ep(ep)
		recent := ""
		if s.sp.AffinityTimeout > 0 {
			recent = "-m recent --name " + n.chain + " --set "
		}
		c := s.chain(n.chain)
		c.Rules = append(c.Rules,
			cmt+"-s "+ep.IP.String()+" -j "+chainMarkMasq,
			cmt+recent+"-p "+s.proto+" -j DNAT --to-destination "+n.str)
	}
}

// epComment is the comment a+b+c plus a space, or nothing in large
// clusters (upstream leaves these comments out past 1000 endpoints).
func (r *renderer) epComment(a, b, c string) string {
	if r.large {
		return ""
	}
	if b == "" {
		return "-m comment --comment " + a + " "
	}
	return `-m comment --comment "` + a + b + c + `" `
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
