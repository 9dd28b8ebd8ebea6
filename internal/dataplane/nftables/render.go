package nftables

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables/expr"
	"sigs.k8s.io/knftables"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/model"
)

// Names of the fixed chains, sets and maps. Service-port chains get
// content-addressed names with a slash (see contentName).
const (
	chainFilterPreroutingPreDNAT = "filter-prerouting-pre-dnat"
	chainFilterOutputPreDNAT     = "filter-output-pre-dnat"
	chainFilterInput             = "filter-input"
	chainFilterForward           = "filter-forward"
	chainFilterOutput            = "filter-output"
	chainNATPrerouting           = "nat-prerouting"
	chainNATOutput               = "nat-output"
	chainNATPostrouting          = "nat-postrouting"

	chainServices        = "services"
	chainMasquerading    = "masquerading"
	chainFirewallCheck   = "firewall-check"
	chainServiceEPCheck  = "service-endpoints-check"
	chainNodePortEPCheck = "nodeport-endpoints-check"
	chainClusterIPsCheck = "cluster-ips-check"
	chainReject          = "reject-chain"
	mapServiceIPs        = "service-ips"
	mapServiceNodePorts  = "service-nodeports"
	// Frontends without endpoints: sets, not a verdict map, so that an
	// endpoint change never adds a goto element (which makes the kernel
	// re-validate the whole table).
	setServicesNoEndpoints  = "services-no-endpoints"
	setServicesNoLocal      = "services-no-local-endpoints"
	setNodePortsNoEndpoints = "nodeports-no-endpoints"
	setNodePortsNoLocal     = "nodeports-no-local-endpoints"
	mapFirewallIPs          = "firewall-ips"
	setClusterIPs           = "cluster-ips"
	// Not upstream's "nodeport-ips" (node addresses, no interval flag): a
	// set of the same name but another definition would make upstream's
	// first sync after a rollback fail.
	setNodePortIPs  = "nodeport-cidrs"
	setServiceCIDRs = "service-cidrs"
	setHairpin      = "hairpin-connections"
	mapEndpoints    = "endpoint-ranges"
	setAffinity     = "affinity"
)

// baseChains are the hooked chains; Drifted checks that they all exist.
var baseChains = []struct {
	name string
	spec baseSpec
}{
	{chainFilterPreroutingPreDNAT, baseSpec{knftables.FilterType, knftables.PreroutingHook, knftables.DNATPriority + "-10"}},
	{chainFilterOutputPreDNAT, baseSpec{knftables.FilterType, knftables.OutputHook, knftables.DNATPriority + "-10"}},
	{chainFilterInput, baseSpec{knftables.FilterType, knftables.InputHook, knftables.FilterPriority}},
	{chainFilterForward, baseSpec{knftables.FilterType, knftables.ForwardHook, knftables.FilterPriority}},
	{chainFilterOutput, baseSpec{knftables.FilterType, knftables.OutputHook, knftables.FilterPriority}},
	{chainNATPrerouting, baseSpec{knftables.NATType, knftables.PreroutingHook, knftables.DNATPriority}},
	{chainNATOutput, baseSpec{knftables.NATType, knftables.OutputHook, knftables.DNATPriority}},
	{chainNATPostrouting, baseSpec{knftables.NATType, knftables.PostroutingHook, knftables.SNATPriority}},
}

// renderer holds everything, derived from the configuration and the node,
// that the rules of one family depend on besides the service ports.
type renderer struct {
	fam      model.Family
	v6       bool
	ipX      string // "ip" or "ip6"
	addrType string // "ipv4_addr" or "ipv6_addr"
	// saddr and daddr are the family's address fields.
	saddr, daddr selector
	loopback     netip.Prefix // the loopback range, never a NodePort address
	masqMark     uint32
	// masq is the statement that marks a packet for masquerading.
	masq markSet
	// ifLocal and ifNotLocal match traffic from local pods; nil when the
	// detect-local mode gives nothing for this family.
	ifLocal, ifNotLocal stmt
	masqAll             bool
	nodeIP              netip.Addr
	// nodePortAll accepts NodePorts on every local address; otherwise only
	// local addresses in nodePortCIDRs (none: no NodePorts at all).
	nodePortAll   bool
	nodePortCIDRs []netip.Prefix
	// serviceCIDRs are this family's service IP ranges (non-overlapping).
	serviceCIDRs []netip.Prefix
	// slots places each policy chain's endpoints in the endpoint-ranges maps.
	slots *slotAlloc
	// full lists the ports whose endpoint-ranges map had no block left (they
	// got plain-rule chains).
	full []string
	// elems is where a port's elements are gathered before they are copied
	// out at their exact size (a full sync keeps 250k of them).
	elems []element
}

func newRenderer(cfg dataplane.Config, fam model.Family, node model.NodeInfo) *renderer {
	r := &renderer{fam: fam, ipX: "ip", addrType: "ipv4_addr", loopback: netip.MustParsePrefix("127.0.0.0/8"), masqAll: cfg.MasqueradeAll, slots: newSlotAlloc()}
	if fam == model.IPv6 {
		r.v6, r.ipX, r.addrType, r.loopback = true, "ip6", "ipv6_addr", netip.MustParsePrefix("::1/128")
	}
	r.saddr, r.daddr = addrSelectors(r.v6)
	r.masqMark = uint32(1) << uint(cfg.MasqueradeBit&31)
	r.masq = markSet{v: r.masqMark}
	r.ifLocal, r.ifNotLocal = localMatch(cfg, fam, node)
	for _, ip := range cfg.NodeIPs {
		if model.FamilyOf(ip) == fam && !r.nodeIP.IsValid() {
			r.nodeIP = ip.Unmap()
		}
	}
	r.nodePortAll, r.nodePortCIDRs = nodePortRange(cfg, fam, r.nodeIP)
	r.serviceCIDRs = familyCIDRs(cfg.ServiceCIDRs, fam)
	return r
}

// familyCIDRs returns the prefixes of one family, masked, without those
// inside another (interval set elements must not overlap).
func familyCIDRs(cidrs []netip.Prefix, fam model.Family) []netip.Prefix {
	var out []netip.Prefix
	for _, c := range cidrs {
		if c.IsValid() && model.FamilyOf(c.Addr()) == fam {
			out = append(out, c.Masked())
		}
	}
	return outermost(out)
}

// localMatch returns the matches for traffic from and not from local pods.
func localMatch(cfg dataplane.Config, fam model.Family, node model.NodeInfo) (stmt, stmt) {
	byCIDR := func(cidrs []netip.Prefix) (stmt, stmt) {
		saddr, _ := addrSelectors(fam == model.IPv6)
		for _, c := range cidrs {
			if model.FamilyOf(c.Addr()) == fam {
				return addrCmp{sel: saddr, p: c.Masked()}, addrCmp{sel: saddr, neg: true, p: c.Masked()}
			}
		}
		return nil, nil
	}
	switch cfg.LocalMode {
	case dataplane.LocalClusterCIDR:
		return byCIDR(cfg.ClusterCIDRs)
	case dataplane.LocalNodeCIDR:
		return byCIDR(node.PodCIDRs)
	case dataplane.LocalBridgeInterface:
		if cfg.BridgeInterface != "" {
			return iifname{name: cfg.BridgeInterface}, iifname{neg: true, name: cfg.BridgeInterface}
		}
	case dataplane.LocalInterfacePrefix:
		if cfg.InterfacePrefix != "" {
			return iifname{name: cfg.InterfacePrefix + "*"}, iifname{neg: true, name: cfg.InterfacePrefix + "*"}
		}
	}
	return nil, nil
}

// nodePortRange interprets nodePortAddresses for one family: empty (or a
// zero-length CIDR) means every local address; "primary" means the node IP.
func nodePortRange(cfg dataplane.Config, fam model.Family, nodeIP netip.Addr) (bool, []netip.Prefix) {
	if len(cfg.NodePortAddresses) == 0 {
		return true, nil
	}
	var cidrs []netip.Prefix
	for _, s := range cfg.NodePortAddresses {
		if s == "primary" {
			if nodeIP.IsValid() {
				cidrs = append(cidrs, netip.PrefixFrom(nodeIP, nodeIP.BitLen()))
			}
			continue
		}
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil || model.FamilyOf(p.Addr()) != fam {
			continue
		}
		if p.Bits() == 0 {
			return true, nil
		}
		cidrs = append(cidrs, p.Masked())
	}
	return false, outermost(cidrs)
}

// outermost drops prefixes inside (or equal to) another one: the elements
// of an interval set must not overlap.
func outermost(cidrs []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for i, p := range cidrs {
		inside := false
		for j, o := range cidrs {
			if i != j && o.Bits() <= p.Bits() && o.Contains(p.Addr()) && (o.Bits() < p.Bits() || j < i) {
				inside = true
				break
			}
		}
		if !inside {
			out = append(out, p)
		}
	}
	return out
}

// render returns the complete desired state of one family's table.
func render(cfg dataplane.Config, fs *model.FamilySnapshot, node model.NodeInfo) *desired {
	r := newRenderer(cfg, fs.Family, node)
	d := r.fixed()
	for _, sp := range fs.Ports {
		d.Ports[sp.ID] = r.port(sp)
	}
	return d
}

// fixed renders the sets, maps and chains that do not depend on Services.
func (r *renderer) fixed() *desired {
	d := &desired{Family: r.fam, Ports: map[model.PortID]*portState{}}
	d.Sets = r.fixedSets()
	for _, bc := range baseChains {
		d.Chains = append(d.Chains, &chain{Name: bc.name, Base: &bc.spec, Rules: baseRules(bc.name)})
	}
	d.Chains = append(d.Chains,
		&chain{Name: chainServices, Rules: r.servicesRules()},
		&chain{Name: chainMasquerading, Rules: r.masqueradingRules()},
		&chain{Name: chainFirewallCheck, Rules: []rule{{lookup{key: r.dstTuple(), set: mapFirewallIPs, vmap: true}}}},
		&chain{Name: chainServiceEPCheck, Rules: []rule{
			{lookup{key: r.dstTuple(), set: setServicesNoEndpoints}, goTo(chainReject)},
			{lookup{key: r.dstTuple(), set: setServicesNoLocal}, verdict{kind: expr.VerdictDrop}},
		}},
		&chain{Name: chainNodePortEPCheck, Rules: r.nodePortRules(
			rule{lookup{key: protoPort, set: setNodePortsNoEndpoints}, goTo(chainReject)},
			rule{lookup{key: protoPort, set: setNodePortsNoLocal}, verdict{kind: expr.VerdictDrop}})},
		&chain{Name: chainClusterIPsCheck, Rules: r.clusterIPsCheckRules()},
		// TCP gets a reset: a Linux client acts on an ICMPv6 unreachable
		// only at its first SYN retransmit (~1 s), on a reset at once.
		&chain{Name: chainReject, Rules: []rule{{protoCmp{proto: "tcp"}, reject{tcpReset: true}}, {reject{v6: r.v6}}}},
	)
	d.Elems = r.configElems()
	return d
}

// clusterIPsCheckRules handle new connections still addressed to a service
// IP after DNAT (none happened): an unknown port of a ClusterIP is rejected,
// any other address in the service ranges (not an allocated ClusterIP) is
// dropped, as upstream does. The second rule is there even without ranges
// (the set is then empty), so that a change of the ranges is a change of
// elements only.
func (r *renderer) clusterIPsCheckRules() []rule {
	return []rule{
		{lookup{key: key{{sel: r.daddr}}, set: setClusterIPs}, goTo(chainReject)},
		{lookup{key: key{{sel: r.daddr}}, set: setServiceCIDRs}, verdict{kind: expr.VerdictDrop}},
	}
}

// configElems are the elements of the sets filled from the configuration
// (isConfigSet), not from service ports.
func (r *renderer) configElems() []element {
	var out []element
	for _, c := range r.nodePortCIDRs {
		out = append(out, element{Set: setNodePortIPs, Key: c.String()})
	}
	for _, c := range r.serviceCIDRs {
		out = append(out, element{Set: setServiceCIDRs, Key: c.String()})
	}
	return out
}

// isConfigSet reports whether a fixed set is filled from the configuration:
// it is flushed and refilled by every full sync, never diffed.
func isConfigSet(name string) bool { return name == setNodePortIPs || name == setServiceCIDRs }

// affinitySetSize bounds the affinity set: a client flood cannot grow it
// past ~1M (client, endpoint) pairs; at the bound new clients simply get no
// affinity until entries time out. (The nft CLI's default, 65535, is what
// each of upstream's per-endpoint sets gets.)
const affinitySetSize = 1 << 20

// isDynamicSet names the sets the packet path fills (ClientIP affinity):
// kproxy creates them but never reads, diffs or flushes their elements.
func isDynamicSet(name string) bool { return name == setAffinity }

// knownSets are every set and map this version may create: the fixed ones
// and every endpoint-ranges map, for reading them back and encoding their
// elements.
func (r *renderer) knownSets() []*set { return append(r.fixedSets(), r.endpointSets()...) }

// endpointSets are all the endpoint-ranges maps there may be (see
// blockSpan), sharded per protocol (nft insists that the map's declared
// port type matches the rule's protocol match) and by hash (shardCount).
func (r *renderer) endpointSets() []*set {
	var out []*set
	for _, proto := range []string{"tcp", "udp", "sctp"} {
		for i := range shardCount[proto] {
			out = append(out, endpointSet(r.ipX, proto, endpointShard(proto, i)))
		}
	}
	return out
}

// endpointSet is the definition of the endpoint-ranges map name, one of
// proto's, in the family whose address match is ipX ("ip" or "ip6").
func endpointSet(ipX, proto, name string) *set {
	return &set{Name: name, IsMap: true,
		TypeOf:  "numgen random mod 1 : " + ipX + " daddr . " + proto + " dport",
		Flags:   []knftables.SetFlag{knftables.IntervalFlag},
		Comment: "endpoints of " + proto + " policy chains, by numgen range"}
}

// fixedSets are the sets and maps every table has. The endpoint-ranges
// maps are not among them: each exists only while some policy chain has a
// block in it (endpointMapOps, unusedMaps).
func (r *renderer) fixedSets() []*set {
	dstKey := r.addrType + " . inet_proto . inet_service"
	dst := dstKey + " : verdict"
	return []*set{
		{Name: setClusterIPs, Type: r.addrType, Comment: "active ClusterIPs"},
		{Name: setNodePortIPs, Type: r.addrType, Flags: []knftables.SetFlag{knftables.IntervalFlag}, Comment: "CIDRs whose local addresses accept NodePorts"},
		{Name: setServiceCIDRs, Type: r.addrType, Flags: []knftables.SetFlag{knftables.IntervalFlag}, Comment: "service IP ranges (ServiceCIDRs)"},
		{Name: setHairpin, Type: r.addrType + " . " + r.addrType + " . inet_proto . inet_service", Comment: "local endpoints reaching themselves through a Service"},
		{Name: mapServiceIPs, IsMap: true, Type: dst, Comment: "ClusterIP, external IP and load-balancer IP dispatch"},
		{Name: mapServiceNodePorts, IsMap: true, Type: "inet_proto . inet_service : verdict", Comment: "NodePort dispatch"},
		{Name: setServicesNoEndpoints, Type: dstKey, Comment: "service IP ports without endpoints: rejected"},
		{Name: setServicesNoLocal, Type: dstKey, Comment: "service IP ports of the Local policy without a local endpoint: dropped"},
		{Name: setNodePortsNoEndpoints, Type: "inet_proto . inet_service", Comment: "NodePorts without endpoints: rejected"},
		{Name: setNodePortsNoLocal, Type: "inet_proto . inet_service", Comment: "NodePorts of the Local policy without a local endpoint: dropped"},
		{Name: mapFirewallIPs, IsMap: true, Type: dst, Comment: "load-balancer IPs subject to loadBalancerSourceRanges"},
		r.affinitySet(),
	}
}

// affinitySet is the dynamic set of ClientIP affinity: one for every
// Service that has it, keyed by the client and a (service port, endpoint)
// id, with each element's timeout set by the rule that adds it. Per-endpoint
// sets, as upstream has, cost the kernel a linear search by name for each
// set, rule and element op: quadratic at scale (10k sets: ~15 s of kernel
// time for a cold load).
func (r *renderer) affinitySet() *set {
	return &set{Name: setAffinity, Type: r.addrType + " . mark", Flags: []knftables.SetFlag{knftables.DynamicFlag, knftables.TimeoutFlag},
		Size: affinitySetSize, Comment: "ClientIP affinity: client . service-port endpoint id"}
}

// baseRules are the jumps from each hooked chain to the helper chains.
func baseRules(name string) []rule {
	newJump := func(chain string) rule { return rule{ctMatch{}, jump(chain)} }
	switch name {
	case chainFilterPreroutingPreDNAT, chainFilterOutputPreDNAT:
		return []rule{newJump(chainFirewallCheck)}
	case chainFilterInput:
		return []rule{newJump(chainNodePortEPCheck), newJump(chainServiceEPCheck)}
	case chainFilterForward, chainFilterOutput:
		return []rule{newJump(chainServiceEPCheck), newJump(chainClusterIPsCheck)}
	case chainNATPrerouting, chainNATOutput:
		return []rule{{jump(chainServices)}}
	case chainNATPostrouting:
		return []rule{{jump(chainMasquerading)}}
	}
	return nil
}

// protoPort is the key `meta l4proto . th dport`.
var protoPort = key{{sel: selL4proto}, {sel: selDport}}

// dstTuple is the key `ip daddr . meta l4proto . th dport`.
func (r *renderer) dstTuple() key { return key{{sel: r.daddr}, {sel: selL4proto}, {sel: selDport}} }

// servicesRules dispatch by destination; cluster-IP traffic from outside
// the cluster (or all of it with masqueradeAll) is marked for masquerade.
func (r *renderer) servicesRules() []rule {
	var rules []rule
	clusterIPs := lookup{key: key{{sel: r.daddr}}, set: setClusterIPs}
	switch {
	case r.masqAll:
		rules = append(rules, rule{clusterIPs, r.masq})
	case r.ifNotLocal != nil:
		rules = append(rules, rule{clusterIPs, r.ifNotLocal, r.masq})
	}
	rules = append(rules, rule{lookup{key: r.dstTuple(), set: mapServiceIPs, vmap: true}})
	return append(rules, r.nodePortRules(rule{lookup{key: protoPort, set: mapServiceNodePorts, vmap: true}})...)
}

// nodePortRules match NodePort traffic to node addresses, one rule per
// action (each a lookup of `meta l4proto . th dport`, maybe with a
// verdict); nothing when no address accepts NodePorts.
func (r *renderer) nodePortRules(actions ...rule) []rule {
	var head rule
	switch {
	case r.nodePortAll:
		head = rule{fibLocal{}}
	case len(r.nodePortCIDRs) > 0:
		head = rule{lookup{key: key{{sel: r.daddr}}, set: setNodePortIPs}, fibLocal{}}
	default:
		return nil
	}
	head = append(head, addrCmp{sel: r.daddr, neg: true, p: r.loopback})
	var rules []rule
	for _, a := range actions {
		rules = append(rules, append(slices.Clip(head), a...))
	}
	return rules
}

func (r *renderer) masqueradingRules() []rule {
	tuple := key{{sel: r.saddr}, {sel: r.daddr}, {sel: selL4proto}, {sel: selDport}}
	return []rule{
		{markTest{mask: r.masqMark}, markSet{xor: true, v: r.masqMark}, masquerade{}},
		{ctMatch{dnat: true}, lookup{key: tuple, set: setHairpin}, masquerade{}},
	}
}
