package explain

import (
	"errors"
	"io"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/objects"
)

// The bed: node1 (198.18.0.11, pods 198.18.17.0/24), node2's pods in
// 198.18.18.0/24, cluster CIDR 198.18.16.0/20, clients outside in
// 198.18.100.0/24.
var (
	node1    = netip.MustParseAddr("198.18.0.11")
	localPod = netip.MustParseAddr("198.18.17.10")
)

func ep(addr, node string, ready bool, hints ...string) objects.Endpoint {
	c := objects.CondTrue
	if !ready {
		c = objects.CondFalse
	}
	e := objects.Endpoint{Addr: netip.MustParseAddr(addr), Node: objects.OnNode(node), HasAddress: true, Ready: c, Serving: c, Terminating: objects.CondFalse}
	if len(hints) > 0 {
		e.Hints = &objects.Hints{Zones: hints}
	}
	return e
}

func terminating(addr, node string) objects.Endpoint {
	e := ep(addr, node, false)
	e.Serving, e.Terminating = objects.CondTrue, objects.CondTrue
	return e
}

// stopping is terminating and no longer serving.
func stopping(addr, node string) objects.Endpoint {
	e := ep(addr, node, false)
	e.Terminating = objects.CondTrue
	return e
}

type svcOpt func(*objects.Service)

func input(svcs map[string][]objects.Endpoint, opts map[string][]svcOpt) model.Input {
	in := model.Input{
		NodeName: "node1",
		Node: &objects.Node{Name: "node1", PodCIDRs: []string{"198.18.17.0/24"}, InternalIPs: []string{node1.String()},
			Labels: map[string]string{objects.LabelTopologyZone: "zone-a"}},
		Services: map[objects.Key]*objects.Service{},
		Slices:   map[objects.Key][]*objects.EndpointSlice{},
	}
	i := 0
	for name, eps := range svcs {
		i++
		s := &objects.Service{Namespace: "ns", Name: name, Type: "NodePort",
			ClusterIPs: []string{netip.AddrFrom4([4]byte{198, 18, 130, byte(i)}).String()},
			Ports:      []objects.ServicePort{{Name: "http", Protocol: "TCP", Port: 80, NodePort: int32(30000 + i)}}}
		for _, o := range opts[name] {
			o(s)
		}
		in.Services[s.Key()] = s
		in.Slices[s.Key()] = []*objects.EndpointSlice{{Namespace: "ns", Name: name + "-1", ServiceName: name, AddressType: "IPv4",
			Ports: []objects.EndpointPort{{Name: "http", Protocol: s.Ports[0].Protocol, Port: 8080}}, Endpoints: eps}}
	}
	return in
}

func balancing(name string) svcOpt {
	return func(s *objects.Service) { s.LoadBalancing = name }
}

// shPick is the endpoint source-hash gives client among eps, of port
// ns/a:http.
func shPick(client string, eps ...string) string {
	var list []*model.Endpoint
	for _, e := range eps {
		ap := netip.MustParseAddrPort(e)
		list = append(list, &model.Endpoint{IP: ap.Addr(), Port: ap.Port()})
	}
	sp := &model.ServicePort{ID: model.PortID{Namespace: "ns", Name: "a", Port: "http", Protocol: model.TCP}}
	return sp.SourceHashPick(list, netip.MustParseAddr(client)).AddrPort().String()
}

func cfg(mut ...func(*dataplane.Config)) dataplane.Config {
	c := dataplane.Config{Families: []model.Family{model.IPv4}, LocalMode: dataplane.LocalClusterCIDR,
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("198.18.16.0/20")}, NodeIPs: []netip.Addr{node1}}
	for _, m := range mut {
		m(&c)
	}
	return c
}

func TestExplain(t *testing.T) {
	two := []objects.Endpoint{ep("198.18.17.10", "node1", true), ep("198.18.18.10", "node2", true)}
	withLB := func(s *objects.Service) {
		s.Type = "LoadBalancer"
		s.LoadBalancerIngress = []objects.LoadBalancerIngress{{IP: "198.18.64.10"}}
	}
	etpLocal := func(s *objects.Service) { s.ExternalTrafficPolicy = "Local" }
	itpLocal := func(s *objects.Service) { s.InternalTrafficPolicy = "Local" }
	clusterIPOnly := func(s *objects.Service) { s.Type, s.Ports[0].NodePort = "ClusterIP", 0 }
	ranges := func(s *objects.Service) { s.LoadBalancerSourceRanges = []string{"198.18.100.0/24"} }
	udp := func(s *objects.Service) { s.Ports[0].Protocol = "UDP" }
	affinity := func(s *objects.Service) { s.SessionAffinity = "ClientIP"; s.SessionAffinityTimeout = 60 }
	for _, tc := range []struct {
		name     string
		svcs     map[string][]objects.Endpoint
		opts     map[string][]svcOpt
		cfg      dataplane.Config
		mode     string
		from, to string
		proto    model.Protocol
		// want
		verdict   Verdict
		frontend  string
		endpoints []string
		excluded  []string // "addr: substring of the reason"
		masq      bool
		reason    string // substring
	}{{
		name: "round-robin", svcs: map[string][]objects.Endpoint{"a": two}, opts: map[string][]svcOpt{"a": {balancing("round-robin")}},
		from: "198.18.17.10", to: "198.18.130.1:80",
		verdict: Forward, frontend: FrontendClusterIP, endpoints: []string{"198.18.17.10:8080", "198.18.18.10:8080"}, reason: "in turn",
	}, {
		// The client's endpoint, as the kernel's jhash and the model's
		// table give it (TestPrivilegedBalancing checks the kernel).
		name: "source-hash names the client's endpoint", svcs: map[string][]objects.Endpoint{"a": two}, opts: map[string][]svcOpt{"a": {balancing("source-hash")}},
		from: "198.18.100.7", to: "198.18.130.1:80",
		verdict: Forward, frontend: FrontendClusterIP, endpoints: []string{shPick("198.18.100.7", "198.18.17.10:8080", "198.18.18.10:8080")}, masq: true, reason: "source-hash sends every new connection from 198.18.100.7",
	}, {
		name: "clusterIP from a pod", svcs: map[string][]objects.Endpoint{"a": two},
		from: "198.18.17.10", to: "198.18.130.1:80",
		verdict: Forward, frontend: FrontendClusterIP, endpoints: []string{"198.18.17.10:8080", "198.18.18.10:8080"}, reason: "1/2",
	}, {
		name: "clusterIP from outside is masqueraded", svcs: map[string][]objects.Endpoint{"a": two},
		from: "198.18.100.1", to: "198.18.130.1:80",
		verdict: Forward, frontend: FrontendClusterIP, endpoints: []string{"198.18.17.10:8080", "198.18.18.10:8080"}, masq: true,
	}, {
		name: "masqueradeAll", svcs: map[string][]objects.Endpoint{"a": two}, cfg: cfg(func(c *dataplane.Config) { c.MasqueradeAll = true }),
		from: "198.18.17.10", to: "198.18.130.1:80",
		verdict: Forward, frontend: FrontendClusterIP, endpoints: []string{"198.18.17.10:8080", "198.18.18.10:8080"}, masq: true,
	}, {
		name: "nodePort, policy Cluster", svcs: map[string][]objects.Endpoint{"a": two},
		from: "198.18.100.1", to: "198.18.0.11:30001",
		verdict: Forward, frontend: FrontendNodePort, endpoints: []string{"198.18.17.10:8080", "198.18.18.10:8080"}, masq: true,
	}, {
		name: "nodePort, ETP Local with a local endpoint", svcs: map[string][]objects.Endpoint{"a": two}, opts: map[string][]svcOpt{"a": {etpLocal}},
		from: "198.18.100.1", to: "198.18.0.11:30001",
		verdict: Forward, frontend: FrontendNodePort, endpoints: []string{"198.18.17.10:8080"}, excluded: []string{"198.18.18.10:8080: another node"},
	}, {
		name: "nodePort, ETP Local without a local endpoint", svcs: map[string][]objects.Endpoint{"a": {ep("198.18.18.10", "node2", true)}}, opts: map[string][]svcOpt{"a": {etpLocal}},
		from: "198.18.100.1", to: "198.18.0.11:30001",
		verdict: Drop, frontend: FrontendNodePort, excluded: []string{"198.18.18.10:8080: another node"}, reason: "Local",
	}, {
		name: "ETP Local without a local endpoint, IPVS uses the cluster's", svcs: map[string][]objects.Endpoint{"a": {ep("198.18.18.10", "node2", true)}}, opts: map[string][]svcOpt{"a": {etpLocal}},
		mode: "ipvs", from: "198.18.100.1", to: "198.18.0.11:30001",
		verdict: Forward, frontend: FrontendNodePort, endpoints: []string{"198.18.18.10:8080"}, reason: "IPVS",
	}, {
		name: "ITP Local without a local endpoint, IPVS, externally accessible: the cluster's", svcs: map[string][]objects.Endpoint{"a": {ep("198.18.18.10", "node2", true)}}, opts: map[string][]svcOpt{"a": {itpLocal}},
		mode: "ipvs", from: "198.18.17.10", to: "198.18.130.1:80",
		verdict: Forward, frontend: FrontendClusterIP, endpoints: []string{"198.18.18.10:8080"}, reason: "IPVS",
	}, {
		name: "ITP Local without a local endpoint, IPVS, cluster-internal: rejected", svcs: map[string][]objects.Endpoint{"a": {ep("198.18.18.10", "node2", true)}}, opts: map[string][]svcOpt{"a": {itpLocal, clusterIPOnly}},
		mode: "ipvs", from: "198.18.17.10", to: "198.18.130.1:80",
		verdict: Reject, frontend: FrontendClusterIP, reason: "IPVS",
	}, {
		name: "ETP Local short-circuits a local pod", svcs: map[string][]objects.Endpoint{"a": {ep("198.18.18.10", "node2", true)}}, opts: map[string][]svcOpt{"a": {etpLocal}},
		from: "198.18.17.10", to: "198.18.0.11:30001",
		verdict: Forward, frontend: FrontendNodePort, endpoints: []string{"198.18.18.10:8080"},
	}, {
		name: "ITP Local without a local endpoint", svcs: map[string][]objects.Endpoint{"a": {ep("198.18.18.10", "node2", true)}}, opts: map[string][]svcOpt{"a": {itpLocal}},
		from: "198.18.17.10", to: "198.18.130.1:80",
		verdict: Drop, frontend: FrontendClusterIP, excluded: []string{"198.18.18.10:8080: another node"},
	}, {
		name: "no endpoints", svcs: map[string][]objects.Endpoint{"a": nil},
		from: "198.18.17.10", to: "198.18.130.1:80",
		verdict: Reject, frontend: FrontendClusterIP, reason: "no endpoints that can serve",
	}, {
		name: "only a not-ready endpoint counts as none", svcs: map[string][]objects.Endpoint{"a": {ep("198.18.18.10", "node2", false)}},
		from: "198.18.17.10", to: "198.18.130.1:80",
		verdict: Reject, frontend: FrontendClusterIP, excluded: []string{"198.18.18.10:8080: not ready"},
	}, {
		name: "endpoints, none usable", svcs: map[string][]objects.Endpoint{"a": {stopping("198.18.18.10", "node2")}},
		from: "198.18.17.10", to: "198.18.130.1:80",
		verdict: Reject, frontend: FrontendClusterIP, excluded: []string{"198.18.18.10:8080: not ready"},
	}, {
		name: "terminating left out while one is ready", svcs: map[string][]objects.Endpoint{"a": {ep("198.18.18.10", "node2", true), terminating("198.18.18.11", "node2")}},
		from: "198.18.17.10", to: "198.18.130.1:80",
		verdict: Forward, frontend: FrontendClusterIP, endpoints: []string{"198.18.18.10:8080"}, excluded: []string{"198.18.18.11:8080: terminating"},
	}, {
		name: "serving terminating used when nothing is ready", svcs: map[string][]objects.Endpoint{"a": {terminating("198.18.18.11", "node2")}},
		from: "198.18.17.10", to: "198.18.130.1:80",
		verdict: Forward, frontend: FrontendClusterIP, endpoints: []string{"198.18.18.11:8080"},
	}, {
		name: "source range drop", svcs: map[string][]objects.Endpoint{"a": two}, opts: map[string][]svcOpt{"a": {withLB, ranges}},
		from: "198.18.101.1", to: "198.18.64.10:80",
		verdict: Drop, frontend: FrontendLoadBalancer, reason: "loadBalancerSourceRanges",
	}, {
		name: "source range allowed", svcs: map[string][]objects.Endpoint{"a": two}, opts: map[string][]svcOpt{"a": {withLB, ranges}},
		from: "198.18.100.1", to: "198.18.64.10:80",
		verdict: Forward, frontend: FrontendLoadBalancer, endpoints: []string{"198.18.17.10:8080", "198.18.18.10:8080"}, masq: true,
	}, {
		name: "topology hints", svcs: map[string][]objects.Endpoint{"a": {ep("198.18.17.10", "node1", true, "zone-a"), ep("198.18.18.10", "node2", true, "zone-b")}},
		from: "198.18.17.10", to: "198.18.130.1:80",
		verdict: Forward, frontend: FrontendClusterIP, endpoints: []string{"198.18.17.10:8080"}, excluded: []string{"198.18.18.10:8080: other zones (zone-b)"},
	}, {
		name: "affinity", svcs: map[string][]objects.Endpoint{"a": two}, opts: map[string][]svcOpt{"a": {affinity}},
		from: "198.18.17.10", to: "198.18.130.1:80",
		verdict: Forward, frontend: FrontendClusterIP, endpoints: []string{"198.18.17.10:8080", "198.18.18.10:8080"},
	}, {
		name: "unknown port of a ClusterIP, nftables rejects", svcs: map[string][]objects.Endpoint{"a": two},
		from: "198.18.17.10", to: "198.18.130.1:81",
		verdict: Reject, reason: "no Service port is 81/tcp",
	}, {
		name: "unknown port of a ClusterIP, iptables passes", svcs: map[string][]objects.Endpoint{"a": two}, mode: "iptables",
		from: "198.18.17.10", to: "198.18.130.1:81",
		verdict: NotProxied,
	}, {
		name: "udp is another port", svcs: map[string][]objects.Endpoint{"a": two}, proto: model.UDP,
		from: "198.18.17.10", to: "198.18.130.1:80",
		verdict: Reject, reason: "80/tcp",
	}, {
		name: "userspace relays, from the node's address", svcs: map[string][]objects.Endpoint{"a": two}, mode: "userspace",
		from: "198.18.17.10", to: "198.18.130.1:80",
		verdict: Forward, frontend: FrontendClusterIP, endpoints: []string{"198.18.17.10:8080", "198.18.18.10:8080"}, masq: true, reason: "kproxy relays",
	}, {
		name: "userspace resets a TCP client outside the source ranges", svcs: map[string][]objects.Endpoint{"a": two}, opts: map[string][]svcOpt{"a": {withLB, ranges}}, mode: "userspace",
		from: "198.18.101.1", to: "198.18.64.10:80",
		verdict: Reject, frontend: FrontendLoadBalancer, reason: "resets",
	}, {
		name: "userspace drops a UDP client of Local without a local endpoint", svcs: map[string][]objects.Endpoint{"a": {ep("198.18.18.10", "node2", true)}},
		opts: map[string][]svcOpt{"a": {etpLocal, udp}}, mode: "userspace", proto: model.UDP,
		from: "198.18.100.1", to: "198.18.0.11:30001",
		verdict: Drop, frontend: FrontendNodePort, reason: "Local",
	}, {
		name: "userspace short-circuits the node under ETP Local", svcs: map[string][]objects.Endpoint{"a": {ep("198.18.18.10", "node2", true)}}, opts: map[string][]svcOpt{"a": {etpLocal}}, mode: "userspace",
		from: "198.18.0.11", to: "198.18.0.11:30001",
		verdict: Forward, frontend: FrontendNodePort, endpoints: []string{"198.18.18.10:8080"}, masq: true,
	}, {
		name: "userspace cannot tell pods by interface", svcs: map[string][]objects.Endpoint{"a": {ep("198.18.18.10", "node2", true)}}, opts: map[string][]svcOpt{"a": {etpLocal}}, mode: "userspace",
		cfg:  cfg(func(c *dataplane.Config) { c.LocalMode = dataplane.LocalBridgeInterface; c.BridgeInterface = "cbr0" }),
		from: "198.18.17.10", to: "198.18.0.11:30001",
		verdict: Reject, frontend: FrontendNodePort, reason: "resets",
	}, {
		name: "userspace refuses an unknown port", svcs: map[string][]objects.Endpoint{"a": two}, mode: "userspace",
		from: "198.18.17.10", to: "198.18.130.1:81",
		verdict: Reject, reason: "no socket",
	}, {
		name: "address no Service has", svcs: map[string][]objects.Endpoint{"a": two},
		from: "198.18.17.10", to: "198.18.99.1:80",
		verdict: NotProxied, reason: "no Service has",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			snap, _ := model.Build(input(tc.svcs, tc.opts))
			c := tc.cfg
			if c.Families == nil {
				c = cfg()
			}
			mode := tc.mode
			if mode == "" {
				mode = "nftables"
			}
			proto := tc.proto
			if proto == "" {
				proto = model.TCP
			}
			a, err := Explain(Input{Snapshot: snap, Config: c, Mode: mode},
				Request{From: netip.MustParseAddr(tc.from), To: netip.MustParseAddrPort(tc.to), Protocol: proto})
			if err != nil {
				t.Fatal(err)
			}
			if a.Verdict != tc.verdict || a.Frontend != tc.frontend {
				t.Fatalf("verdict %s frontend %q (%s), want %s %q\n%+v", a.Verdict, a.Frontend, a.Reason, tc.verdict, tc.frontend, a)
			}
			var got []string
			for _, c := range a.Endpoints {
				got = append(got, c.Endpoint.String())
			}
			if !slices.Equal(got, tc.endpoints) {
				t.Errorf("endpoints %v, want %v", got, tc.endpoints)
			}
			for _, x := range tc.excluded {
				addr, why, _ := strings.Cut(x, ": ")
				if !slices.ContainsFunc(a.Excluded, func(e Excluded) bool { return e.Endpoint.String() == addr && strings.Contains(e.Reason, why) }) {
					t.Errorf("excluded %+v, want %s with %q", a.Excluded, addr, why)
				}
			}
			if a.Verdict == Forward && a.Masquerade != tc.masq {
				t.Errorf("masquerade %v (%s), want %v", a.Masquerade, a.MasqueradeReason, tc.masq)
			}
			if !strings.Contains(a.Reason, tc.reason) && !slices.ContainsFunc(a.Steps, func(s Step) bool { return strings.Contains(s.Policy+s.Result, tc.reason) }) {
				t.Errorf("reason %q and steps %+v lack %q", a.Reason, a.Steps, tc.reason)
			}
		})
	}
}

func TestExplainBadRequests(t *testing.T) {
	snap, _ := model.Build(input(map[string][]objects.Endpoint{"a": nil}, nil))
	if _, err := Explain(Input{Snapshot: snap, Config: cfg(), Mode: "nftables"},
		Request{From: localPod, To: netip.MustParseAddrPort("[fd00::1]:80"), Protocol: model.TCP}); !errors.Is(err, ErrBadRequest) {
		t.Errorf("mixed families: %v, want ErrBadRequest", err)
	}
	unknown, _ := model.Build(model.Input{NodeName: "nope"})
	if _, err := Explain(Input{Snapshot: unknown, Config: cfg(), Mode: "nftables"},
		Request{From: localPod, To: netip.MustParseAddrPort("198.18.130.1:80"), Protocol: model.TCP}); !errors.Is(err, ErrBadRequest) {
		t.Errorf("unknown node: %v, want ErrBadRequest", err)
	}
	for _, s := range []string{"198.18.130.1", "198.18.130.1:0", "198.18.130.1:70000", "198.18.130.1:80/icmp", "x:80"} {
		if _, _, err := ParseTo(s); err == nil {
			t.Errorf("ParseTo(%q): no error", s)
		}
	}
	if ap, p, err := ParseTo("[fd00::1]:53/UDP"); err != nil || p != model.UDP || ap.Port() != 53 {
		t.Errorf("ParseTo([fd00::1]:53/UDP) = %v %v %v", ap, p, err)
	}
}

// FuzzExplain: any request, any mode, against a snapshot with every kind of
// frontend, gives an answer without panicking; a forward verdict has
// endpoints whose probabilities add up to 1, the others have none.
func FuzzExplain(f *testing.F) {
	two := []objects.Endpoint{ep("198.18.17.10", "node1", true), ep("198.18.18.10", "node2", true)}
	lb := func(s *objects.Service) {
		s.Type = "LoadBalancer"
		s.LoadBalancerIngress = []objects.LoadBalancerIngress{{IP: "198.18.64.10"}}
		s.LoadBalancerSourceRanges = []string{"198.18.100.0/24"}
		s.ExternalTrafficPolicy = "Local"
	}
	snap, _ := model.Build(input(map[string][]objects.Endpoint{"a": two, "b": {terminating("198.18.18.11", "node2")}, "c": nil},
		map[string][]svcOpt{"a": {lb}}))
	f.Add("198.18.17.10", "198.18.130.1:80", uint8(0))
	f.Add("198.18.100.1", "198.18.64.10:80/udp", uint8(1))
	f.Add("fd00::1", "[fd00::2]:30001/sctp", uint8(2))
	f.Fuzz(func(t *testing.T, from, to string, mode uint8) {
		src, err := netip.ParseAddr(from)
		if err != nil {
			return
		}
		dst, proto, err := ParseTo(to)
		if err != nil {
			return
		}
		in := Input{Snapshot: snap, Config: cfg(), Mode: []string{"nftables", "iptables", "ipvs"}[mode%3]}
		a, err := Explain(in, Request{From: src, To: dst, Protocol: proto})
		if err != nil {
			if !errors.Is(err, ErrBadRequest) {
				t.Fatalf("error %v is not ErrBadRequest", err)
			}
			return
		}
		sum := 0.0
		for _, c := range a.Endpoints {
			sum += c.Probability
		}
		if (a.Verdict == Forward) != (len(a.Endpoints) > 0) || (a.Verdict == Forward && (sum < 0.999 || sum > 1.001)) {
			t.Fatalf("verdict %s with %d endpoints (sum %f)", a.Verdict, len(a.Endpoints), sum)
		}
		if err := WriteText(io.Discard, a); err != nil {
			t.Fatal(err)
		}
	})
}
