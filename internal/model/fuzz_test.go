package model

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// FuzzBuild builds random Services, slices and Nodes drawn from the fuzz
// bytes: no panic, the snapshot invariants hold, and Update of a mutated
// input equals Build of it. Run: go test -fuzz=FuzzBuild -fuzztime=30s ./internal/model
func FuzzBuild(f *testing.F) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 20 {
		f.Add(randomBytes(r, 2000))
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		checkBuildAndUpdate(t, data)
	})
}

// TestUpdateEqualsBuild runs the fuzz property on many seeded random inputs,
// so that a plain `go test` covers it.
func TestUpdateEqualsBuild(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	n := 3000
	if testing.Short() {
		n = 300
	}
	for range n {
		checkBuildAndUpdate(t, randomBytes(r, 2000))
	}
}

// checkInvariants checks what every Snapshot promises.
func checkInvariants(t *testing.T, s *Snapshot, probs []Problem) {
	t.Helper()
	for _, p := range probs {
		if p.Kind == "" || p.Reason == "" || p.Field == "" || p.Object.Name == "" && p.Kind != "Node" {
			t.Fatalf("incomplete problem %+v", p)
		}
	}
	if s.V4 == nil || s.V6 == nil || s.V4.Family != IPv4 || s.V6.Family != IPv6 {
		t.Fatalf("bad families %+v %+v", s.V4, s.V6)
	}
	for _, f := range families {
		fs := s.Family(f)
		for i, p := range fs.Ports {
			if i > 0 && !fs.Ports[i-1].ID.Less(p.ID) {
				t.Fatalf("%s: ports not sorted at %s", f, p.ID)
			}
			if fs.Port(p.ID) != p {
				t.Fatalf("%s: Port(%s) is another port", f, p.ID)
			}
			checkPort(t, f, p)
		}
	}
}

func checkPort(t *testing.T, f Family, p *ServicePort) {
	t.Helper()
	if p.Family != f || FamilyOf(p.ClusterIP) != f || p.Port == 0 || p.Protocol != p.ID.Protocol {
		t.Fatalf("%s %s: bad port %+v", f, p.ID, p)
	}
	for _, a := range slices.Concat(p.ExternalIPs, p.LoadBalancerIPs) {
		if FamilyOf(a) != f || a.Is4In6() {
			t.Fatalf("%s %s: frontend %s of the wrong family", f, p.ID, a)
		}
	}
	for _, r := range p.SourceRanges {
		if FamilyOf(r.Addr()) != f || r.Bits() == 0 || r != r.Masked() {
			t.Fatalf("%s %s: bad source range %s", f, p.ID, r)
		}
	}
	if p.HealthCheckNodePort != 0 && !p.ExternalPolicyLocal {
		t.Fatalf("%s: health check port without Local external policy", p.ID)
	}
	for i, e := range p.Endpoints {
		if e == nil || FamilyOf(e.IP) != f || e.IP.Is4In6() || e.Port == 0 {
			t.Fatalf("%s %s: bad endpoint %v", f, p.ID, e)
		}
		if i > 0 && p.Endpoints[i-1].AddrPort().Compare(e.AddrPort()) >= 0 {
			t.Fatalf("%s: endpoints not sorted and unique: %s", p.ID, epList(p.Endpoints))
		}
	}
	checkSubset(t, p, "cluster", p.ClusterEndpoints)
	checkSubset(t, p, "local", p.LocalEndpoints)
	checkSubset(t, p, "reachable", p.AllReachable)
	if !p.UsesClusterEndpoints() && p.ClusterEndpoints != nil || !p.UsesLocalEndpoints() && p.LocalEndpoints != nil {
		t.Fatalf("%s: endpoint set for an unused policy", p.ID)
	}
	for _, e := range p.LocalEndpoints {
		if !e.IsLocal {
			t.Fatalf("%s: remote endpoint %s in the local set", p.ID, e)
		}
	}
	for _, e := range p.Endpoints {
		in := slices.Contains(p.ClusterEndpoints, e) || slices.Contains(p.LocalEndpoints, e)
		if in != slices.Contains(p.AllReachable, e) {
			t.Fatalf("%s: AllReachable is not the union at %s", p.ID, e)
		}
	}
	if (len(p.ClusterEndpoints) > 0 || len(p.LocalEndpoints) > 0) && !p.HasEndpoints {
		t.Fatalf("%s: usable endpoints but HasEndpoints false", p.ID)
	}
	checkCategories(t, p)
}

// checkCategories restates upstream's CategorizeEndpoints rules as
// properties of the result: ready endpoints first (all of them when no
// topology applies), else serving and terminating ones, decided separately
// for the cluster and the local set; HasEndpoints when the cluster set is
// non-empty or, for a port using the Local policy, any endpoint is usable.
func checkCategories(t *testing.T, p *ServicePort) {
	t.Helper()
	ready := func(e *Endpoint) bool { return e.Ready }
	st := func(e *Endpoint) bool { return e.Serving && e.Terminating }
	local := func(keep func(*Endpoint) bool) func(*Endpoint) bool {
		return func(e *Endpoint) bool { return e.IsLocal && keep(e) }
	}
	if p.UsesClusterEndpoints() {
		switch {
		case !slices.ContainsFunc(p.Endpoints, ready):
			sameSet(t, p, "cluster (fallback)", p.ClusterEndpoints, filter(p.Endpoints, st))
		case p.TopologyMode == "":
			sameSet(t, p, "cluster", p.ClusterEndpoints, filter(p.Endpoints, ready))
		default:
			for _, e := range p.ClusterEndpoints {
				if !e.Ready {
					t.Fatalf("%s: topology-filtered cluster set holds non-ready %s", p.ID, e)
				}
			}
			if p.ClusterEndpoints == nil {
				t.Fatalf("%s: topology %s chosen but no endpoint matches", p.ID, p.TopologyMode)
			}
		}
	}
	if p.UsesLocalEndpoints() {
		want := filter(p.Endpoints, local(ready))
		if want == nil {
			want = filter(p.Endpoints, local(st))
		}
		sameSet(t, p, "local", p.LocalEndpoints, want)
	}
	usable := slices.ContainsFunc(p.Endpoints, func(e *Endpoint) bool { return e.Ready || st(e) })
	wantHas := p.UsesClusterEndpoints() && p.ClusterEndpoints != nil || p.UsesLocalEndpoints() && usable
	if p.HasEndpoints != wantHas {
		t.Fatalf("%s: HasEndpoints %v, want %v", p.ID, p.HasEndpoints, wantHas)
	}
}

func sameSet(t *testing.T, p *ServicePort, what string, got, want []*Endpoint) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("%s: %s endpoints %q, want %q", p.ID, what, epList(got), epList(want))
	}
}

// checkSubset checks that sub is nil or a non-empty, ordered subsequence of
// p.Endpoints (same pointers).
func checkSubset(t *testing.T, p *ServicePort, what string, sub []*Endpoint) {
	t.Helper()
	if sub != nil && len(sub) == 0 {
		t.Fatalf("%s: empty %s list is not nil", p.ID, what)
	}
	j := 0
	for _, e := range p.Endpoints {
		if j < len(sub) && sub[j] == e {
			j++
		}
	}
	if j != len(sub) {
		t.Fatalf("%s: %s endpoints are not a subsequence of Endpoints", p.ID, what)
	}
}
