package model

import (
	"net/netip"
	"reflect"
	"slices"
	"testing"

	"github.com/kproxy/kproxy/internal/objects"
)

func TestDualStackFamilySplit(t *testing.T) {
	svc := newSvc("web", func(s *objects.Service) {
		s.Type = objects.ServiceTypeLB
		s.ClusterIPs = []string{"fd00::10", "198.18.0.10"}
		s.Ports = []objects.ServicePort{{Name: "http", Port: 80, NodePort: 30080}, {Name: "dns", Protocol: "UDP", Port: 53, NodePort: 30053}}
		s.ExternalIPs = []string{"198.18.5.1", "fd00::5:1", "198.18.5.2"}
		s.LoadBalancerIngress = []objects.LoadBalancerIngress{
			{IP: "198.18.6.1"}, {IP: "fd00::6:1", IPMode: "VIP"}, {IP: "198.18.6.2", IPMode: "Proxy"}, {IP: "fd00::6:2", IPMode: "Proxy"},
		}
		s.LoadBalancerSourceRanges = []string{"198.18.0.0/16", " fd00::/8 "}
	})
	in := makeInput(nil, []*objects.Service{svc},
		newSlice("web", "web-v4", "IPv4", []objects.EndpointPort{{Name: "http", Port: 8080}, {Name: "dns", Protocol: "UDP", Port: 5353}},
			ep("198.18.1.1"), ep("198.18.1.2")),
		newSlice("web", "web-v6", "IPv6", []objects.EndpointPort{{Name: "http", Port: 8080}},
			ep("fd00::1:1")),
	)
	s, probs := Build(in)
	if len(probs) != 0 {
		t.Fatalf("problems: %v", probs)
	}
	type want struct {
		id             string
		clusterIP, eps string
		ext, lb        []netip.Addr
		ranges         []netip.Prefix
	}
	check := func(fs *FamilySnapshot, ws []want) {
		t.Helper()
		if len(fs.Ports) != len(ws) {
			t.Fatalf("%s: %d ports, want %d", fs.Family, len(fs.Ports), len(ws))
		}
		for i, w := range ws {
			p := fs.Ports[i]
			if p.ID.String() != w.id || p.ClusterIP.String() != w.clusterIP || epList(p.Endpoints) != w.eps ||
				!reflect.DeepEqual(p.ExternalIPs, w.ext) || !reflect.DeepEqual(p.LoadBalancerIPs, w.lb) ||
				!reflect.DeepEqual(p.SourceRanges, w.ranges) || p.Family != fs.Family || fs.Port(p.ID) != p {
				t.Errorf("%s port %d: got %+v, want %+v", fs.Family, i, p, w)
			}
		}
	}
	check(s.V4, []want{
		{"ns/web:dns", "198.18.0.10", "198.18.1.1:5353 198.18.1.2:5353", addrs("198.18.5.1", "198.18.5.2"), addrs("198.18.6.1"), prefixes("198.18.0.0/16")},
		{"ns/web:http", "198.18.0.10", "198.18.1.1:8080 198.18.1.2:8080", addrs("198.18.5.1", "198.18.5.2"), addrs("198.18.6.1"), prefixes("198.18.0.0/16")},
	})
	check(s.V6, []want{
		{"ns/web:dns", "fd00::10", "", addrs("fd00::5:1"), addrs("fd00::6:1"), prefixes("fd00::/8")},
		{"ns/web:http", "fd00::10", "[fd00::1:1]:8080", addrs("fd00::5:1"), addrs("fd00::6:1"), prefixes("fd00::/8")},
	})
	if p := s.V4.Ports[0]; p.Protocol != UDP || p.Port != 53 || p.NodePort != 30053 || p.ID.Protocol != UDP {
		t.Errorf("dns port fields: %+v", p)
	}
}

func TestSingleStack(t *testing.T) {
	in := makeInput(nil, []*objects.Service{newSvc("v6", func(s *objects.Service) { s.ClusterIPs = []string{"fd00::10"} })},
		newSlice("v6", "v4-slice", "IPv4", httpPort(80), ep("198.18.1.1")),
		newSlice("v6", "v6-slice", "IPv6", httpPort(80), ep("fd00::1")))
	s, _ := Build(in)
	if len(s.V4.Ports) != 0 || len(s.V6.Ports) != 1 || epList(s.V6.Ports[0].Endpoints) != "[fd00::1]:80" {
		t.Fatalf("v4 %v v6 %v", s.V4.Ports, s.V6.Ports)
	}
}

func TestSourceRanges(t *testing.T) {
	cases := []struct {
		name   string
		ranges []string
		v4, v6 []netip.Prefix
		probs  int
	}{
		{"none", nil, nil, nil, 0},
		{"host bits masked", []string{"198.18.3.7/24"}, prefixes("198.18.3.0/24"), nil, 0},
		{"other family only leaves this family open", []string{"fd00::/64"}, nil, prefixes("fd00::/64"), 0},
		{"invalid entries ignored", []string{"bogus", "198.18.0.0/16", "198.18.0.0/33"}, prefixes("198.18.0.0/16"), nil, 2},
		{"all invalid: no restriction", []string{"bogus"}, nil, nil, 1},
		{"zero prefix opens its family only", []string{"0.0.0.0/0", "198.18.0.0/16", "fd00::/8"}, nil, prefixes("fd00::/8"), 0},
		{"v6 zero prefix", []string{"198.18.0.0/16", "::/0"}, prefixes("198.18.0.0/16"), nil, 0},
		{"leading zeros are read as upstream does", []string{"198.018.0.0/16"}, prefixes("198.18.0.0/16"), nil, 0},
		{"blank skipped silently", []string{"  ", "198.18.0.0/16"}, prefixes("198.18.0.0/16"), nil, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			svc := newSvc("lb", func(s *objects.Service) {
				s.Type = objects.ServiceTypeLB
				s.ClusterIPs = []string{"198.18.0.10", "fd00::10"}
				s.LoadBalancerSourceRanges = tc.ranges
			})
			s, probs := Build(makeInput(nil, []*objects.Service{svc}))
			if got := s.V4.Ports[0].SourceRanges; !reflect.DeepEqual(got, tc.v4) {
				t.Errorf("v4: got %v, want %v", got, tc.v4)
			}
			if got := s.V6.Ports[0].SourceRanges; !reflect.DeepEqual(got, tc.v6) {
				t.Errorf("v6: got %v, want %v", got, tc.v6)
			}
			if len(probs) != tc.probs {
				t.Errorf("problems: %v, want %d", probs, tc.probs)
			}
		})
	}
}

func TestServiceSemantics(t *testing.T) {
	cases := []struct {
		name      string
		mod       func(*objects.Service)
		affinity  int32
		epl, ipl  bool
		hcPort    uint16
		externals bool
	}{
		{name: "plain cluster IP", mod: func(*objects.Service) {}},
		{name: "affinity default timeout", mod: func(s *objects.Service) { s.SessionAffinity = "ClientIP" }, affinity: 10800},
		{name: "affinity explicit timeout", mod: func(s *objects.Service) { s.SessionAffinity = "ClientIP"; s.SessionAffinityTimeout = 60 }, affinity: 60},
		{name: "affinity None ignores timeout", mod: func(s *objects.Service) { s.SessionAffinity = "None"; s.SessionAffinityTimeout = 60 }},
		{name: "etp local on cluster IP without external IPs is ignored", mod: func(s *objects.Service) { s.ExternalTrafficPolicy = "Local" }},
		{name: "etp local on cluster IP with external IPs", mod: func(s *objects.Service) {
			s.ExternalTrafficPolicy = "Local"
			s.ExternalIPs = []string{"198.18.7.1"}
		}, epl: true, externals: true},
		{name: "etp local counts external IPs of any family", mod: func(s *objects.Service) {
			s.ExternalTrafficPolicy = "Local"
			s.ExternalIPs = []string{"fd00::7:1"}
		}, epl: true},
		{name: "etp local on node port, no health check", mod: func(s *objects.Service) {
			s.Type = objects.ServiceTypeNodePort
			s.ExternalTrafficPolicy = "Local"
			s.HealthCheckNodePort = 31000
			s.Ports[0].NodePort = 30080
		}, epl: true, externals: true},
		{name: "etp local on load balancer: health check", mod: func(s *objects.Service) {
			s.Type = objects.ServiceTypeLB
			s.ExternalTrafficPolicy = "Local"
			s.HealthCheckNodePort = 31000
		}, epl: true, hcPort: 31000},
		{name: "etp cluster load balancer: no health check", mod: func(s *objects.Service) {
			s.Type = objects.ServiceTypeLB
			s.HealthCheckNodePort = 31000
		}},
		{name: "itp local", mod: func(s *objects.Service) { s.InternalTrafficPolicy = "Local" }, ipl: true},
		{name: "empty type is cluster IP", mod: func(s *objects.Service) {
			s.Type = ""
			s.ExternalTrafficPolicy = "Local"
			s.ExternalIPs = []string{"198.18.7.1"}
		}, epl: true, externals: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, probs := onlyPort(t, makeInput(nil, []*objects.Service{newSvc("s", tc.mod)}), IPv4)
			if len(probs) != 0 {
				t.Errorf("problems: %v", probs)
			}
			if p.AffinityTimeout != tc.affinity || p.ExternalPolicyLocal != tc.epl || p.InternalPolicyLocal != tc.ipl ||
				p.HealthCheckNodePort != tc.hcPort || p.ExternallyAccessible() != tc.externals {
				t.Errorf("got affinity %d epl %v ipl %v hc %d external %v", p.AffinityTimeout, p.ExternalPolicyLocal,
					p.InternalPolicyLocal, p.HealthCheckNodePort, p.ExternallyAccessible())
			}
		})
	}
}

func TestSkippedServices(t *testing.T) {
	cases := map[string]func(*objects.Service){
		"external name":    func(s *objects.Service) { s.Type = objects.ServiceTypeExternal },
		"headless":         func(s *objects.Service) { s.ClusterIPs = []string{"None"} },
		"no cluster IP":    func(s *objects.Service) { s.ClusterIPs = nil },
		"empty cluster IP": func(s *objects.Service) { s.ClusterIPs = []string{""} },
		"no ports":         func(s *objects.Service) { s.Ports = nil },
	}
	for name, mod := range cases {
		in := makeInput(nil, []*objects.Service{newSvc("s", mod)}, newSlice("s", "s1", "IPv4", httpPort(80), ep("198.18.1.1")))
		in.Services[objects.Key{Namespace: "ns", Name: "nil"}] = nil
		s, probs := Build(in)
		if len(s.V4.Ports)+len(s.V6.Ports) != 0 || len(probs) != 0 {
			t.Errorf("%s: ports %v %v problems %v", name, s.V4.Ports, s.V6.Ports, probs)
		}
	}
}

func TestServiceProblems(t *testing.T) {
	cases := []struct {
		name  string
		mod   func(*objects.Service)
		ports int // ports still built, IPv4
		want  []string
	}{
		{"bad cluster IP, the other family still works", func(s *objects.Service) { s.ClusterIPs = []string{"bogus", "198.18.0.10"} },
			1, []string{"Service spec.clusterIPs"}},
		{"only a bad cluster IP", func(s *objects.Service) { s.ClusterIPs = []string{"300.1.1.1"} }, 0, []string{"Service spec.clusterIPs"}},
		{"zoned cluster IP", func(s *objects.Service) { s.ClusterIPs = []string{"fe80::1%eth0"} }, 0, []string{"Service spec.clusterIPs"}},
		{"port 0", func(s *objects.Service) { s.Ports = append(s.Ports, objects.ServicePort{Name: "x", Port: 0}) },
			1, []string{"Service spec.ports[1].port"}},
		{"port too big", func(s *objects.Service) { s.Ports[0].Port = 70000 }, 0, []string{"Service spec.ports[0].port"}},
		{"node port too big", func(s *objects.Service) { s.Ports[0].NodePort = 65536 }, 0, []string{"Service spec.ports[0].nodePort"}},
		{"negative node port", func(s *objects.Service) { s.Ports[0].NodePort = -1 }, 0, []string{"Service spec.ports[0].nodePort"}},
		{"unknown protocol", func(s *objects.Service) { s.Ports[0].Protocol = "ICMP" }, 0, []string{"Service spec.ports[0].protocol"}},
		{"duplicate port", func(s *objects.Service) { s.Ports = append(s.Ports, s.Ports[0]) }, 1, []string{"Service spec.ports[1]"}},
		{"bad external IP", func(s *objects.Service) { s.ExternalIPs = []string{"nope", "198.18.7.1"} }, 1, []string{"Service spec.externalIPs"}},
		{"bad ingress IP", func(s *objects.Service) {
			s.LoadBalancerIngress = []objects.LoadBalancerIngress{{IP: "x"}, {IP: "198.18.6.1", IPMode: "Weird"}}
		}, 1, []string{"Service status.loadBalancer.ingress", "Service status.loadBalancer.ingress"}},
		{"load balancer without health check port", func(s *objects.Service) {
			s.Type = objects.ServiceTypeLB
			s.ExternalTrafficPolicy = "Local"
		}, 1, []string{"Service spec.healthCheckNodePort"}},
		{"unknown policies and affinity", func(s *objects.Service) {
			s.ExternalTrafficPolicy, s.InternalTrafficPolicy, s.SessionAffinity = "Near", "Far", "Sticky"
		}, 1, []string{"Service spec.externalTrafficPolicy", "Service spec.internalTrafficPolicy", "Service spec.sessionAffinity"}},
		{"unknown type", func(s *objects.Service) { s.Type = "Magic" }, 1, []string{"Service spec.type"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			other := newSvc("other", func(s *objects.Service) { s.ClusterIPs = []string{"198.18.0.11"} })
			s, probs := Build(makeInput(nil, []*objects.Service{newSvc("s", tc.mod), other}))
			if got := problemFields(probs); !slices.Equal(got, tc.want) {
				t.Errorf("problems: got %q, want %q (%v)", got, tc.want, probs)
			}
			for _, p := range probs {
				if p.Object != (objects.Key{Namespace: "ns", Name: "s"}) || p.Reason == "" {
					t.Errorf("problem names the wrong object or no reason: %v", p)
				}
			}
			if s.V4.Port(PortID{Namespace: "ns", Name: "other", Port: "http", Protocol: TCP}) == nil {
				t.Errorf("another Service was affected")
			}
			if got := len(s.V4.Ports) - 1; got != tc.ports {
				t.Errorf("ports built: %d, want %d", got, tc.ports)
			}
			if !slices.Equal(s.Problems(), probs) {
				t.Errorf("Snapshot.Problems differs from Build's: %v", s.Problems())
			}
		})
	}
}

func TestNodeInfo(t *testing.T) {
	n := &objects.Node{
		Name: "node1", Labels: map[string]string{objects.LabelTopologyZone: "z1"},
		PodCIDRs: []string{"198.18.64.0/24", "fd00:64::/64", "bad"}, InternalIPs: []string{"198.18.0.1", "fd00::1"},
		ExternalIPs: []string{"198.19.0.1", "zzz"}, Deleting: true, ToBeDeleted: true,
	}
	got, probs := makeNodeInfo("node1", n)
	want := NodeInfo{Name: "node1", Known: true, Zone: "z1", PodCIDRs: prefixes("198.18.64.0/24", "fd00:64::/64"),
		InternalIPs: addrs("198.18.0.1", "fd00::1"), ExternalIPs: addrs("198.19.0.1"), Deleting: true, ToBeDeleted: true}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if fields := problemFields(probs); !slices.Equal(fields, []string{"Node spec.podCIDRs", "Node status.addresses[ExternalIP]"}) {
		t.Errorf("problems %v", probs)
	}
	s, _ := Build(Input{NodeName: "node1"})
	if !reflect.DeepEqual(s.Node, NodeInfo{Name: "node1"}) || s.V4 == nil || s.V6 == nil || s.V4.Port(PortID{}) != nil {
		t.Errorf("empty build: %+v", s)
	}
}

// TestIgnoreExternalIPs: with upstream's AllowServiceExternalIPs=false no
// port has external IPs, but a ClusterIP Service with some stays externally
// accessible (its cluster endpoints are used under internalTrafficPolicy
// Local, as upstream reads the field there); flipping the option rebuilds
// every port, and Update then equals Build.
func TestIgnoreExternalIPs(t *testing.T) {
	svc := newSvc("web", func(s *objects.Service) {
		s.ClusterIPs = []string{"198.18.0.10", "fd00::10"}
		s.ExternalIPs = []string{"198.18.5.1"}
		s.InternalTrafficPolicy = "Local"
	})
	other := newSvc("other", func(s *objects.Service) { s.ClusterIPs = []string{"198.18.0.11"} })
	in := makeInput(nil, []*objects.Service{svc, other},
		newSlice("web", "web-v4", "IPv4", httpPort(8080), ep("198.18.1.1")))
	kept, _ := Build(in)
	in.IgnoreExternalIPs = true
	s, probs := Build(in)
	if len(probs) != 0 {
		t.Fatalf("problems: %v", probs)
	}
	p := s.V4.Port(PortID{Namespace: "ns", Name: "web", Port: "http", Protocol: TCP})
	switch {
	case p == nil:
		t.Fatal("no IPv4 port")
	case len(p.ExternalIPs) != 0:
		t.Errorf("external IPs %v, want none", p.ExternalIPs)
	case !p.ExternallyAccessible() || !p.UsesClusterEndpoints() || epList(p.ClusterEndpoints) != "198.18.1.1:8080":
		t.Errorf("accessible %v, cluster endpoints %q: want true and the one endpoint", p.ExternallyAccessible(), epList(p.ClusterEndpoints))
	}
	if p6 := s.V6.Ports[0]; p6.ExternallyAccessible() {
		t.Errorf("IPv6 port externally accessible without IPv6 external IPs")
	}
	if kp := kept.V4.Port(p.ID); len(kp.ExternalIPs) != 1 || !kp.ExternallyAccessible() {
		t.Errorf("with the external IPs allowed: %v, accessible %v", kp.ExternalIPs, kp.ExternallyAccessible())
	}
	// Update from a snapshot made the other way rebuilds every port.
	up, _ := Update(kept, in, map[objects.Key]struct{}{})
	if got := up.V4.Port(p.ID); len(got.ExternalIPs) != 0 || !got.ExternallyAccessible() {
		t.Errorf("Update after the flip: external IPs %v", got.ExternalIPs)
	}
	in.IgnoreExternalIPs = false
	back, _ := Update(s, in, map[objects.Key]struct{}{})
	if got := back.V4.Port(p.ID); len(got.ExternalIPs) != 1 {
		t.Errorf("Update after flipping back: external IPs %v, want one", got.ExternalIPs)
	}
}
