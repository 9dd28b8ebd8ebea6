package ipvs

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/model"
)

// vsKey identifies a virtual server: address, protocol, port.
type vsKey struct {
	addr  netip.Addr
	proto model.Protocol
	port  uint16
}

func (k vsKey) String() string {
	return string(k.proto) + " " + netip.AddrPortFrom(k.addr, k.port).String()
}

func compareKeys(a, b vsKey) int {
	return cmp.Or(a.addr.Compare(b.addr), cmp.Compare(a.proto, b.proto), cmp.Compare(a.port, b.port))
}

// virtualServer is one desired IPVS virtual server with its real servers.
type virtualServer struct {
	key       vsKey
	scheduler string
	// mhPort is set when mh is --ipvs-scheduler's: upstream then hashes the
	// client's port too (the mh-port flag). kproxy's own source-hash
	// balancing and the scheduler annotation use mh-fallback instead.
	mhPort bool
	// timeout is the persistence (ClientIP affinity) in seconds; 0 is none.
	timeout uint32
	reals   []netip.AddrPort // sorted, unique
	owner   model.PortID
}

// desired is what one family needs: virtual servers, the addresses bound to
// kube-ipvs0, the members of each ip set, and the iptables rules.
type desired struct {
	fam     model.Family
	servers map[vsKey]*virtualServer
	bound   map[netip.Addr]bool
	sets    map[string]map[string]bool // set name (without family prefix) -> members
	rules   string                     // iptables-restore --noflush input
}

// renderer holds what the rules of one family depend on besides the ports.
type renderer struct {
	cfg       dataplane.Config
	fam       model.Family
	node      model.NodeInfo
	nodeAddrs []netip.Addr // the node's addresses that take NodePorts
	// local holds every local address (not kube-ipvs0's): an externalIP
	// or LoadBalancer IP among them is not bound to kube-ipvs0.
	local map[netip.Addr]bool
	// noNodeAccess are the LoadBalancer frontends whose source ranges
	// leave out this node's IP, sorted: the node's own connections to them
	// are dropped (KUBE-IPVS-OUT-FILTER).
	noNodeAccess []vsKey
	d            *desired
}

// render computes the desired state of one family. nodeAddrs are the
// node's local addresses of that family (not kube-ipvs0's): the NodePort
// virtual servers listen on those within nodePortAddresses. It is pure.
func render(cfg dataplane.Config, fs *model.FamilySnapshot, node model.NodeInfo, nodeAddrs []netip.Addr) *desired {
	r := &renderer{cfg: cfg, fam: fs.Family, node: node, d: &desired{
		fam: fs.Family, servers: map[vsKey]*virtualServer{}, bound: map[netip.Addr]bool{},
		sets: map[string]map[string]bool{},
	}}
	for _, s := range setSpecs {
		r.d.sets[s.name] = map[string]bool{}
	}
	r.nodeAddrs = dataplane.NodePortAddrs(cfg, fs.Family, nodeAddrs)
	r.local = make(map[netip.Addr]bool, len(nodeAddrs))
	for _, a := range nodeAddrs {
		r.local[a.Unmap()] = true
	}
	for _, sp := range fs.Ports {
		r.port(sp)
	}
	for a := range r.d.bound {
		r.member(setIPVSIPs, a.String())
	}
	slices.SortFunc(r.noNodeAccess, compareKeys)
	r.noNodeAccess = slices.Compact(r.noNodeAccess)
	r.d.rules = r.iptablesRules()
	return r.d
}

func (r *renderer) member(set, m string) { r.d.sets[set][m] = true }

// entry is an ip set member of type hash:ip,port.
func entry(a netip.Addr, proto model.Protocol, port uint16) string {
	return fmt.Sprintf("%s,%s:%d", a, strings.ToLower(string(proto)), port)
}

// port renders one service port: its virtual servers (ClusterIP,
// externalIPs, LoadBalancer IPs, NodePorts) and set members.
func (r *renderer) port(sp *model.ServicePort) {
	internal := sp.ClusterEndpoints
	if sp.InternalPolicyLocal {
		internal = localOrCluster(sp)
	}
	external := sp.ClusterEndpoints
	if sp.ExternalPolicyLocal {
		external = localOrCluster(sp)
	}
	if sp.ClusterIP.IsValid() {
		r.server(sp, sp.ClusterIP, sp.Port, internal, true)
		r.member(setClusterIP, entry(sp.ClusterIP, sp.Protocol, sp.Port))
	}
	// An externalIP or LoadBalancer IP that is already an address of this
	// node stays where it is, as upstream's: bound to kube-ipvs0 (and so in
	// KUBE-IPVS-IPS) it would have the node refuse its other ports.
	for _, ip := range sp.ExternalIPs {
		r.server(sp, ip, sp.Port, external, !r.local[ip])
		r.member(setExternalIP, entry(ip, sp.Protocol, sp.Port))
		if sp.ExternalPolicyLocal {
			r.member(setExternalIPLocal, entry(ip, sp.Protocol, sp.Port))
		}
	}
	for _, ip := range sp.LoadBalancerIPs {
		r.server(sp, ip, sp.Port, external, !r.local[ip])
		r.member(setLoadBalancer, entry(ip, sp.Protocol, sp.Port))
		if sp.ExternalPolicyLocal {
			r.member(setLoadBalancerLocal, entry(ip, sp.Protocol, sp.Port))
		}
		if len(sp.SourceRanges) > 0 {
			r.member(setLoadBalancerFW, entry(ip, sp.Protocol, sp.Port))
			for _, src := range sp.SourceRanges {
				r.member(setLoadBalancerSourceCIDR, entry(ip, sp.Protocol, sp.Port)+","+netString(src))
			}
			if !r.nodeAllowed(sp.SourceRanges) {
				r.noNodeAccess = append(r.noNodeAccess, vsKey{addr: ip, proto: sp.Protocol, port: sp.Port})
			}
		}
	}
	if sp.NodePort != 0 {
		for _, a := range r.nodeAddrs {
			r.server(sp, a, sp.NodePort, external, false)
		}
		r.nodePortMember(nodePortSet(sp.Protocol, false), sp)
		if sp.ExternalPolicyLocal {
			r.nodePortMember(nodePortSet(sp.Protocol, true), sp)
		}
	}
	if sp.HealthCheckNodePort != 0 {
		r.member(setHealthCheck, fmt.Sprint(sp.HealthCheckNodePort))
	}
	// Hairpin: a local endpoint reaching itself through the Service is
	// masqueraded, so the reply comes back through IPVS.
	for _, ep := range sp.AllReachable {
		if !ep.IsLocal {
			continue
		}
		r.member(setLoopBack, fmt.Sprintf("%s,%s:%d,%s", ep.IP, strings.ToLower(string(sp.Protocol)), ep.Port, ep.IP))
	}
}

// nodePortMember adds sp's NodePort to a NodePort set: the port (bitmap
// sets), or for SCTP each node address with it (hash:ip,port, as
// upstream).
func (r *renderer) nodePortMember(set string, sp *model.ServicePort) {
	if sp.Protocol != model.SCTP {
		r.member(set, fmt.Sprint(sp.NodePort))
		return
	}
	for _, a := range r.nodeAddrs {
		r.member(set, entry(a, sp.Protocol, sp.NodePort))
	}
}

// nodeAllowed reports whether loadBalancerSourceRanges let this node's own
// connections in, as upstream decides it: a range holds the node's IP of
// the family.
func (r *renderer) nodeAllowed(ranges []netip.Prefix) bool {
	for _, ip := range r.cfg.NodeIPs {
		if model.FamilyOf(ip) == r.fam && slices.ContainsFunc(ranges, func(p netip.Prefix) bool { return p.Contains(ip) }) {
			return true
		}
	}
	return false
}

// localOrCluster is the real servers of a virtual server under a Local
// policy, as upstream's IPVS mode picks them: the node's local endpoints,
// or the cluster's when it has none (kubernetes PR 97081: pods and the node
// itself keep reaching the Service; an external client's reply comes from
// the endpoint's address and is lost). ClusterEndpoints is nil for a port
// that uses none (internalTrafficPolicy Local and not externally
// accessible), so such a virtual server stays empty.
func localOrCluster(sp *model.ServicePort) []*model.Endpoint {
	if len(sp.LocalEndpoints) > 0 {
		return sp.LocalEndpoints
	}
	return sp.ClusterEndpoints
}

// server adds a virtual server at addr:port with the endpoints eps; bind
// puts addr on kube-ipvs0.
func (r *renderer) server(sp *model.ServicePort, addr netip.Addr, port uint16, eps []*model.Endpoint, bind bool) {
	k := vsKey{addr: addr, proto: sp.Protocol, port: port}
	vs := &virtualServer{key: k, scheduler: scheduler(sp, r.cfg.IPVS.Scheduler), owner: sp.ID}
	vs.mhPort = vs.scheduler == "mh" && sp.Scheduler == "" && sp.Balancing.IPVSScheduler() == ""
	if sp.AffinityTimeout > 0 {
		vs.timeout = uint32(sp.AffinityTimeout)
	}
	for _, ep := range eps {
		vs.reals = append(vs.reals, ep.AddrPort())
	}
	slices.SortFunc(vs.reals, netip.AddrPort.Compare)
	vs.reals = slices.Compact(vs.reals)
	r.d.servers[k] = vs
	if bind {
		r.d.bound[addr] = true
	}
}

// sortedServers returns d's virtual servers in key order.
func (d *desired) sortedServers() []*virtualServer {
	out := make([]*virtualServer, 0, len(d.servers))
	for _, vs := range d.servers {
		out = append(out, vs)
	}
	slices.SortFunc(out, func(a, b *virtualServer) int { return compareKeys(a.key, b.key) })
	return out
}

// netString is a range as ipset prints it: a host range as its address.
func netString(p netip.Prefix) string {
	if p.IsSingleIP() {
		return p.Addr().String()
	}
	return p.Masked().String()
}

// scheduler is the virtual server's scheduler: the Service's
// ipvs.kproxy.io/scheduler annotation, else its load-balancing algorithm's,
// else --ipvs-scheduler, else rr (upstream's default).
func scheduler(sp *model.ServicePort, configured string) string {
	return cmp.Or(sp.Scheduler, sp.Balancing.IPVSScheduler(), configured, "rr")
}
