// Package netbed builds the e2e testbed's network out of network namespaces:
// a hub namespace holding the "node network" bridge, node namespaces with
// their own pod bridge and pod CIDR, pods running the echo server, and
// external clients on the node network. Nothing is created in the root
// namespace unless Layout.Host4/Host6 ask for a link to it.
//
// Every name starts with a per-run prefix ("kpt<pid>-" by default), so
// leftovers and parallel runs do not collide, and Teardown removes everything
// by that prefix and stops only the processes this Bed started, by PID.
package netbed

import (
	"fmt"
	"net/netip"
)

// The only address space the testbed may use (network safety rules).
var (
	AllowedV4 = netip.MustParsePrefix("198.18.0.0/15")
	AllowedV6 = netip.MustParsePrefix("fd00::/8")
)

// Layout is the address plan of one testbed. Every address and prefix must
// lie inside AllowedV4 or AllowedV6.
type Layout struct {
	// NodeNet4/NodeNet6 are the node network's subnets (the hub bridge).
	NodeNet4 netip.Prefix
	NodeNet6 netip.Prefix
	// Supernet4/Supernet6 cover everything the testbed routes (node network,
	// pod CIDRs, Service ranges). Nodes route them on-link on the node
	// network, pods via their node: this is the only "wide" route anywhere.
	Supernet4 netip.Prefix
	Supernet6 netip.Prefix
	// Host4/Host6, when valid, join the root namespace to the node network
	// with these addresses (a veth named <prefix>h), so that services in the
	// root namespace, such as the API server, are reachable from the nodes.
	// Up refuses when the node network overlaps an address the root namespace
	// already has. With Host4 the root namespace also gets a blackhole route
	// for Supernet4 (unless one exists), so testbed traffic never leaves the
	// machine. No IPv6 blackhole is added: hosts often use fd00::/64 (this
	// one does), so prefer leaving Host6 unset.
	Host4   netip.Addr
	Host6   netip.Addr
	Nodes   []NodeSpec
	Clients []HostSpec
}

// NodeSpec is one node namespace.
type NodeSpec struct {
	Name     string // also the Kubernetes Node name
	IP4, IP6 netip.Addr
	// PodCIDR4/PodCIDR6: the node's pod bridge takes the first address of
	// each, pods get the following ones.
	PodCIDR4, PodCIDR6 netip.Prefix
	Zone               string // topology.kubernetes.io/zone, for the API objects
}

// HostSpec is a namespace with one address per family on the node network.
type HostSpec struct {
	Name     string
	IP4, IP6 netip.Addr
}

// The cluster CIDRs holding DefaultLayout's pod CIDRs (kproxy's --cluster-cidr).
var (
	ClusterCIDR4 = netip.MustParsePrefix("198.18.16.0/20")
	ClusterCIDR6 = netip.MustParsePrefix("fd00:0:0:100::/56")
)

// DefaultLayout is a two-node, one-client dual-stack plan:
//
//	node network   198.18.0.0/24, fd00:0:0:10::/64 (nodes .11/.12 and ::11/::12, client .100 and ::100)
//	pod CIDRs      198.18.17.0/24, 198.18.18.0/24, fd00:0:0:101::/64, fd00:0:0:102::/64
//	               (inside the cluster CIDRs ClusterCIDR4/ClusterCIDR6)
//	supernets      198.18.0.0/15, fd00::/48 (Service ranges live in them too)
func DefaultLayout() Layout {
	a, p := netip.MustParseAddr, netip.MustParsePrefix
	return Layout{
		NodeNet4: p("198.18.0.0/24"), NodeNet6: p("fd00:0:0:10::/64"),
		Supernet4: p("198.18.0.0/15"), Supernet6: p("fd00::/48"),
		Nodes: []NodeSpec{
			{Name: "node1", IP4: a("198.18.0.11"), IP6: a("fd00:0:0:10::11"),
				PodCIDR4: p("198.18.17.0/24"), PodCIDR6: p("fd00:0:0:101::/64"), Zone: "zone-a"},
			{Name: "node2", IP4: a("198.18.0.12"), IP6: a("fd00:0:0:10::12"),
				PodCIDR4: p("198.18.18.0/24"), PodCIDR6: p("fd00:0:0:102::/64"), Zone: "zone-b"},
		},
		Clients: []HostSpec{{Name: "client", IP4: a("198.18.0.100"), IP6: a("fd00:0:0:10::100")}},
	}
}

// Validate checks that every address is in the allowed space and inside the
// subnet it belongs to, and that names are unique and non-empty.
func (l Layout) Validate() error {
	var errs []error
	check := func(what string, ok bool) {
		if !ok {
			errs = append(errs, fmt.Errorf("netbed: %s", what))
		}
	}
	check("NodeNet4 must be in "+AllowedV4.String(), inside(l.NodeNet4, AllowedV4))
	check("NodeNet6 must be in "+AllowedV6.String(), inside(l.NodeNet6, AllowedV6))
	check("Supernet4 must be in "+AllowedV4.String(), inside(l.Supernet4, AllowedV4))
	check("Supernet6 must be in "+AllowedV6.String(), inside(l.Supernet6, AllowedV6))
	check("Host4 must be on NodeNet4", !l.Host4.IsValid() || l.NodeNet4.Contains(l.Host4))
	check("Host6 must be on NodeNet6", !l.Host6.IsValid() || l.NodeNet6.Contains(l.Host6))
	check("at least one node", len(l.Nodes) > 0)
	seen := map[string]bool{"hub": true}
	for _, n := range l.Nodes {
		check(fmt.Sprintf("node name %q empty or duplicate", n.Name), n.Name != "" && !seen[n.Name])
		seen[n.Name] = true
		check(n.Name+": IP4 must be on NodeNet4", l.NodeNet4.Contains(n.IP4))
		check(n.Name+": IP6 must be on NodeNet6", l.NodeNet6.Contains(n.IP6))
		check(n.Name+": PodCIDR4 must be in Supernet4", inside(n.PodCIDR4, l.Supernet4))
		check(n.Name+": PodCIDR6 must be in Supernet6", inside(n.PodCIDR6, l.Supernet6))
	}
	for _, c := range l.Clients {
		check(fmt.Sprintf("client name %q empty or duplicate", c.Name), c.Name != "" && !seen[c.Name])
		seen[c.Name] = true
		check(c.Name+": IP4 must be on NodeNet4", l.NodeNet4.Contains(c.IP4))
		check(c.Name+": IP6 must be on NodeNet6", l.NodeNet6.Contains(c.IP6))
	}
	if len(errs) > 0 {
		return fmt.Errorf("netbed: invalid layout: %v", errs)
	}
	return nil
}

// inside reports whether prefix p is valid and lies within outer.
func inside(p, outer netip.Prefix) bool {
	return p.IsValid() && p.Bits() >= outer.Bits() && outer.Contains(p.Addr())
}
