package ipvs

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/model"
)

// The ip sets and iptables rules of IPVS mode, with upstream kube-proxy's
// names, so that either proxy takes the other's state over in place.
// IPv6 sets are named KUBE-6-… instead of KUBE-….

// Set names (IPv4 form).
const (
	setLoopBack               = "KUBE-LOOP-BACK"
	setClusterIP              = "KUBE-CLUSTER-IP"
	setExternalIP             = "KUBE-EXTERNAL-IP"
	setExternalIPLocal        = "KUBE-EXTERNAL-IP-LOCAL"
	setLoadBalancer           = "KUBE-LOAD-BALANCER"
	setLoadBalancerLocal      = "KUBE-LOAD-BALANCER-LOCAL"
	setLoadBalancerFW         = "KUBE-LOAD-BALANCER-FW"
	setLoadBalancerSourceCIDR = "KUBE-LOAD-BALANCER-SOURCE-CIDR"
	setIPVSIPs                = "KUBE-IPVS-IPS"
	// setHealthCheck holds the health-check node ports, which
	// KUBE-IPVS-FILTER lets through to a Service IP too (a cloud load
	// balancer may probe the LoadBalancer IP itself).
	setHealthCheck = "KUBE-HEALTH-CHECK-NODE-PORT"
)

// setSpec is an ip set: name (IPv4 form) and type.
type setSpec struct{ name, typ string }

var setSpecs = func() []setSpec {
	out := []setSpec{
		{setLoopBack, "hash:ip,port,ip"},
		{setClusterIP, "hash:ip,port"},
		{setExternalIP, "hash:ip,port"},
		{setExternalIPLocal, "hash:ip,port"},
		{setLoadBalancer, "hash:ip,port"},
		{setLoadBalancerLocal, "hash:ip,port"},
		{setLoadBalancerFW, "hash:ip,port"},
		{setLoadBalancerSourceCIDR, "hash:ip,port,net"},
		{setIPVSIPs, "hash:ip"},
		{setHealthCheck, "bitmap:port"},
	}
	for _, p := range protocols {
		typ := "bitmap:port"
		if p == model.SCTP {
			typ = "hash:ip,port"
		}
		out = append(out, setSpec{nodePortSet(p, false), typ}, setSpec{nodePortSet(p, true), typ})
	}
	return out
}()

var protocols = []model.Protocol{model.TCP, model.UDP, model.SCTP}

// nodePortSet names the set of a protocol's NodePorts (local: those of
// Services with the Local external policy, which are not masqueraded).
// SCTP's are hash:ip,port sets of node address and port, as upstream's.
func nodePortSet(p model.Protocol, local bool) string {
	name := "KUBE-NODE-PORT-" + string(p)
	if local {
		name = "KUBE-NODE-PORT-LOCAL-" + string(p)
	}
	if p == model.SCTP {
		name += "-HASH"
	}
	return name
}

// familyName is a set's name in family fam: IPv6 sets are KUBE-6-…, cut
// to ipset's 31 characters (as upstream cuts them).
func familyName(name string, fam model.Family) string {
	if fam == model.IPv6 {
		name = "KUBE-6-" + strings.TrimPrefix(name, "KUBE-")
		if len(name) > 31 {
			name = name[:31]
		}
	}
	return name
}

// createArgs are the arguments of `ipset create` after name and type.
func (s setSpec) createArgs(fam model.Family) string {
	if s.typ == "bitmap:port" {
		return "range 0-65535"
	}
	if fam == model.IPv6 {
		return "family inet6 hashsize 1024 maxelem 65536"
	}
	return "family inet hashsize 1024 maxelem 65536"
}

// Chain names, as upstream's IPVS mode.
const (
	chainServices     = "KUBE-SERVICES"
	chainPostrouting  = "KUBE-POSTROUTING"
	chainNodePort     = "KUBE-NODE-PORT"
	chainLoadBalancer = "KUBE-LOAD-BALANCER"
	chainMarkMasq     = "KUBE-MARK-MASQ"
	chainForward      = "KUBE-FORWARD"
	chainIPVSFilter   = "KUBE-IPVS-FILTER"
	// chainIPVSOutFilter drops the node's own connections to LoadBalancer
	// IPs whose source ranges leave the node out: IPVS takes them at
	// LOCAL_OUT, so KUBE-IPVS-FILTER (INPUT) never sees them.
	chainIPVSOutFilter = "KUBE-IPVS-OUT-FILTER"
)

// jump is a rule in a built-in chain that sends packets to one of ours.
type jump struct{ table, chain, rule string }

// jumps are the rules from built-in chains, as upstream writes them.
var jumps = []jump{
	{"nat", "PREROUTING", `-m comment --comment "kubernetes service portals" -j ` + chainServices},
	{"nat", "OUTPUT", `-m comment --comment "kubernetes service portals" -j ` + chainServices},
	{"nat", "POSTROUTING", `-m comment --comment "kubernetes postrouting rules" -j ` + chainPostrouting},
	{"filter", "INPUT", `-m comment --comment "kubernetes health check rules" -j ` + chainNodePort},
	{"filter", "INPUT", `-m comment --comment "kubernetes ipvs access filter" -j ` + chainIPVSFilter},
	{"filter", "FORWARD", `-m comment --comment "kubernetes forwarding rules" -j ` + chainForward},
	{"filter", "OUTPUT", `-m comment --comment "kubernetes ipvs access filter" -j ` + chainIPVSOutFilter},
}

// iptablesRules is the iptables-restore --noflush input of the family: the
// chains above, each rewritten whole. The Service-specific data is in the
// sets, so the rules change only with the configuration.
//
// Two choices keep upstream's `kube-proxy --cleanup` working after
// kproxy: marking is `-j MARK` in place, never a jump to KUBE-MARK-MASQ
// (upstream's iptables cleanup deletes KUBE-MARK-MASQ before its IPVS
// cleanup deletes the IPVS chains, so a reference from one of them makes
// it fail), and the source-range drop is in KUBE-IPVS-FILTER, not in
// KUBE-PROXY-FIREWALL (whose jumps upstream's iptables cleanup removes
// only in its iptables mode's form).
func (r *renderer) iptablesRules() string {
	var b strings.Builder
	set := func(name string) string { return familyName(name, r.fam) }
	mark := fmt.Sprintf("%#x", uint32(1)<<uint(r.cfg.MasqueradeBit))
	masq := "MARK --or-mark " + mark
	rule := func(chain string, parts ...string) {
		b.WriteString("-A " + chain)
		for _, p := range parts {
			if p != "" {
				b.WriteString(" " + p)
			}
		}
		b.WriteString("\n")
	}
	b.WriteString("*nat\n")
	for _, c := range []string{chainServices, chainPostrouting, chainNodePort, chainLoadBalancer, chainMarkMasq} {
		b.WriteString(":" + c + " - [0:0]\n")
	}
	// Connections from the node to localhost never reach a Service: IPVS
	// mode has no NodePorts on loopback addresses (as upstream's).
	lo := "127.0.0.0/8"
	if r.fam == model.IPv6 {
		lo = "::1/128"
	}
	rule(chainServices, "-s", lo, "-j RETURN")
	m := r.notLocal()
	if r.cfg.MasqueradeAll {
		m = ""
	}
	switch {
	case m != "" || r.cfg.MasqueradeAll:
		rule(chainServices, `-m comment --comment "Kubernetes service cluster ip + port for masquerade purpose"`,
			"-m set --match-set", set(setClusterIP), "dst,dst", m, "-j", masq)
	default:
		// No local-traffic detection: as upstream's, masquerade the node's
		// own connections whose source is a Service IP (kube-ipvs0 holds
		// them all, so a connection to a ClusterIP may pick one as its
		// source), which the endpoint could not answer otherwise.
		rule(chainServices, `-m comment --comment "Kubernetes service cluster ip + port for masquerade purpose"`,
			"-m set --match-set", set(setClusterIP), "src,dst -j", masq)
	}
	rule(chainServices, `-m comment --comment "Kubernetes service external ip + port for masquerade and filter purpose"`,
		"-m set --match-set", set(setExternalIP), "dst,dst -m set ! --match-set", set(setExternalIPLocal), "dst,dst -j", masq)
	// An external IP is accepted before the NodePort jump, as upstream's:
	// kube-ipvs0 makes it a local address, and a port of it that is also
	// a Cluster-policy NodePort would otherwise be marked there, taking
	// the client's address from an externalTrafficPolicy: Local Service.
	rule(chainServices, "-m set --match-set", set(setExternalIP), "dst,dst -j ACCEPT")
	rule(chainServices, "-m set --match-set", set(setLoadBalancer), "dst,dst -j", chainLoadBalancer)
	rule(chainServices, "-m addrtype --dst-type LOCAL -j", chainNodePort)
	for _, s := range []string{setClusterIP, setLoadBalancer} {
		rule(chainServices, "-m set --match-set", set(s), "dst,dst -j ACCEPT")
	}
	rule(chainLoadBalancer, "-m set --match-set", set(setLoadBalancerLocal), "dst,dst -j RETURN")
	rule(chainLoadBalancer, "-j", masq)
	for _, p := range protocols {
		proto, dst := strings.ToLower(string(p)), "dst"
		if p == model.SCTP {
			dst = "dst,dst"
		}
		rule(chainNodePort, "-p", proto, "-m set --match-set", set(nodePortSet(p, true)), dst, "-j RETURN")
		rule(chainNodePort, "-p", proto, "-m set --match-set", set(nodePortSet(p, false)), dst, "-j", masq)
	}
	rule(chainPostrouting, `-m comment --comment "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose"`,
		"-m set --match-set", set(setLoopBack), "dst,dst,src -j MASQUERADE")
	rule(chainPostrouting, "-m mark ! --mark", mark+"/"+mark, "-j RETURN")
	rule(chainPostrouting, "-j MARK --xor-mark", mark)
	rule(chainPostrouting, `-m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully`)
	rule(chainMarkMasq, "-j MARK --or-mark", mark)
	b.WriteString("COMMIT\n*filter\n")
	for _, c := range []string{chainForward, chainNodePort, chainIPVSFilter, chainIPVSOutFilter} {
		b.WriteString(":" + c + " - [0:0]\n")
	}
	rule(chainForward, `-m comment --comment "kubernetes forwarding rules" -m mark --mark`, mark+"/"+mark, "-j ACCEPT")
	rule(chainForward, `-m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT`)
	// Health-check node ports are let in on a node whose INPUT drops by
	// default (a host firewall), as upstream's IPVS mode does.
	rule(chainNodePort, `-m comment --comment "Kubernetes health check node port" -m set --match-set`, set(setHealthCheck), "dst -j ACCEPT")
	rule(chainIPVSFilter, "-m set --match-set", set(setLoadBalancerFW), "dst,dst -m set ! --match-set",
		set(setLoadBalancerSourceCIDR), "dst,dst,src -j DROP")
	for _, s := range []string{setLoadBalancer, setClusterIP, setExternalIP} {
		rule(chainIPVSFilter, "-m set --match-set", set(s), "dst,dst -j RETURN")
	}
	rule(chainIPVSFilter, "-m set --match-set", set(setHealthCheck), "dst -j RETURN")
	rule(chainIPVSFilter, "-m conntrack --ctstate NEW -m set --match-set", set(setIPVSIPs), "dst -j REJECT")
	// The node's connection to a LoadBalancer IP on kube-ipvs0 has that IP
	// as its source; after IPVS its destination is the endpoint, so the
	// rule matches the virtual service.
	for _, k := range r.noNodeAccess {
		rule(chainIPVSOutFilter, "-s", k.addr.String(), "-m ipvs --vaddr", k.addr.String(), "--vproto",
			strings.ToLower(string(k.proto)), "--vport", strconv.Itoa(int(k.port)), "-j DROP")
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

// notLocal is the match for traffic from outside the cluster (the
// detect-local mode), "" when there is none.
func (r *renderer) notLocal() string {
	switch r.cfg.LocalMode {
	case dataplane.LocalClusterCIDR:
		for _, c := range r.cfg.ClusterCIDRs {
			if model.FamilyOf(c.Addr()) == r.fam {
				return "! -s " + c.String()
			}
		}
	case dataplane.LocalNodeCIDR:
		for _, c := range r.node.PodCIDRs {
			if model.FamilyOf(c.Addr()) == r.fam {
				return "! -s " + c.String()
			}
		}
	case dataplane.LocalBridgeInterface:
		if r.cfg.BridgeInterface != "" {
			return "! -i " + r.cfg.BridgeInterface
		}
	case dataplane.LocalInterfacePrefix:
		if r.cfg.InterfacePrefix != "" {
			return "! -i " + r.cfg.InterfacePrefix + "+"
		}
	}
	return ""
}
