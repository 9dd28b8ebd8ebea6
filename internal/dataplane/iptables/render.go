package iptables

import (
	"net/netip"
	"strings"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/nfacct"
)

// Chain is one chain kproxy owns and its rules, as typed values (rule.go)
// that print as the text following "-A <Name> " in iptables-restore input.
type Chain struct {
	Name  string
	Rules []rule
}

// Jump is a rule kproxy inserts (at the top) into a built-in chain.
type Jump struct {
	Table, Chain string
	// Rule jumps to one of kproxy's chains (Target).
	Rule rule
}

// Target is the chain the jump leads to.
func (j Jump) Target() string { return j.Rule.target.chain }

// Ruleset is the desired state of one family: kproxy's chains per table, in
// the order they are written, and the jumps from the built-in chains.
type Ruleset struct {
	Family model.Family
	Mangle []*Chain
	Filter []*Chain
	NAT    []*Chain
	Jumps  []Jump
}

// Tables returns the table names and chains of the ruleset in restore order.
func (rs *Ruleset) table(name string) []*Chain {
	switch name {
	case tableMangle:
		return rs.Mangle
	case tableFilter:
		return rs.Filter
	}
	return rs.NAT
}

// Params are the inputs of a render beyond the Snapshot.
type Params struct {
	Config dataplane.Config
	// LocalhostNodePorts is iptables.localhostNodePorts (IPv4 only). It is
	// ignored when nodePortAddresses exclude 127.0.0.1, as upstream does.
	LocalhostNodePorts bool
	// ConntrackLiberal is true when nf_conntrack_tcp_be_liberal is set: no
	// rule then drops conntrack-INVALID packets.
	ConntrackLiberal bool
	// Counters are the nfacct counters that exist for rules to count into,
	// as upstream's rules do when it could create them.
	Counters Counters
}

// Counters says which of upstream's nfacct counters (nfacct.go's names)
// the rules count into.
type Counters struct {
	// InvalidDropped: the conntrack-INVALID drop rule counts into
	// ct_state_invalid_dropped_pkts.
	InvalidDropped bool
	// LocalhostAccepted: a NodePort on 127.0.0.0/8 gets a rule of its own
	// ahead of the NodePort's, counting into localhost_nps_accepted_pkts.
	LocalhostAccepted bool
}

// renderer holds what every rule of one family needs.
type renderer struct {
	fam         model.Family
	masqMark    uint32
	masqAll     bool
	local       localMatch // traffic from local pods; zero when unknown
	nodeIP      netip.Addr
	localhostNP bool // NodePorts answer on 127.0.0.0/8 (IPv4 only)
	liberal     bool
	counters    Counters
	npAll       bool           // NodePorts on every local address
	npCIDRs     []netip.Prefix // else on local addresses in these
	large       bool           // omit per-endpoint comments, as upstream does past 1000 endpoints
}

// largeClusterEndpoints is the endpoint count past which per-endpoint
// comments are left out (upstream's threshold).
const largeClusterEndpoints = 1000

func newRenderer(p Params, fs *model.FamilySnapshot, node model.NodeInfo) *renderer {
	cfg := p.Config
	r := &renderer{fam: fs.Family, masqAll: cfg.MasqueradeAll, liberal: p.ConntrackLiberal, counters: p.Counters}
	r.masqMark = uint32(1) << uint(cfg.MasqueradeBit&31)
	r.local = localMatchOf(cfg, fs.Family, node)
	for _, ip := range cfg.NodeIPs {
		if model.FamilyOf(ip) == fs.Family && !r.nodeIP.IsValid() {
			r.nodeIP = ip.Unmap()
		}
	}
	r.npAll, r.npCIDRs = nodePortCIDRs(cfg, fs.Family)
	r.localhostNP = p.LocalhostNodePorts && fs.Family == model.IPv4 && allowsLoopback(r.npAll, r.npCIDRs)
	r.large = countEndpoints(fs) > largeClusterEndpoints
	return r
}

func countEndpoints(fs *model.FamilySnapshot) int {
	n := 0
	for _, sp := range fs.Ports {
		n += len(sp.AllReachable)
	}
	return n
}

// LocalhostNodePortsActive reports whether NodePorts answer on 127.0.0.1
// for cfg (route_localnet must then be 1).
func LocalhostNodePortsActive(p Params) bool {
	all, cidrs := nodePortCIDRs(p.Config, model.IPv4)
	return p.LocalhostNodePorts && allowsLoopback(all, cidrs)
}

func allowsLoopback(all bool, cidrs []netip.Prefix) bool {
	if all {
		return true
	}
	for _, c := range cidrs {
		if c.Contains(netip.MustParseAddr("127.0.0.1")) {
			return true
		}
	}
	return false
}

// localMatch tells traffic from local pods: by source CIDR or by input
// interface ("name+": a prefix). The zero value cannot tell.
type localMatch struct {
	cidr  netip.Prefix
	iface string
}

func (m localMatch) known() bool { return m.cidr.IsValid() || m.iface != "" }

// localMatchOf returns the match for traffic from local pods; zero when
// the mode cannot tell.
func localMatchOf(cfg dataplane.Config, fam model.Family, node model.NodeInfo) localMatch {
	byCIDR := func(cidrs []netip.Prefix) localMatch {
		for _, c := range cidrs {
			if model.FamilyOf(c.Addr()) == fam {
				return localMatch{cidr: c.Masked()}
			}
		}
		return localMatch{}
	}
	switch cfg.LocalMode {
	case dataplane.LocalClusterCIDR:
		return byCIDR(cfg.ClusterCIDRs)
	case dataplane.LocalNodeCIDR:
		return byCIDR(node.PodCIDRs)
	case dataplane.LocalBridgeInterface:
		if cfg.BridgeInterface != "" {
			return localMatch{iface: cfg.BridgeInterface}
		}
	case dataplane.LocalInterfacePrefix:
		if cfg.InterfacePrefix != "" {
			return localMatch{iface: cfg.InterfacePrefix + "+"}
		}
	}
	return localMatch{}
}

// nodePortCIDRs interprets nodePortAddresses for one family. The daemon has
// already replaced "primary" by node-IP CIDRs; empty (or a /0) means every
// local address.
func nodePortCIDRs(cfg dataplane.Config, fam model.Family) (bool, []netip.Prefix) {
	if len(cfg.NodePortAddresses) == 0 {
		return true, nil
	}
	var cidrs []netip.Prefix
	for _, s := range cfg.NodePortAddresses {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			if a, aerr := netip.ParseAddr(strings.TrimSpace(s)); aerr == nil {
				p = netip.PrefixFrom(a, a.BitLen())
			} else {
				continue
			}
		}
		if model.FamilyOf(p.Addr()) != fam {
			continue
		}
		if p.Bits() == 0 {
			return true, nil
		}
		cidrs = append(cidrs, p.Masked())
	}
	return false, cidrs
}

// Render returns the complete desired ruleset of one family. It is pure.
func Render(p Params, fs *model.FamilySnapshot, node model.NodeInfo) *Ruleset {
	r := newRenderer(p, fs, node)
	ports := make(map[model.PortID]*portRules, len(fs.Ports))
	for _, sp := range fs.Ports {
		ports[sp.ID] = r.port(sp)
	}
	return r.assemble(fs.Ports, ports)
}

// assemble builds the ruleset from rendered ports, in port order.
func (r *renderer) assemble(order []*model.ServicePort, ports map[model.PortID]*portRules) *Ruleset {
	rs := &Ruleset{Family: r.fam, Jumps: r.jumps()}
	rs.Mangle = []*Chain{canaryChain()}
	rs.Filter, rs.NAT = r.sharedChains(order, ports)
	for _, sp := range order {
		rs.NAT = append(rs.NAT, ports[sp.ID].nat...)
	}
	return rs
}

// sharedChains are the chains every Service port adds rules to, plus the
// fixed ones, in both tables.
func (r *renderer) sharedChains(order []*model.ServicePort, ports map[model.PortID]*portRules) (filter, nat []*Chain) {
	lin := map[string]*Chain{}
	for _, name := range []string{chainServices, chainExternalServices, chainForward, chainNodePorts, chainProxyFirewall} {
		lin[name] = &Chain{Name: name}
	}
	d := newDispatcher(r.fam)
	entries := make([][]entry, len(order))
	for i, sp := range order {
		entries[i] = ports[sp.ID].entries
		for j := range entries[i] {
			if e := &entries[i][j]; e.table == tableNAT {
				d.reserve(e)
			}
		}
	}
	for _, es := range entries {
		for i := range es {
			if e := &es[i]; e.table == tableFilter {
				lin[e.chain].Rules = append(lin[e.chain].Rules, e.rule)
			} else {
				d.add(e)
			}
		}
	}
	lin[chainForward].Rules = r.forwardRules()
	filter = []*Chain{lin[chainServices], lin[chainExternalServices], lin[chainForward], lin[chainNodePorts], lin[chainProxyFirewall]}
	if r.localhostNP {
		filter = append(filter, r.martianChain())
	}
	filter = append(filter, canaryChain())
	nat = d.chains(r.nodePortsJumps())
	nat = append(nat, r.postroutingChain(), r.markMasqChain(), canaryChain())
	return filter, nat
}

// canaryChain is KUBE-PROXY-CANARY, empty as upstream makes it: tools that
// watch for it find it, and it holds nothing upstream would not delete
// (canary.go says what Drifted watches instead).
func canaryChain() *Chain { return &Chain{Name: chainCanary} }

func (r *renderer) postroutingChain() *Chain {
	return &Chain{Name: chainPostrouting, Rules: []rule{
		rb().not().markMatch(r.masqMark, r.masqMark).ret(),
		rb().markXor(r.masqMark),
		rb().comment("kubernetes service traffic requiring SNAT").masquerade(),
	}}
}

func (r *renderer) markMasqChain() *Chain {
	return &Chain{Name: chainMarkMasq, Rules: []rule{rb().markOr(r.masqMark)}}
}

var (
	loopback4 = netip.MustParsePrefix("127.0.0.0/8")
	loopback6 = netip.MustParsePrefix("::1/128")
)

// martianChain is kubelet's KUBE-FIREWALL rule against localnet packets
// from other hosts (CVE-2020-8558), needed once route_localnet is 1.
func (r *renderer) martianChain() *Chain {
	lo := prefixAddr(loopback4)
	return &Chain{Name: chainKubeletFirewall, Rules: []rule{
		rb().dst(lo).not().src(lo).comment("block incoming localnet connections").
			not().ctstate(ctRelated | ctEstablished | ctDNAT).drop(),
	}}
}

func (r *renderer) forwardRules() []rule {
	var rules []rule
	if !r.liberal {
		b := rb().ctstate(ctInvalid)
		if r.counters.InvalidDropped {
			b.nfacct(nfacct.CTStateInvalidDropped)
		}
		rules = append(rules, b.drop())
	}
	return append(rules,
		rb().comment("kubernetes forwarding rules").markMatch(r.masqMark, r.masqMark).accept(),
		rb().comment("kubernetes forwarding conntrack rule").ctstate(ctRelated|ctEstablished).accept(),
	)
}

// nodePortsJumps are the last rules of nat KUBE-SERVICES: local
// destinations go on to KUBE-NODEPORTS.
func (r *renderer) nodePortsJumps() []rule {
	const c = "kubernetes service nodeports; NOTE: this must be the last rule in this chain"
	if r.npAll {
		b := rb().comment(c).dstType(addrLocal)
		if r.fam == model.IPv6 {
			b.not().dst(prefixAddr(loopback6))
		} else if !r.localhostNP {
			b.not().dst(prefixAddr(loopback4))
		}
		return []rule{b.jump(chainNodePorts)}
	}
	var rules []rule
	kept := false // the loopback RETURN is in rules
	lo := loopback4
	if r.fam == model.IPv6 {
		lo = loopback6
	}
	for _, cidr := range r.npCIDRs {
		if cidr.Addr().IsLoopback() && (r.fam == model.IPv6 || !r.localhostNP) {
			continue
		}
		if !kept && cidr.Overlaps(lo) && (r.fam == model.IPv6 || !r.localhostNP) {
			kept = true
			// A CIDR such as 0.0.0.0/1 holds the loopback range
			// without being in it: upstream skips loopback node
			// addresses one by one, kproxy, matching CIDRs, keeps
			// them out first.
			rules = append(rules, rb().comment("kubernetes service nodeports: not on loopback addresses").dst(prefixAddr(lo)).ret())
		}
		rules = append(rules, rb().comment(c).dst(prefixAddr(cidr)).dstType(addrLocal).jump(chainNodePorts))
	}
	return rules
}

// jumps are the rules from built-in chains into kproxy's chains, as
// upstream installs them.
func (r *renderer) jumps() []Jump {
	j := func(table, chain string, newOnly bool, comment, target string) Jump {
		b := rb()
		if newOnly {
			b.ctstate(ctNew)
		}
		return Jump{Table: table, Chain: chain, Rule: b.comment(comment).jump(target)}
	}
	js := []Jump{
		j(tableFilter, "INPUT", true, "kubernetes externally-visible service portals", chainExternalServices),
		j(tableFilter, "FORWARD", true, "kubernetes externally-visible service portals", chainExternalServices),
		j(tableFilter, "INPUT", false, "kubernetes health check service ports", chainNodePorts),
		j(tableFilter, "FORWARD", true, "kubernetes service portals", chainServices),
		j(tableFilter, "OUTPUT", true, "kubernetes service portals", chainServices),
		j(tableFilter, "FORWARD", false, "kubernetes forwarding rules", chainForward),
		j(tableFilter, "INPUT", true, "kubernetes load balancer firewall", chainProxyFirewall),
		j(tableFilter, "OUTPUT", true, "kubernetes load balancer firewall", chainProxyFirewall),
		j(tableFilter, "FORWARD", true, "kubernetes load balancer firewall", chainProxyFirewall),
		j(tableNAT, "OUTPUT", false, "kubernetes service portals", chainServices),
		j(tableNAT, "PREROUTING", false, "kubernetes service portals", chainServices),
		j(tableNAT, "POSTROUTING", false, "kubernetes postrouting rules", chainPostrouting),
	}
	if r.localhostNP {
		for _, c := range []string{"INPUT", "OUTPUT"} {
			js = append(js, Jump{Table: tableFilter, Chain: c, Rule: rb().jump(chainKubeletFirewall)})
		}
	}
	return js
}
