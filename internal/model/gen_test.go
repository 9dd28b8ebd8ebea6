package model

import (
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/kproxy/kproxy/internal/objects"
)

// gen draws values from a byte string (fuzz input); past its end it draws
// zeros. Small pools of values make collisions (duplicates, matches, bad
// values) likely.
type gen struct {
	data []byte
	i    int
}

func (g *gen) byte() byte {
	if g.i >= len(g.data) {
		return 0
	}
	b := g.data[g.i]
	g.i++
	return b
}

func (g *gen) intn(n int) int { return int(g.byte()) % n }
func (g *gen) bool() bool     { return g.byte()&1 == 1 }

func pick[T any](g *gen, pool ...T) T { return pool[g.intn(len(pool))] }

func (g *gen) some(pool ...string) []string {
	var out []string
	for n := g.intn(4); n > 0; n-- {
		out = append(out, pick(g, pool...))
	}
	return out
}

func (g *gen) cond() objects.Cond { return objects.CondOf(g.optBool()) }

func (g *gen) optBool() *bool {
	switch g.intn(3) {
	case 0:
		return nil
	case 1:
		return bptr(true)
	}
	return bptr(false)
}

var (
	genNamespaces = []string{"ns1", "ns2"}
	genNames      = []string{"a", "b", "c", "d"}
	genPortNames  = []string{"", "http", "http", "dns"}
	genProtocols  = []string{"", "TCP", "TCP", "UDP", "", "TCP", "SCTP", "ICMP"}
	genPorts      = []int32{80, 53, 8080, 80, 53, 8080, 80, 53, 0, 70000, -1}
	genAddrs4     = []string{"198.18.1.1", "198.18.1.2", "198.18.1.3", "198.18.1.4", "198.018.1.5", "::ffff:198.18.1.6"}
	genAddrs6     = []string{"fd00::1", "fd00::2", "fd00::3", "fd00::4"}
	genBadAddrs   = []string{"", "bogus", "198.18.1.256", "fe80::1%eth0"}
	genNodes      = []string{"", "node1", "node2"}
	genZones      = []string{"", "z1", "z2"}
)

func (g *gen) addr() string {
	switch g.intn(5) {
	case 0, 1:
		return pick(g, genAddrs4...)
	case 2, 3:
		return pick(g, genAddrs6...)
	}
	return pick(g, genBadAddrs...)
}

// sliceAddr is mostly an address of the slice's family.
func (g *gen) sliceAddr(addrType string) string {
	switch {
	case g.intn(6) == 0:
		return g.addr()
	case addrType == "IPv6":
		return pick(g, genAddrs6...)
	}
	return pick(g, genAddrs4...)
}

func (g *gen) key() objects.Key {
	return objects.Key{Namespace: pick(g, genNamespaces...), Name: pick(g, genNames...)}
}

func (g *gen) service(k objects.Key) *objects.Service {
	s := &objects.Service{
		Namespace: k.Namespace, Name: k.Name,
		Type:                     pick(g, "ClusterIP", "NodePort", "LoadBalancer", "ExternalName", "", "Magic"),
		ExternalIPs:              g.some(g.addr(), g.addr()),
		LoadBalancerSourceRanges: g.some("198.18.0.0/16", "fd00::/8", "0.0.0.0/0", "::/0", "bad", "198.18.3.3/24"),
		SessionAffinity:          pick(g, "", "None", "ClientIP", "Sticky"),
		SessionAffinityTimeout:   pick(g, int32(0), 60, -3),
		ExternalTrafficPolicy:    pick(g, "", "Cluster", "Local", "Odd"),
		InternalTrafficPolicy:    pick(g, "", "Cluster", "Local"),
		HealthCheckNodePort:      pick(g, int32(0), 31000, 70000),
		LoadBalancing:            pick(g, "", "", "random", "round-robin", "least-connections", "source-hash", "fastest"),
	}
	s.ClusterIPs = append(s.ClusterIPs, pick(g, "198.18.0.1", "fd00::a", "198.18.0.1", "fd00::a", "None", "", "bogus"))
	for n := g.intn(3); n > 0; n-- {
		s.ClusterIPs = append(s.ClusterIPs, pick(g, "198.18.0.1", "fd00::a", "None", "", "bogus", "198.18.0.2", "fd00::b"))
	}
	for n := 1 + g.intn(3); n > 0; n-- {
		s.Ports = append(s.Ports, objects.ServicePort{Name: pick(g, genPortNames...), Protocol: pick(g, genProtocols...),
			Port: pick(g, genPorts...), NodePort: pick(g, int32(0), 30000, 30001, -5, 70000)})
	}
	for n := g.intn(3); n > 0; n-- {
		s.LoadBalancerIngress = append(s.LoadBalancerIngress, objects.LoadBalancerIngress{IP: g.addr(), IPMode: pick(g, "", "VIP", "Proxy", "X")})
	}
	return s
}

// slice draws a slice for the Service k; its ports mostly copy the
// Service's names and protocols (svc may be nil).
func (g *gen) slice(k objects.Key, svc *objects.Service) *objects.EndpointSlice {
	s := &objects.EndpointSlice{
		Namespace: k.Namespace, Name: k.Name + "-" + pick(g, "s1", "s2", "s3"), ServiceName: k.Name,
		AddressType: pick(g, "IPv4", "IPv4", "IPv6", "IPv6", "FQDN", "IPvX"),
	}
	if g.intn(8) == 0 {
		s.ServiceName = pick(g, genNames...)
	}
	for n := g.intn(4); n > 0; n-- {
		p := objects.EndpointPort{Name: pick(g, genPortNames...), Protocol: pick(g, genProtocols...), Port: pick(g, genPorts...)}
		if svc != nil && len(svc.Ports) > 0 && g.intn(4) != 0 {
			sp := svc.Ports[g.intn(len(svc.Ports))]
			p.Name, p.Protocol = sp.Name, sp.Protocol
		}
		s.Ports = append(s.Ports, p)
	}
	// Hints on whole slices, so that "every endpoint hinted" happens.
	zoneHints, nodeHints := g.bool(), g.bool()
	for n := g.intn(8); n > 0; n-- {
		e := objects.Endpoint{
			Ready: g.cond(), Serving: g.cond(), Terminating: g.cond(),
			Node: objects.OnNode(pick(g, genNodes...)),
		}
		if zoneHints || nodeHints {
			e.Hints = &objects.Hints{}
		}
		if zoneHints {
			e.Hints.Zones = append(g.some(genZones...), pick(g, genZones...))
		}
		if nodeHints {
			e.Hints.Nodes = append(g.some(genNodes...), pick(g, genNodes...))
		}
		// Zero to two addresses; the first is the one used.
		if m := g.intn(3); m > 0 {
			text := g.sliceAddr(s.AddressType)
			a, ok := objects.ParseAddr(text)
			e.Addr, e.HasAddress = a, true
			if !ok {
				if s.BadAddresses == nil {
					s.BadAddresses = map[int]string{}
				}
				s.BadAddresses[len(s.Endpoints)] = text
			}
		}
		s.Endpoints = append(s.Endpoints, e)
	}
	return s
}

func (g *gen) node() *objects.Node {
	if g.intn(4) == 0 {
		return nil
	}
	n := &objects.Node{Name: "node1", PodCIDRs: g.some("198.18.64.0/24", "fd00:64::/64", "bad"),
		InternalIPs: g.some(g.addr()), Deleting: g.bool(), ToBeDeleted: g.bool()}
	if z := pick(g, genZones...); z != "" {
		n.Labels = map[string]string{objects.LabelTopologyZone: z}
	}
	return n
}

// input draws a whole Input.
func (g *gen) input() Input {
	in := Input{NodeName: pick(g, "node1", "node1", ""), Node: g.node(),
		Services: map[objects.Key]*objects.Service{}, Slices: map[objects.Key][]*objects.EndpointSlice{}}
	for n := g.intn(8); n > 0; n-- {
		k := g.key()
		in.Services[k] = g.service(k)
	}
	keys := slices.SortedFunc(maps.Keys(in.Services), objects.Key.Compare)
	for n := g.intn(10); n > 0; n-- {
		k := g.key()
		if len(keys) > 0 && g.intn(4) != 0 {
			k = keys[g.intn(len(keys))]
		}
		in.Slices[k] = append(in.Slices[k], g.slice(k, in.Services[k]))
	}
	in.IgnoreExternalIPs = g.intn(4) == 0
	return in
}

// mutate returns a copy of in with a few Services, slices or the node
// changed, and the keys of the Services whose objects or slices changed.
func (g *gen) mutate(in Input) (Input, map[objects.Key]struct{}) {
	out := in
	out.Services, out.Slices = maps.Clone(in.Services), maps.Clone(in.Slices)
	changed := map[objects.Key]struct{}{}
	for n := g.intn(5); n > 0; n-- {
		k := g.key()
		changed[k] = struct{}{}
		switch g.intn(5) {
		case 0:
			delete(out.Services, k)
		case 1:
			out.Services[k] = g.service(k)
		case 2:
			delete(out.Slices, k)
		case 3:
			out.Slices[k] = append(slices.Clone(out.Slices[k]), g.slice(k, out.Services[k]))
		case 4:
			out.Slices[k] = []*objects.EndpointSlice{g.slice(k, out.Services[k])}
		}
	}
	switch g.intn(6) {
	case 0:
		out.Node = g.node()
	case 1:
		out.NodeName = pick(g, "node1", "node2")
	}
	return out, changed
}

func randomBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// checkBuildAndUpdate builds a random input, mutates it, and checks the
// snapshots' invariants and that Update equals Build.
func checkBuildAndUpdate(t *testing.T, data []byte) {
	t.Helper()
	g := &gen{data: data}
	in1 := g.input()
	s1, probs1 := Build(in1)
	checkInvariants(t, s1, probs1)
	if again, _ := Build(in1); !equalSnapshots(s1, again) {
		t.Fatalf("Build is not deterministic")
	}
	checkBuildParts(t, in1)
	if in1.IgnoreExternalIPs {
		for _, f := range families {
			for _, p := range s1.Family(f).Ports {
				if len(p.ExternalIPs) > 0 {
					t.Fatalf("%s: external IPs %v with IgnoreExternalIPs", p.ID, p.ExternalIPs)
				}
			}
		}
	}
	in2, changed := g.mutate(in1)
	want, _ := Build(in2)
	got, probs := Update(s1, in2, changed)
	checkInvariants(t, got, probs)
	if !equalSnapshots(got, want) {
		t.Fatalf("Update != Build\nchanged %v\nupdate v4 %v v6 %v\nbuild  v4 %v v6 %v", changed,
			got.V4.Ports, got.V6.Ports, want.V4.Ports, want.V6.Ports)
	}
	checkChangedSince(t, s1, got)
	if _, ok := want.ChangedSince(s1); ok {
		t.Fatalf("a snapshot built whole claims to derive from another")
	}
	// Unchanged Services keep their ports (same pointers) when the node's
	// name and zone stayed.
	if s1.Node.Name == got.Node.Name && s1.Node.Zone == got.Node.Zone {
		for _, f := range families {
			for _, p := range s1.Family(f).Ports {
				if _, ch := changed[p.ID.Service()]; !ch && got.Family(f).Port(p.ID) != p {
					t.Fatalf("unchanged port %s rebuilt", p.ID)
				}
			}
		}
	}
}

// checkBuildParts checks that the Services built on several builders are
// the ports and problems one builder makes, in the same order.
func checkBuildParts(t *testing.T, in Input) {
	t.Helper()
	node, _ := makeNodeInfo(in.NodeName, in.Node)
	keys := slices.SortedFunc(maps.Keys(in.Services), objects.Key.Compare)
	v4, v6, probs := buildParts(node, in, keys, 1)
	one := &Snapshot{V4: NewFamilySnapshot(IPv4, v4), V6: NewFamilySnapshot(IPv6, v6)}
	for _, n := range []int{2, 3} {
		v4, v6, p := buildParts(node, in, keys, n)
		if got := (&Snapshot{V4: NewFamilySnapshot(IPv4, v4), V6: NewFamilySnapshot(IPv6, v6)}); !equalSnapshots(got, one) {
			t.Fatalf("%d builders: ports differ from one builder's\nv4 %v v6 %v\none: v4 %v v6 %v", n, got.V4.Ports, got.V6.Ports, one.V4.Ports, one.V6.Ports)
		}
		if !reflect.DeepEqual(p, probs) {
			t.Fatalf("%d builders: problems %v, one builder's %v", n, p, probs)
		}
	}
}

// checkChangedSince checks next.ChangedSince(prev)'s promise: every port of
// a Service it does not list is the same pointer in both snapshots.
func checkChangedSince(t *testing.T, prev, next *Snapshot) {
	t.Helper()
	keys, ok := next.ChangedSince(prev)
	if !ok {
		return
	}
	if !slices.IsSortedFunc(keys, objects.Key.Compare) {
		t.Fatalf("ChangedSince: keys not sorted: %v", keys)
	}
	listed := map[objects.Key]bool{}
	for _, k := range keys {
		listed[k] = true
	}
	for _, f := range families {
		for _, pair := range [][2]*FamilySnapshot{{prev.Family(f), next.Family(f)}, {next.Family(f), prev.Family(f)}} {
			for _, p := range pair[0].Ports {
				if !listed[p.ID.Service()] && pair[1].Port(p.ID) != p {
					t.Fatalf("ChangedSince does not list %s, whose port %s differs", p.ID.Service(), p.ID)
				}
			}
		}
	}
	if _, again := next.ChangedSince(next); again {
		t.Fatalf("a snapshot derives from itself")
	}
}
