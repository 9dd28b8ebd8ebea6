package model

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/internal/objects"
)

// Test fixtures: small constructors with functional options.

func bptr(b bool) *bool { return &b }

func newSvc(name string, opts ...func(*objects.Service)) *objects.Service {
	s := &objects.Service{
		Namespace: "ns", Name: name, Type: objects.ServiceTypeClusterIP,
		ClusterIPs: []string{"198.18.0.10"},
		Ports:      []objects.ServicePort{{Name: "http", Protocol: "TCP", Port: 80}},
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

func newSlice(svc, name, addrType string, ports []objects.EndpointPort, eps ...objects.Endpoint) *objects.EndpointSlice {
	return &objects.EndpointSlice{Namespace: "ns", Name: name, ServiceName: svc, AddressType: addrType, Ports: ports, Endpoints: eps}
}

func httpPort(port int32) []objects.EndpointPort {
	return []objects.EndpointPort{{Name: "http", Protocol: "TCP", Port: port}}
}

// ep is a ready endpoint on node "other".
func ep(addr string, opts ...func(*objects.Endpoint)) objects.Endpoint {
	a, _ := objects.ParseAddr(addr) // invalid when addr does not parse
	e := objects.Endpoint{Addr: a, HasAddress: true, Node: objects.OnNode("other")}
	for _, o := range opts {
		o(&e)
	}
	return e
}

func onNode(n string) func(*objects.Endpoint) {
	return func(e *objects.Endpoint) { e.Node = objects.OnNode(n) }
}
func conds(r, s, t *bool) func(*objects.Endpoint) {
	return func(e *objects.Endpoint) {
		e.Ready, e.Serving, e.Terminating = objects.CondOf(r), objects.CondOf(s), objects.CondOf(t)
	}
}

func makeInput(node *objects.Node, svcs []*objects.Service, sl ...*objects.EndpointSlice) Input {
	in := Input{NodeName: "node1", Node: node, Services: map[objects.Key]*objects.Service{}, Slices: map[objects.Key][]*objects.EndpointSlice{}}
	for _, s := range svcs {
		in.Services[s.Key()] = s
	}
	for _, s := range sl {
		in.Slices[s.ServiceKey()] = append(in.Slices[s.ServiceKey()], s)
	}
	return in
}

func zoneNode(zone string) *objects.Node {
	n := &objects.Node{Name: "node1"}
	if zone != "" {
		n.Labels = map[string]string{objects.LabelTopologyZone: zone}
	}
	return n
}

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func prefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

// epList shows endpoints as "ip:port" joined by spaces, "" when empty.
func epList(eps []*Endpoint) string {
	var parts []string
	for _, e := range eps {
		parts = append(parts, e.String())
	}
	return strings.Join(parts, " ")
}

// onlyPort builds in and returns its only port of family f.
func onlyPort(t *testing.T, in Input, f Family) (*ServicePort, []Problem) {
	t.Helper()
	s, probs := Build(in)
	fs := s.Family(f)
	if len(fs.Ports) != 1 {
		t.Fatalf("%s ports: got %d, want 1 (problems %v)", f, len(fs.Ports), probs)
	}
	return fs.Ports[0], probs
}

// problemFields lists the problems as "Kind Field".
func problemFields(probs []Problem) []string {
	var out []string
	for _, p := range probs {
		out = append(out, p.Kind+" "+p.Field)
	}
	return out
}

// equalSnapshots compares content: not the lineage (gen, parent, changed).
func equalSnapshots(a, b *Snapshot) bool {
	if a == nil || b == nil {
		return a == b
	}
	ac, bc := *a, *b
	ac.gen, ac.parent, ac.changed = 0, 0, nil
	bc.gen, bc.parent, bc.changed = 0, 0, nil
	return reflect.DeepEqual(&ac, &bc)
}
