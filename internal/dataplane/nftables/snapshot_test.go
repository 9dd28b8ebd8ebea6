package nftables

import (
	"net/netip"
	"slices"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/model"
)

// Test addresses: the node is 198.18.0.2 with pod CIDR 198.18.64.0/24
// (local pods) in cluster CIDR 198.18.64.0/18; remote pods are in
// 198.18.65.0/24; Services are in 198.19.0.0/24; LB and external IPs in
// 198.19.100.0/24; "external" clients in 198.18.200.0/24.
var (
	nodeIP     = netip.MustParseAddr("198.18.0.2")
	nodeIP6    = netip.MustParseAddr("fd00::2")
	podCIDR    = netip.MustParsePrefix("198.18.64.0/24")
	podCIDR6   = netip.MustParsePrefix("fd00:64::/64")
	clusterNet = netip.MustParsePrefix("198.18.64.0/18")
)

func testConfig() dataplane.Config {
	return dataplane.Config{
		Families:      []model.Family{model.IPv4},
		MasqueradeBit: 14,
		LocalMode:     dataplane.LocalClusterCIDR,
		ClusterCIDRs:  []netip.Prefix{clusterNet, netip.MustParsePrefix("fd00:64::/48")},
		NodeIPs:       []netip.Addr{nodeIP, nodeIP6},
	}
}

func testNode() model.NodeInfo {
	return model.NodeInfo{Name: "node-a", Known: true, PodCIDRs: []netip.Prefix{podCIDR, podCIDR6},
		InternalIPs: []netip.Addr{nodeIP, nodeIP6}}
}

// ep builds an endpoint; local endpoints run on node-a.
func ep(ip string, port uint16, local bool) *model.Endpoint {
	e := &model.Endpoint{IP: netip.MustParseAddr(ip), Port: port, Ready: true, Serving: true, NodeName: "node-b", IsLocal: local}
	if local {
		e.NodeName = "node-a"
	}
	return e
}

func terminating(e *model.Endpoint) *model.Endpoint {
	e.Ready, e.Terminating = false, true
	return e
}

// svc builds a service port; fill in features with the option functions.
func svc(ns, name string, clusterIP string, port uint16, opts ...func(*model.ServicePort)) *model.ServicePort {
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
	categorize(sp)
	return sp
}

func withEPs(eps ...*model.Endpoint) func(*model.ServicePort) {
	return func(sp *model.ServicePort) { sp.Endpoints = eps }
}
func withNodePort(np uint16) func(*model.ServicePort) {
	return func(sp *model.ServicePort) { sp.NodePort = np }
}
func withLB(ips ...string) func(*model.ServicePort) {
	return func(sp *model.ServicePort) {
		for _, ip := range ips {
			sp.LoadBalancerIPs = append(sp.LoadBalancerIPs, netip.MustParseAddr(ip))
		}
	}
}
func withExternalIPs(ips ...string) func(*model.ServicePort) {
	return func(sp *model.ServicePort) {
		for _, ip := range ips {
			sp.ExternalIPs = append(sp.ExternalIPs, netip.MustParseAddr(ip))
		}
	}
}
func withSourceRanges(cidrs ...string) func(*model.ServicePort) {
	return func(sp *model.ServicePort) {
		for _, c := range cidrs {
			sp.SourceRanges = append(sp.SourceRanges, netip.MustParsePrefix(c))
		}
	}
}
func withProto(p model.Protocol) func(*model.ServicePort) {
	return func(sp *model.ServicePort) { sp.Protocol, sp.ID.Protocol = p, p }
}
func withAffinity(seconds int32) func(*model.ServicePort) {
	return func(sp *model.ServicePort) { sp.AffinityTimeout = seconds }
}
func withETPLocal(sp *model.ServicePort) {
	sp.ExternalPolicyLocal = true
	sp.HealthCheckNodePort = 30999
}
func withITPLocal(sp *model.ServicePort) { sp.InternalPolicyLocal = true }

// categorize fills the endpoint categories the way upstream's
// CategorizeEndpoints does (without topology), so that tests do not depend
// on the model package's implementation.
func categorize(sp *model.ServicePort) {
	usable := func(local bool) []*model.Endpoint {
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
	externally := sp.ExternallyAccessible()
	usesCluster := !sp.InternalPolicyLocal || externally
	usesLocal := sp.InternalPolicyLocal || (sp.ExternalPolicyLocal && externally)
	sp.ClusterEndpoints, sp.LocalEndpoints, sp.AllReachable = nil, nil, nil
	if usesCluster {
		sp.ClusterEndpoints = usable(false)
	}
	sp.HasEndpoints = len(usable(false)) > 0
	if usesLocal {
		sp.LocalEndpoints = usable(true)
	}
	sp.AllReachable = slices.Clone(sp.ClusterEndpoints)
	for _, e := range sp.LocalEndpoints {
		if !slices.Contains(sp.AllReachable, e) {
			sp.AllReachable = append(sp.AllReachable, e)
		}
	}
	for _, e := range sp.LocalEndpoints {
		if e.Ready {
			sp.LocalReadyEndpoints++
		}
	}
}

// snapshot assembles a Snapshot from ports of both families.
func snapshot(ports ...*model.ServicePort) *model.Snapshot {
	s := &model.Snapshot{Node: testNode(),
		V4: &model.FamilySnapshot{Family: model.IPv4, ByID: map[model.PortID]*model.ServicePort{}},
		V6: &model.FamilySnapshot{Family: model.IPv6, ByID: map[model.PortID]*model.ServicePort{}},
	}
	for _, sp := range ports {
		fs := s.Family(sp.Family)
		fs.Ports = append(fs.Ports, sp)
		fs.ByID[sp.ID] = sp
	}
	for _, fs := range []*model.FamilySnapshot{s.V4, s.V6} {
		slices.SortFunc(fs.Ports, func(a, b *model.ServicePort) int {
			if a.ID.Less(b.ID) {
				return -1
			}
			return 1
		})
	}
	return s
}
