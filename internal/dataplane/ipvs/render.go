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
	d         *desired
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
	for _, sp := range fs.Ports {
		r.port(sp)
	}
	for a := range r.d.bound {
		r.member(setIPVSIPs, a.String())
	}
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
		internal = sp.LocalEndpoints
	}
	external := sp.ClusterEndpoints
	if sp.ExternalPolicyLocal {
		external = sp.LocalEndpoints
	}
	if sp.ClusterIP.IsValid() {
		r.server(sp, sp.ClusterIP, sp.Port, internal, true)
		r.member(setClusterIP, entry(sp.ClusterIP, sp.Protocol, sp.Port))
	}
	for _, ip := range sp.ExternalIPs {
		r.server(sp, ip, sp.Port, external, true)
		r.member(setExternalIP, entry(ip, sp.Protocol, sp.Port))
		if sp.ExternalPolicyLocal {
			r.member(setExternalIPLocal, entry(ip, sp.Protocol, sp.Port))
		}
	}
	for _, ip := range sp.LoadBalancerIPs {
		r.server(sp, ip, sp.Port, external, true)
		r.member(setLoadBalancer, entry(ip, sp.Protocol, sp.Port))
		if sp.ExternalPolicyLocal {
			r.member(setLoadBalancerLocal, entry(ip, sp.Protocol, sp.Port))
		}
		if len(sp.SourceRanges) > 0 {
			r.member(setLoadBalancerFW, entry(ip, sp.Protocol, sp.Port))
			for _, src := range sp.SourceRanges {
				r.member(setLoadBalancerSourceCIDR, entry(ip, sp.Protocol, sp.Port)+","+netString(src))
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

// server adds a virtual server at addr:port with the endpoints eps; bind
// puts addr on kube-ipvs0.
func (r *renderer) server(sp *model.ServicePort, addr netip.Addr, port uint16, eps []*model.Endpoint, bind bool) {
	k := vsKey{addr: addr, proto: sp.Protocol, port: port}
	vs := &virtualServer{key: k, scheduler: scheduler(sp, r.cfg.IPVS.Scheduler), owner: sp.ID}
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
