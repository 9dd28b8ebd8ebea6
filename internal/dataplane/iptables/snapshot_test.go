package iptables

import (
	"net/netip"
	"slices"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/model"
)

// Test addresses: node 198.18.0.2, local pods 198.18.64.0/24 inside cluster
// CIDR 198.18.64.0/18, remote pods 198.18.65.0/24, Services 198.19.0.0/24,
// LB and external IPs 198.19.100.0/24, external clients 198.18.200.0/24.
var (
	nodeIP     = netip.MustParseAddr("198.18.0.2")
	nodeIP6    = netip.MustParseAddr("fd00::2")
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

func testParams() Params { return Params{Config: testConfig(), LocalhostNodePorts: true} }

func testNode() model.NodeInfo {
	return model.NodeInfo{Name: "node-a", Known: true,
		PodCIDRs:    []netip.Prefix{netip.MustParsePrefix("198.18.64.0/24"), netip.MustParsePrefix("fd00:64::/64")},
		InternalIPs: []netip.Addr{nodeIP, nodeIP6}}
}

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

type spOpt func(*model.ServicePort)

func svc(ns, name, clusterIP string, port uint16, opts ...spOpt) *model.ServicePort {
	sp := &model.ServicePort{ID: model.PortID{Namespace: ns, Name: name, Port: "p", Protocol: model.TCP},
		Family: model.IPv4, Protocol: model.TCP, Port: port}
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

func withEPs(eps ...*model.Endpoint) spOpt { return func(sp *model.ServicePort) { sp.Endpoints = eps } }
func withNodePort(np uint16) spOpt         { return func(sp *model.ServicePort) { sp.NodePort = np } }
func withLB(ips ...string) spOpt {
	return func(sp *model.ServicePort) {
		for _, ip := range ips {
			sp.LoadBalancerIPs = append(sp.LoadBalancerIPs, netip.MustParseAddr(ip))
		}
	}
}
func withExternalIPs(ips ...string) spOpt {
	return func(sp *model.ServicePort) {
		for _, ip := range ips {
			sp.ExternalIPs = append(sp.ExternalIPs, netip.MustParseAddr(ip))
		}
	}
}
func withSourceRanges(cidrs ...string) spOpt {
	return func(sp *model.ServicePort) {
		for _, c := range cidrs {
			sp.SourceRanges = append(sp.SourceRanges, netip.MustParsePrefix(c))
		}
	}
}
func withProto(p model.Protocol) spOpt {
	return func(sp *model.ServicePort) { sp.Protocol, sp.ID.Protocol = p, p }
}
func withAffinity(s int32) spOpt { return func(sp *model.ServicePort) { sp.AffinityTimeout = s } }
func withETPLocal(sp *model.ServicePort) {
	sp.ExternalPolicyLocal = true
	sp.HealthCheckNodePort = 30999
}
func withITPLocal(sp *model.ServicePort) { sp.InternalPolicyLocal = true }

// categorize fills the endpoint categories as upstream's
// CategorizeEndpoints does (no topology), independent of package model.
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
	ext := sp.ExternallyAccessible()
	usesCluster := !sp.InternalPolicyLocal || ext
	usesLocal := sp.InternalPolicyLocal || (sp.ExternalPolicyLocal && ext)
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
}

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

// featureSnapshot exercises every feature once.
func featureSnapshot() *model.Snapshot {
	return snapshot(
		svc("ns", "plain", "198.19.0.1", 80, withEPs(ep("198.18.64.10", 8080, true), ep("198.18.65.10", 8080, false))),
		svc("ns", "udp", "198.19.0.2", 53, withProto(model.UDP), withEPs(ep("198.18.65.11", 53, false))),
		svc("ns", "empty", "198.19.0.3", 80, withNodePort(30003), withExternalIPs("198.19.100.3")),
		svc("ns", "np", "198.19.0.4", 80, withNodePort(30004), withEPs(ep("198.18.65.12", 80, false))),
		svc("ns", "lb", "198.19.0.5", 80, withNodePort(30005), withLB("198.19.100.5"), withSourceRanges("198.18.200.0/24", "198.18.0.0/24"),
			withEPs(ep("198.18.65.13", 80, false))),
		svc("ns", "etp", "198.19.0.6", 80, withNodePort(30006), withLB("198.19.100.6"), withETPLocal,
			withEPs(ep("198.18.64.14", 80, true), ep("198.18.65.14", 80, false))),
		svc("ns", "etp-none", "198.19.0.7", 80, withNodePort(30007), withETPLocal, withEPs(ep("198.18.65.15", 80, false))),
		svc("ns", "itp", "198.19.0.8", 80, withITPLocal, withEPs(ep("198.18.65.16", 80, false))),
		svc("ns", "aff", "198.19.0.9", 80, withAffinity(600), withEPs(ep("198.18.64.17", 80, true), ep("198.18.65.17", 80, false))),
		svc("ns", "term", "198.19.0.10", 80, withEPs(terminating(ep("198.18.65.18", 80, false)))),
		svc("ns", "v6", "fd00:96::1", 80, withNodePort(30010), withEPs(ep("fd00:64::10", 8080, true))),
	)
}
