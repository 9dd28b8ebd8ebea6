package model

import (
	"fmt"
	"testing"

	"github.com/kproxy/kproxy/internal/objects"
)

// TestTopologyFromHintsOnly checks that, as in upstream kube-proxy, only the
// slices' hints steer topology: spec.trafficDistribution (and the
// service.kubernetes.io/topology-mode annotation, which the slim Service
// does not even carry) tell the EndpointSlice controller to write hints,
// and have no effect on the proxy by themselves.
func TestTopologyFromHintsOnly(t *testing.T) {
	hints := func(e *objects.Endpoint) *objects.Hints {
		if e.Hints == nil {
			e.Hints = &objects.Hints{}
		}
		return e.Hints
	}
	zone := func(z string) func(*objects.Endpoint) {
		return func(e *objects.Endpoint) { hints(e).Zones = []string{z} }
	}
	node := func(n string) func(*objects.Endpoint) {
		return func(e *objects.Endpoint) { hints(e).Nodes = []string{n} }
	}
	cases := []struct {
		name    string
		dist    string
		eps     []objects.Endpoint
		want    string
		wantTop string
	}{
		{"PreferSameZone without hints", TopologyPreferSameZone,
			[]objects.Endpoint{ep("198.18.1.1"), ep("198.18.1.2")}, "198.18.1.1:80 198.18.1.2:80", ""},
		{"PreferSameNode without hints", TopologyPreferSameNode,
			[]objects.Endpoint{ep("198.18.1.1", onNode("node1")), ep("198.18.1.2")}, "198.18.1.1:80 198.18.1.2:80", ""},
		{"zone hints without trafficDistribution", "",
			[]objects.Endpoint{ep("198.18.1.1", zone("z1")), ep("198.18.1.2", zone("z2"))}, "198.18.1.1:80", TopologyPreferSameZone},
		{"node hints without trafficDistribution", "",
			[]objects.Endpoint{ep("198.18.1.1", node("node1"), zone("z2")), ep("198.18.1.2", node("n2"), zone("z1"))}, "198.18.1.1:80", TopologyPreferSameNode},
		{"node hints for other nodes fall back to zone hints", TopologyPreferSameNode,
			[]objects.Endpoint{ep("198.18.1.1", node("n3"), zone("z2")), ep("198.18.1.2", node("n2"), zone("z1"))}, "198.18.1.2:80", TopologyPreferSameZone},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			svc := newSvc("s", func(s *objects.Service) { s.TrafficDistribution = tc.dist })
			in := makeInput(zoneNode("z1"), []*objects.Service{svc}, newSlice("s", "a", "IPv4", httpPort(80), tc.eps...))
			p, _ := onlyPort(t, in, IPv4)
			if got := epList(p.ClusterEndpoints); got != tc.want || p.TopologyMode != tc.wantTop {
				t.Errorf("cluster endpoints %q (topology %q), want %q (%q)", got, p.TopologyMode, tc.want, tc.wantTop)
			}
		})
	}
}

// TestHealthCheckNodePortOnlyForLocalLoadBalancer: upstream serves a
// health-check node port only for type LoadBalancer with
// externalTrafficPolicy Local, whatever spec.healthCheckNodePort holds.
func TestHealthCheckNodePortOnlyForLocalLoadBalancer(t *testing.T) {
	cases := []struct {
		typ, etp string
		want     uint16
	}{
		{objects.ServiceTypeLB, objects.PolicyLocal, 32000},
		{objects.ServiceTypeLB, objects.PolicyCluster, 0},
		{objects.ServiceTypeNodePort, objects.PolicyLocal, 0},
		{objects.ServiceTypeClusterIP, objects.PolicyLocal, 0},
	}
	for _, tc := range cases {
		svc := newSvc("s", func(s *objects.Service) {
			s.Type, s.ExternalTrafficPolicy, s.HealthCheckNodePort = tc.typ, tc.etp, 32000
			s.ExternalIPs = []string{"198.18.9.1"}
			if tc.typ != objects.ServiceTypeClusterIP {
				s.Ports[0].NodePort = 30080
			}
		})
		p, probs := onlyPort(t, makeInput(nil, []*objects.Service{svc}), IPv4)
		if p.HealthCheckNodePort != tc.want || len(probs) != 0 {
			t.Errorf("%s/%s: health-check node port %d, want %d (problems %v)", tc.typ, tc.etp, p.HealthCheckNodePort, tc.want, probs)
		}
	}
}

// TestHugeSlices builds a Service with large, overlapping slices next to a
// small one: duplicates are dropped with a problem each, and the other
// Service is unaffected.
func TestHugeSlices(t *testing.T) {
	const perSlice = 4000
	var slices []*objects.EndpointSlice
	for s := range 3 {
		eps := make([]objects.Endpoint, perSlice)
		for i := range eps {
			// Slices overlap by half: slice s holds endpoints s*perSlice/2 ...
			n := s*perSlice/2 + i
			eps[i] = ep(fmt.Sprintf("198.19.%d.%d", n/250, n%250+1))
		}
		slices = append(slices, newSlice("big", fmt.Sprintf("big-%d", s), "IPv4", httpPort(80), eps...))
	}
	slices = append(slices, newSlice("small", "small-a", "IPv4", httpPort(80), ep("198.18.1.1")))
	in := makeInput(nil, []*objects.Service{newSvc("big"), newSvc("small", func(s *objects.Service) { s.ClusterIPs = []string{"198.18.0.11"} })}, slices...)
	s, probs := Build(in)
	big := s.V4.Port(PortID{Namespace: "ns", Name: "big", Port: "http", Protocol: TCP})
	small := s.V4.Port(PortID{Namespace: "ns", Name: "small", Port: "http", Protocol: TCP})
	if want := 2 * perSlice; big == nil || len(big.Endpoints) != want {
		t.Fatalf("big: %d endpoints, want %d", len(big.Endpoints), want)
	}
	if len(probs) != perSlice {
		t.Errorf("%d problems, want one per duplicate (%d)", len(probs), perSlice)
	}
	if small == nil || epList(small.ClusterEndpoints) != "198.18.1.1:80" {
		t.Errorf("small Service affected: %+v", small)
	}
}
