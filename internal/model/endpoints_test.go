package model

import (
	"reflect"
	"slices"
	"testing"
	"unsafe"

	"github.com/kproxy/kproxy/internal/objects"
)

func TestEndpointJoin(t *testing.T) {
	svc := newSvc("s", func(s *objects.Service) {
		s.Ports = []objects.ServicePort{{Name: "http", Port: 80}, {Name: "http", Protocol: "UDP", Port: 80}, {Name: "", Port: 81}}
	})
	in := makeInput(nil, []*objects.Service{svc},
		newSlice("s", "a", "IPv4", []objects.EndpointPort{{Name: "http", Port: 8080}, {Name: "other", Port: 9}},
			ep("198.18.1.2"), ep("198.18.1.1")),
		newSlice("s", "b", "IPv4", []objects.EndpointPort{{Name: "http", Protocol: "UDP", Port: 8053}, {Name: "", Port: 8081}},
			ep("198.18.1.3")),
		newSlice("s", "c", "FQDN", httpPort(80), ep("example.com")),
	)
	s, probs := Build(in)
	if len(probs) != 0 {
		t.Fatalf("problems: %v", probs)
	}
	got := map[string]string{}
	for _, p := range s.V4.Ports {
		got[p.ID.Port+"/"+string(p.Protocol)] = epList(p.Endpoints)
	}
	want := map[string]string{
		"http/TCP": "198.18.1.1:8080 198.18.1.2:8080", // first address only, sorted
		"http/UDP": "198.18.1.3:8053",
		"/TCP":     "198.18.1.3:8081",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

func TestEndpointConditions(t *testing.T) {
	cases := []struct {
		name                  string
		r, s, term            *bool
		ready, serving, terms bool
	}{
		{"all unknown", nil, nil, nil, true, true, false},
		{"not ready, serving unknown counts as serving", bptr(false), nil, bptr(true), false, true, true},
		{"explicit", bptr(false), bptr(false), bptr(false), false, false, false},
		{"ready, serving", bptr(true), bptr(true), nil, true, true, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := makeInput(zoneNode("z"), []*objects.Service{newSvc("s")},
				newSlice("s", "a", "IPv4", httpPort(80), ep("198.18.1.1", conds(tc.r, tc.s, tc.term), onNode("node1"),
					func(e *objects.Endpoint) {
						e.Hints = &objects.Hints{Zones: []string{"z"}, Nodes: []string{"node1"}}
					})))
			p, _ := onlyPort(t, in, IPv4)
			e := p.Endpoints[0]
			want := Endpoint{IP: e.IP, Port: 80, Ready: tc.ready, Serving: tc.serving, Terminating: tc.terms,
				IsLocal: true, Hints: &objects.Hints{Zones: []string{"z"}, Nodes: []string{"node1"}}}
			if !reflect.DeepEqual(*e, want) {
				t.Errorf("got %+v, want %+v", *e, want)
			}
		})
	}
}

func TestEndpointSize(t *testing.T) {
	// 110k of them at 10k Services: keep them in the 40-byte size class.
	if n := unsafe.Sizeof(Endpoint{}); n > 40 {
		t.Errorf("Endpoint is %d bytes, want at most 40", n)
	}
}

func TestIsLocal(t *testing.T) {
	in := makeInput(nil, []*objects.Service{newSvc("s")},
		newSlice("s", "a", "IPv4", httpPort(80), ep("198.18.1.1", onNode("node1")), ep("198.18.1.2", onNode("")), ep("198.18.1.3")))
	p, _ := onlyPort(t, in, IPv4)
	if !p.Endpoints[0].IsLocal || p.Endpoints[1].IsLocal || p.Endpoints[2].IsLocal {
		t.Errorf("locality: %v %v %v", p.Endpoints[0].IsLocal, p.Endpoints[1].IsLocal, p.Endpoints[2].IsLocal)
	}
	// An unknown node name makes nothing local, even endpoints without a node.
	in.NodeName = ""
	p, _ = onlyPort(t, in, IPv4)
	for _, e := range p.Endpoints {
		if e.IsLocal {
			t.Errorf("%s local with no node name", e)
		}
	}
}

func TestDedupAcrossSlices(t *testing.T) {
	term := conds(bptr(false), bptr(true), bptr(true))
	notReady := conds(bptr(false), bptr(false), bptr(false))
	cases := []struct {
		name   string
		slices []*objects.EndpointSlice
		want   Endpoint // the survivor's conditions and whether it is on node1 (this node)
		probs  []string
	}{
		{"non-terminating wins over an earlier terminating",
			[]*objects.EndpointSlice{
				newSlice("s", "a", "IPv4", httpPort(80), ep("198.18.1.1", term, onNode("node1"))),
				newSlice("s", "b", "IPv4", httpPort(80), ep("198.18.1.1", onNode("n-b")))},
			Endpoint{Ready: true, Serving: true, IsLocal: false}, []string{"EndpointSlice endpoints"}},
		{"terminating does not replace an earlier one",
			[]*objects.EndpointSlice{
				newSlice("s", "b", "IPv4", httpPort(80), ep("198.18.1.1", term, onNode("n-b"))),
				newSlice("s", "a", "IPv4", httpPort(80), ep("198.18.1.1", onNode("node1")))},
			Endpoint{Ready: true, Serving: true, IsLocal: true}, []string{"EndpointSlice endpoints"}},
		{"between non-terminating, the later slice by name wins",
			[]*objects.EndpointSlice{
				newSlice("s", "b", "IPv4", httpPort(80), ep("198.18.1.1", notReady, onNode("n-b"))),
				newSlice("s", "a", "IPv4", httpPort(80), ep("198.18.1.1", onNode("node1")))},
			Endpoint{IsLocal: false}, []string{"EndpointSlice endpoints"}},
		{"same address, other port is no duplicate",
			[]*objects.EndpointSlice{
				newSlice("s", "a", "IPv4", httpPort(80), ep("198.18.1.1", onNode("node1"))),
				newSlice("s", "b", "IPv4", httpPort(81), ep("198.18.1.1", onNode("n-b")))},
			Endpoint{Ready: true, Serving: true, IsLocal: true}, nil},
		{"duplicate within one slice",
			[]*objects.EndpointSlice{
				newSlice("s", "a", "IPv4", httpPort(80), ep("198.18.1.1", onNode("node1")), ep("198.18.1.1", term, onNode("n-x")))},
			Endpoint{Ready: true, Serving: true, IsLocal: true}, []string{"EndpointSlice endpoints"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, probs := onlyPort(t, makeInput(nil, []*objects.Service{newSvc("s")}, tc.slices...), IPv4)
			got := *p.Endpoints[0]
			if got.Ready != tc.want.Ready || got.Serving != tc.want.Serving || got.Terminating != tc.want.Terminating || got.IsLocal != tc.want.IsLocal {
				t.Errorf("survivor %+v, want %+v", got, tc.want)
			}
			if fields := problemFields(probs); !slices.Equal(fields, tc.probs) {
				t.Errorf("problems %v, want %v", probs, tc.probs)
			}
		})
	}
}

func TestLocalReadyEndpoints(t *testing.T) {
	svc := newSvc("s", func(s *objects.Service) {
		s.Ports = []objects.ServicePort{{Name: "http", Port: 80}, {Name: "https", Port: 443}}
	})
	ports := []objects.EndpointPort{{Name: "http", Port: 80}, {Name: "https", Port: 443}, {Name: "metrics", Port: 9}}
	in := makeInput(nil, []*objects.Service{svc},
		newSlice("s", "a", "IPv4", ports,
			ep("198.18.1.1", onNode("node1")), ep("198.18.1.2", onNode("node1")),
			ep("198.18.1.3", onNode("node1"), conds(bptr(false), bptr(true), bptr(true))), ep("198.18.1.4")),
		newSlice("s", "b", "IPv4", []objects.EndpointPort{{Name: "metrics", Port: 9}}, ep("198.18.1.5", onNode("node1"))),
	)
	s, _ := Build(in)
	for _, p := range s.V4.Ports {
		// 1.1 and 1.2 on both ports count once each; 1.5 only serves a port
		// the Service does not have, and still counts, as upstream.
		if p.LocalReadyEndpoints != 3 {
			t.Errorf("%s: LocalReadyEndpoints %d, want 3", p.ID, p.LocalReadyEndpoints)
		}
	}
}

func TestSliceProblems(t *testing.T) {
	cases := []struct {
		name  string
		slice *objects.EndpointSlice
		eps   string
		want  []string
	}{
		{"port 0 skipped", newSlice("s", "a", "IPv4", httpPort(0), ep("198.18.1.1")), "", []string{"EndpointSlice ports[0].port"}},
		{"port too big", newSlice("s", "a", "IPv4", httpPort(65536), ep("198.18.1.1")), "", []string{"EndpointSlice ports[0].port"}},
		{"bad protocol", newSlice("s", "a", "IPv4", []objects.EndpointPort{{Name: "http", Protocol: "X", Port: 80}}, ep("198.18.1.1")),
			"", []string{"EndpointSlice ports[0].protocol"}},
		{"invalid address", newSlice("s", "a", "IPv4", httpPort(80), ep("198.18.1.300"), ep("198.18.1.1")),
			"198.18.1.1:80", []string{"EndpointSlice endpoints[0].addresses"}},
		{"no address", newSlice("s", "a", "IPv4", httpPort(80), objects.Endpoint{}, ep("198.18.1.1")),
			"198.18.1.1:80", []string{"EndpointSlice endpoints[0].addresses"}},
		{"wrong family", newSlice("s", "a", "IPv4", httpPort(80), ep("fd00::1"), ep("198.18.1.1")),
			"198.18.1.1:80", []string{"EndpointSlice endpoints[0].addresses"}},
		{"unknown address type", newSlice("s", "a", "IPv5", httpPort(80), ep("198.18.1.1")), "", []string{"EndpointSlice addressType"}},
		{"filed under the wrong Service", &objects.EndpointSlice{Namespace: "ns", Name: "a", ServiceName: "t", AddressType: "IPv4",
			Ports: httpPort(80), Endpoints: []objects.Endpoint{ep("198.18.1.1")}}, "", []string{"EndpointSlice metadata.labels"}},
		{"leading zeros read as decimal", newSlice("s", "a", "IPv4", httpPort(80), ep("198.018.001.001")), "198.18.1.1:80", nil},
		{"IPv4-mapped IPv6 in an IPv4 slice", newSlice("s", "a", "IPv4", httpPort(80), ep("::ffff:198.18.1.1")), "198.18.1.1:80", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := makeInput(nil, []*objects.Service{newSvc("s")})
			key := objects.Key{Namespace: "ns", Name: "s"}
			in.Slices[key] = []*objects.EndpointSlice{tc.slice, nil}
			p, probs := onlyPort(t, in, IPv4)
			if epList(p.Endpoints) != tc.eps {
				t.Errorf("endpoints [%s], want [%s]", epList(p.Endpoints), tc.eps)
			}
			if fields := problemFields(probs); !slices.Equal(fields, tc.want) {
				t.Errorf("problems %v, want %v", probs, tc.want)
			}
			for _, pr := range probs {
				if pr.Object != tc.slice.Key() {
					t.Errorf("problem names %v, want the slice", pr.Object)
				}
			}
		})
	}
}

func TestBuildTopologyFromNode(t *testing.T) {
	svc := newSvc("s")
	mk := func(node *objects.Node) *ServicePort {
		in := makeInput(node, []*objects.Service{svc}, newSlice("s", "a", "IPv4", httpPort(80),
			ep("198.18.1.1", func(e *objects.Endpoint) { e.Hints = &objects.Hints{Zones: []string{"z1"}} }),
			ep("198.18.1.2", func(e *objects.Endpoint) { e.Hints = &objects.Hints{Zones: []string{"z2"}} })))
		p, _ := onlyPort(t, in, IPv4)
		return p
	}
	if p := mk(zoneNode("z1")); epList(p.ClusterEndpoints) != "198.18.1.1:80" || p.TopologyMode != TopologyPreferSameZone {
		t.Errorf("zone z1: %s %q", epList(p.ClusterEndpoints), p.TopologyMode)
	}
	if p := mk(nil); epList(p.ClusterEndpoints) != "198.18.1.1:80 198.18.1.2:80" || p.TopologyMode != "" {
		t.Errorf("node unknown: %s %q", epList(p.ClusterEndpoints), p.TopologyMode)
	}
}
