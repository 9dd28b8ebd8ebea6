package model

import (
	"fmt"
	"maps"
	"testing"

	"github.com/kproxy/kproxy/internal/objects"
)

// scaleInput is n single-stack TCP Services with one port and one slice of
// eps ready endpoints each, a tenth of them on this node.
func scaleInput(n, eps int) Input {
	in := Input{NodeName: "node1", Node: zoneNode("z1"),
		Services: make(map[objects.Key]*objects.Service, n), Slices: make(map[objects.Key][]*objects.EndpointSlice, n)}
	for i := range n {
		name := fmt.Sprintf("svc-%05d", i)
		svc := newSvc(name, func(s *objects.Service) {
			s.ClusterIPs = []string{fmt.Sprintf("198.18.%d.%d", i/250, i%250+1)}
		})
		in.Services[svc.Key()] = svc
		in.Slices[svc.Key()] = []*objects.EndpointSlice{scaleSlice(name, i, eps, 8080)}
	}
	return in
}

func scaleSlice(svc string, i, eps int, port int32) *objects.EndpointSlice {
	s := newSlice(svc, svc+"-x", "IPv4", httpPort(port))
	for j := range eps {
		node := "other"
		if j == 0 {
			node = "node1"
		}
		s.Endpoints = append(s.Endpoints, ep(fmt.Sprintf("198.19.%d.%d", (i*eps+j)/250%256, (i*eps+j)%250+1), onNode(node)))
	}
	return s
}

func BenchmarkBuild10k(b *testing.B) {
	in := scaleInput(10000, 10)
	b.ReportAllocs()
	for b.Loop() {
		s, _ := Build(in)
		if len(s.V4.Ports) != 10000 {
			b.Fatal("wrong port count")
		}
	}
}

// BenchmarkUpdateOne10k updates a 10k-Service snapshot after one Service's
// slice changed.
func BenchmarkUpdateOne10k(b *testing.B) {
	in := scaleInput(10000, 10)
	prev, _ := Build(in)
	key := objects.Key{Namespace: "ns", Name: "svc-05000"}
	next := in
	next.Slices = maps.Clone(in.Slices)
	next.Slices[key] = []*objects.EndpointSlice{scaleSlice(key.Name, 5000, 11, 8081)}
	changed := map[objects.Key]struct{}{key: {}}
	b.ReportAllocs()
	for b.Loop() {
		s, _ := Update(prev, next, changed)
		if len(s.V4.Port(PortID{Namespace: "ns", Name: key.Name, Port: "http", Protocol: TCP}).Endpoints) != 11 {
			b.Fatal("not updated")
		}
	}
}

func TestScaleUpdateEqualsBuild(t *testing.T) {
	in := scaleInput(500, 10)
	prev, _ := Build(in)
	key := objects.Key{Namespace: "ns", Name: "svc-00250"}
	next := in
	next.Slices = maps.Clone(in.Slices)
	next.Slices[key] = []*objects.EndpointSlice{scaleSlice(key.Name, 250, 11, 8081)}
	got, _ := Update(prev, next, map[objects.Key]struct{}{key: {}})
	want, _ := Build(next)
	if !equalSnapshots(got, want) {
		t.Fatal("Update != Build")
	}
	if got.V6 != prev.V6 {
		t.Error("an untouched family was copied")
	}
	same, _ := Update(prev, in, nil)
	if same.V4 != prev.V4 || !equalSnapshots(same, prev) {
		t.Error("an empty update copied the family")
	}
}
