package model

import (
	"net/netip"
	"testing"

	"github.com/kproxy/kproxy/internal/objects"
)

// tep is a test endpoint: address 198.18.1.<n>:80 with the given flags.
type tep struct {
	n                    byte
	ready, serving, term bool
	local                bool
	zoneHints, nodeHints []string
}

func (e tep) endpoint() *Endpoint {
	return &Endpoint{
		IP: netip.AddrFrom4([4]byte{198, 18, 1, e.n}), Port: 80,
		Ready: e.ready, Serving: e.serving, Terminating: e.term, IsLocal: e.local,
		Hints: hints(e.zoneHints, e.nodeHints),
	}
}

func hints(zones, nodes []string) *objects.Hints {
	if zones == nil && nodes == nil {
		return nil
	}
	return &objects.Hints{Zones: zones, Nodes: nodes}
}

// Endpoint kinds used below.
func ready(n byte) tep             { return tep{n: n, ready: true, serving: true} }
func localReady(n byte) tep        { return tep{n: n, ready: true, serving: true, local: true} }
func servTerm(n byte) tep          { return tep{n: n, serving: true, term: true} }
func localST(n byte) tep           { return tep{n: n, serving: true, term: true, local: true} }
func notServing(n byte) tep        { return tep{n: n, term: true} }
func notReadyNT(n byte) tep        { return tep{n: n} } // not ready, not terminating
func zoned(e tep, z ...string) tep { e.zoneHints = z; return e }
func noded(e tep, n ...string) tep { e.nodeHints = n; return e }

// eps lists "198.18.1.<n>:80" for each n.
func eps(ns ...byte) string {
	var out []*Endpoint
	for _, n := range ns {
		out = append(out, tep{n: n}.endpoint())
	}
	return epList(out)
}

// Port shapes: which policies apply.
var (
	clusterOnly = ServicePort{}                                           // ITP Cluster, not external
	itpLocal    = ServicePort{InternalPolicyLocal: true}                  // only Local
	etpLocal    = ServicePort{NodePort: 30000, ExternalPolicyLocal: true} // Cluster + Local
	itpEtpLocal = ServicePort{NodePort: 30000, ExternalPolicyLocal: true, InternalPolicyLocal: true}
	itpLocalExt = ServicePort{NodePort: 30000, InternalPolicyLocal: true} // Cluster (ext) + Local (int)
	etpNoExt    = ServicePort{ExternalPolicyLocal: true}                  // ETP Local, no frontend: Cluster only
)

func TestCategorize(t *testing.T) {
	cases := []struct {
		name      string
		port      ServicePort
		zone      string
		eps       []tep
		cluster   string
		local     string
		reachable string
		hasEps    bool
		mode      string
	}{
		{name: "no endpoints", port: clusterOnly},
		{name: "cluster: ready only", port: clusterOnly,
			eps:     []tep{ready(1), ready(2), servTerm(3), notReadyNT(4)},
			cluster: eps(1, 2), reachable: eps(1, 2), hasEps: true},
		{name: "cluster: no ready, serving terminating fallback", port: clusterOnly,
			eps:     []tep{servTerm(1), notServing(2), notReadyNT(3), servTerm(4)},
			cluster: eps(1, 4), reachable: eps(1, 4), hasEps: true},
		{name: "cluster: nothing usable", port: clusterOnly,
			eps: []tep{notServing(1), notReadyNT(2)}},
		{name: "cluster only ignores locality", port: clusterOnly,
			eps:     []tep{localReady(1), ready(2)},
			cluster: eps(1, 2), reachable: eps(1, 2), hasEps: true},
		{name: "itp local: local ready", port: itpLocal,
			eps:   []tep{localReady(1), ready(2), localST(3)},
			local: eps(1), reachable: eps(1), hasEps: true},
		{name: "itp local: local serving terminating fallback", port: itpLocal,
			eps:   []tep{ready(1), localST(2), localST(3), servTerm(4)},
			local: eps(2, 3), reachable: eps(2, 3), hasEps: true},
		{name: "itp local: remote only, still has endpoints", port: itpLocal,
			eps: []tep{ready(1), servTerm(2)}, hasEps: true},
		{name: "itp local: only remote terminating", port: itpLocal,
			eps: []tep{servTerm(1)}, hasEps: true},
		{name: "itp local: nothing usable", port: itpLocal,
			eps: []tep{notServing(1), tep{n: 2, local: true}}},
		{name: "etp local: cluster ready, local ready", port: etpLocal,
			eps:     []tep{localReady(1), ready(2), localST(3)},
			cluster: eps(1, 2), local: eps(1), reachable: eps(1, 2), hasEps: true},
		{name: "etp local: cluster ready, local falls back (union)", port: etpLocal,
			eps:     []tep{ready(1), localST(2), servTerm(3)},
			cluster: eps(1), local: eps(2), reachable: eps(1, 2), hasEps: true},
		{name: "etp local: both fall back", port: etpLocal,
			eps:     []tep{servTerm(1), localST(2)},
			cluster: eps(1, 2), local: eps(2), reachable: eps(1, 2), hasEps: true},
		{name: "etp local: no local endpoints", port: etpLocal,
			eps:     []tep{ready(1), ready(2)},
			cluster: eps(1, 2), reachable: eps(1, 2), hasEps: true},
		{name: "etp local: nothing usable", port: etpLocal,
			eps: []tep{notServing(1), notReadyNT(2)}},
		{name: "itp and etp local: short-circuit needs cluster set", port: itpEtpLocal,
			eps:     []tep{ready(1), localReady(2)},
			cluster: eps(1, 2), local: eps(2), reachable: eps(1, 2), hasEps: true},
		{name: "itp local with external frontend uses both", port: itpLocalExt,
			eps:     []tep{ready(1), servTerm(2)},
			cluster: eps(1), reachable: eps(1), hasEps: true},
		{name: "etp local without external frontend is cluster only", port: etpNoExt,
			eps:     []tep{ready(1), localReady(2)},
			cluster: eps(1, 2), reachable: eps(1, 2), hasEps: true},

		// Topology hints (cluster set only).
		{name: "zone hints: all hinted, one matches", port: clusterOnly, zone: "a",
			eps:     []tep{zoned(ready(1), "a"), zoned(ready(2), "b"), zoned(ready(3), "a", "b")},
			cluster: eps(1, 3), reachable: eps(1, 3), hasEps: true, mode: TopologyPreferSameZone},
		{name: "zone hints: unhinted non-ready endpoints do not matter", port: clusterOnly, zone: "a",
			eps:     []tep{zoned(ready(1), "a"), zoned(ready(2), "b"), servTerm(3)},
			cluster: eps(1), reachable: eps(1), hasEps: true, mode: TopologyPreferSameZone},
		{name: "zone hints: one ready endpoint unhinted", port: clusterOnly, zone: "a",
			eps:     []tep{zoned(ready(1), "a"), ready(2)},
			cluster: eps(1, 2), reachable: eps(1, 2), hasEps: true},
		{name: "zone hints: none for this zone", port: clusterOnly, zone: "c",
			eps:     []tep{zoned(ready(1), "a"), zoned(ready(2), "b")},
			cluster: eps(1, 2), reachable: eps(1, 2), hasEps: true},
		{name: "zone hints: node zone unknown", port: clusterOnly, zone: "",
			eps:     []tep{zoned(ready(1), "a"), zoned(ready(2), "b")},
			cluster: eps(1, 2), reachable: eps(1, 2), hasEps: true},
		{name: "zone hints: no ready endpoint, fallback ignores hints", port: clusterOnly, zone: "a",
			eps:     []tep{zoned(servTerm(1), "b"), zoned(servTerm(2), "a")},
			cluster: eps(1, 2), reachable: eps(1, 2), hasEps: true},
		{name: "node hints: all hinted, one for this node", port: clusterOnly, zone: "a",
			eps: []tep{
				noded(zoned(ready(1), "a"), "node1"), noded(zoned(ready(2), "a"), "node2"),
				noded(zoned(ready(3), "b"), "node3")},
			cluster: eps(1), reachable: eps(1), hasEps: true, mode: TopologyPreferSameNode},
		{name: "node hints: none for this node falls to zone", port: clusterOnly, zone: "a",
			eps: []tep{
				noded(zoned(ready(1), "a"), "node2"), noded(zoned(ready(2), "b"), "node3")},
			cluster: eps(1), reachable: eps(1), hasEps: true, mode: TopologyPreferSameZone},
		{name: "node hints: one unhinted falls to zone", port: clusterOnly, zone: "b",
			eps: []tep{
				noded(zoned(ready(1), "a"), "node1"), zoned(ready(2), "b")},
			cluster: eps(2), reachable: eps(2), hasEps: true, mode: TopologyPreferSameZone},
		{name: "node hints without zone hints", port: clusterOnly, zone: "",
			eps:     []tep{noded(ready(1), "node1"), noded(ready(2), "node2")},
			cluster: eps(1), reachable: eps(1), hasEps: true, mode: TopologyPreferSameNode},
		{name: "topology with etp local: union of both sets", port: etpLocal, zone: "a",
			eps:     []tep{zoned(ready(1), "a"), zoned(localReady(2), "b")},
			cluster: eps(1), local: eps(2), reachable: eps(1, 2), hasEps: true, mode: TopologyPreferSameZone},
		{name: "topology not computed for local-only port", port: itpLocal, zone: "a",
			eps:   []tep{zoned(localReady(1), "b"), zoned(ready(2), "a")},
			local: eps(1), reachable: eps(1), hasEps: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.port
			for _, e := range tc.eps {
				p.Endpoints = append(p.Endpoints, e.endpoint())
			}
			categorize(&p, "node1", tc.zone)
			check := func(what, got, want string) {
				if got != want {
					t.Errorf("%s: got [%s], want [%s]", what, got, want)
				}
			}
			check("cluster", epList(p.ClusterEndpoints), tc.cluster)
			check("local", epList(p.LocalEndpoints), tc.local)
			check("reachable", epList(p.AllReachable), tc.reachable)
			check("mode", p.TopologyMode, tc.mode)
			if p.HasEndpoints != tc.hasEps {
				t.Errorf("HasEndpoints: got %v, want %v", p.HasEndpoints, tc.hasEps)
			}
			for _, l := range [][]*Endpoint{p.ClusterEndpoints, p.LocalEndpoints, p.AllReachable} {
				if l != nil && len(l) == 0 {
					t.Errorf("empty list is not nil")
				}
			}
		})
	}
}

func TestPolicyUse(t *testing.T) {
	cases := []struct {
		name                   string
		port                   ServicePort
		usesCluster, usesLocal bool
	}{
		{"cluster only", clusterOnly, true, false},
		{"itp local", itpLocal, false, true},
		{"etp local", etpLocal, true, true},
		{"itp+etp local external", itpEtpLocal, true, true},
		{"itp local external cluster etp", itpLocalExt, true, true},
		{"etp local without frontend", etpNoExt, true, false},
		{"etp local via external IP", ServicePort{ExternalPolicyLocal: true, ExternalIPs: addrs("198.18.9.9")}, true, true},
		{"etp local via LB IP", ServicePort{ExternalPolicyLocal: true, LoadBalancerIPs: addrs("198.18.9.9")}, true, true},
	}
	for _, tc := range cases {
		if got := tc.port.UsesClusterEndpoints(); got != tc.usesCluster {
			t.Errorf("%s: UsesClusterEndpoints %v, want %v", tc.name, got, tc.usesCluster)
		}
		if got := tc.port.UsesLocalEndpoints(); got != tc.usesLocal {
			t.Errorf("%s: UsesLocalEndpoints %v, want %v", tc.name, got, tc.usesLocal)
		}
	}
}
