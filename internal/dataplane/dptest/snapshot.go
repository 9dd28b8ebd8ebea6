package dptest

import (
	"net/netip"
	"slices"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/model"
)

// Test addresses: the node is 198.18.0.2 (fd00::2) with pod CIDR
// 198.18.64.0/24 (local pods) in cluster CIDR 198.18.64.0/18; remote pods
// are in 198.18.65.0/24; Services are in 198.19.0.0/24; LB and external IPs
// in 198.19.100.0/24; "external" clients in 198.18.200.0/24.
var (
	NodeIP     = netip.MustParseAddr("198.18.0.2")
	NodeIP6    = netip.MustParseAddr("fd00::2")
	PodCIDR    = netip.MustParsePrefix("198.18.64.0/24")
	PodCIDR6   = netip.MustParsePrefix("fd00:64::/64")
	ClusterNet = netip.MustParsePrefix("198.18.64.0/18")
)

// Config is an IPv4 dataplane configuration for the test addresses: local
// traffic detected by cluster CIDR, masquerade bit 14.
func Config() dataplane.Config {
	return dataplane.Config{
		Families:      []model.Family{model.IPv4},
		MasqueradeBit: 14,
		LocalMode:     dataplane.LocalClusterCIDR,
		ClusterCIDRs:  []netip.Prefix{ClusterNet, netip.MustParsePrefix("fd00:64::/48")},
		NodeIPs:       []netip.Addr{NodeIP, NodeIP6},
	}
}

// Node is node-a, the node the tests' proxy runs on.
func Node() model.NodeInfo {
	return model.NodeInfo{Name: "node-a", Known: true, PodCIDRs: []netip.Prefix{PodCIDR, PodCIDR6},
		InternalIPs: []netip.Addr{NodeIP, NodeIP6}}
}

// EP builds a ready endpoint, on this node (node-a) when local.
func EP(ip string, port uint16, local bool) *model.Endpoint {
	return &model.Endpoint{IP: netip.MustParseAddr(ip), Port: port, Ready: true, Serving: true, IsLocal: local}
}

// Terminating turns e into a serving, terminating, not ready endpoint.
func Terminating(e *model.Endpoint) *model.Endpoint {
	e.Ready, e.Terminating = false, true
	return e
}

// SvcOpt fills in one feature of a service port.
type SvcOpt = func(*model.ServicePort)

// Svc builds a TCP service port named ns/name port "p", of the family of
// clusterIP (IPv4 when it is empty), applies opts and then categorizes
// its endpoints.
func Svc(ns, name, clusterIP string, port uint16, opts ...SvcOpt) *model.ServicePort {
	sp := &model.ServicePort{
		ID:       model.PortID{Namespace: ns, Name: name, Port: "p", Protocol: model.TCP},
		Family:   model.IPv4,
		Protocol: model.TCP, Port: port,
	}
	if clusterIP != "" {
		sp.ClusterIP = netip.MustParseAddr(clusterIP)
		sp.Family = model.FamilyOf(sp.ClusterIP)
	}
	for _, o := range opts {
		o(sp)
	}
	Categorize(sp)
	return sp
}

// WithEPs sets the endpoints.
func WithEPs(eps ...*model.Endpoint) SvcOpt {
	return func(sp *model.ServicePort) { sp.Endpoints = eps }
}

// WithNodePort sets the node port.
func WithNodePort(np uint16) SvcOpt {
	return func(sp *model.ServicePort) { sp.NodePort = np }
}

// WithLB adds load-balancer ingress IPs.
func WithLB(ips ...string) SvcOpt {
	return func(sp *model.ServicePort) {
		for _, ip := range ips {
			sp.LoadBalancerIPs = append(sp.LoadBalancerIPs, netip.MustParseAddr(ip))
		}
	}
}

// WithExternalIPs adds external IPs.
func WithExternalIPs(ips ...string) SvcOpt {
	return func(sp *model.ServicePort) {
		for _, ip := range ips {
			sp.ExternalIPs = append(sp.ExternalIPs, netip.MustParseAddr(ip))
		}
	}
}

// WithSourceRanges adds loadBalancerSourceRanges.
func WithSourceRanges(cidrs ...string) SvcOpt {
	return func(sp *model.ServicePort) {
		for _, c := range cidrs {
			sp.SourceRanges = append(sp.SourceRanges, netip.MustParsePrefix(c))
		}
	}
}

// WithProto sets the protocol (of the port and of its ID).
func WithProto(p model.Protocol) SvcOpt {
	return func(sp *model.ServicePort) { sp.Protocol, sp.ID.Protocol = p, p }
}

// WithAffinity sets ClientIP session affinity with a timeout in seconds.
func WithAffinity(seconds int32) SvcOpt {
	return func(sp *model.ServicePort) { sp.AffinityTimeout = seconds }
}

// WithBalancing sets the load-balancing algorithm.
func WithBalancing(b model.Balancing) SvcOpt {
	return func(sp *model.ServicePort) { sp.Balancing = b }
}

// WithETPLocal sets externalTrafficPolicy Local (health check node port
// 30999).
func WithETPLocal(sp *model.ServicePort) {
	sp.ExternalPolicyLocal = true
	sp.HealthCheckNodePort = 30999
}

// WithITPLocal sets internalTrafficPolicy Local.
func WithITPLocal(sp *model.ServicePort) { sp.InternalPolicyLocal = true }

// Categorize fills the endpoint categories of sp the way upstream's
// CategorizeEndpoints does (without topology), so that tests do not depend
// on the model package's implementation. Call it again after changing
// sp's endpoints or policies by hand.
func Categorize(sp *model.ServicePort) {
	externally := sp.ExternallyAccessible()
	usesCluster := !sp.InternalPolicyLocal || externally
	usesLocal := sp.InternalPolicyLocal || (sp.ExternalPolicyLocal && externally)
	sp.ClusterEndpoints, sp.LocalEndpoints, sp.AllReachable = nil, nil, nil
	if usesCluster {
		sp.ClusterEndpoints = usable(sp, false)
	}
	sp.HasEndpoints = len(usable(sp, false)) > 0
	if usesLocal {
		sp.LocalEndpoints = usable(sp, true)
	}
	sp.AllReachable = slices.Clone(sp.ClusterEndpoints)
	for _, e := range sp.LocalEndpoints {
		if !slices.Contains(sp.AllReachable, e) {
			sp.AllReachable = append(sp.AllReachable, e)
		}
	}
	sp.LocalReadyEndpoints = 0
	for _, e := range sp.LocalEndpoints {
		if e.Ready {
			sp.LocalReadyEndpoints++
		}
	}
}

// usable returns the ready endpoints of sp (only local ones when local),
// or when there are none the serving terminating ones.
func usable(sp *model.ServicePort, local bool) []*model.Endpoint {
	var ready, term []*model.Endpoint
	for _, e := range sp.Endpoints {
		if local && !e.IsLocal {
			continue
		}
		if e.Ready {
			ready = append(ready, e)
		} else if e.Serving && e.Terminating {
			term = append(term, e)
		}
	}
	if len(ready) > 0 {
		return ready
	}
	return term
}

// Snapshot assembles a snapshot of node-a from ports of both families,
// each family's ports sorted by ID.
func Snapshot(ports ...*model.ServicePort) *model.Snapshot {
	byFamily := map[model.Family][]*model.ServicePort{}
	for _, sp := range ports {
		byFamily[sp.Family] = append(byFamily[sp.Family], sp)
	}
	for _, fp := range byFamily {
		slices.SortFunc(fp, func(a, b *model.ServicePort) int {
			if a.ID.Less(b.ID) {
				return -1
			}
			return 1
		})
	}
	return &model.Snapshot{Node: Node(),
		V4: model.NewFamilySnapshot(model.IPv4, byFamily[model.IPv4]),
		V6: model.NewFamilySnapshot(model.IPv6, byFamily[model.IPv6]),
	}
}
