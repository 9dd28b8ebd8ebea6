package model

import "testing"

func TestNoLocalEndpoints(t *testing.T) {
	port := func(name string, ip, ep bool, local int, hasEndpoints bool) *ServicePort {
		p := &ServicePort{ID: PortID{Namespace: "ns", Name: name}, InternalPolicyLocal: ip, ExternalPolicyLocal: ep, HasEndpoints: hasEndpoints}
		for range local {
			p.LocalEndpoints = append(p.LocalEndpoints, &Endpoint{IsLocal: true, Ready: true})
		}
		return p
	}
	tests := []struct {
		name                   string
		ports                  []*ServicePort
		wantInternal, wantExtl int
	}{
		{"no ports", nil, 0, 0},
		{"cluster policies", []*ServicePort{port("a", false, false, 0, true)}, 0, 0},
		{"itp local none", []*ServicePort{port("a", true, false, 0, true)}, 1, 0},
		{"etp local none", []*ServicePort{port("a", false, true, 0, true)}, 0, 1},
		{"both local none", []*ServicePort{port("a", true, true, 0, true)}, 1, 1},
		{"local present", []*ServicePort{port("a", true, true, 2, true)}, 0, 0},
		{"no endpoints at all", []*ServicePort{port("a", true, true, 0, false)}, 0, 0},
		{"several", []*ServicePort{port("a", true, false, 0, true), port("b", true, false, 0, true), port("c", false, true, 1, true)}, 2, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			i, e := NewFamilySnapshot(IPv4, tc.ports).NoLocalEndpoints()
			if i != tc.wantInternal || e != tc.wantExtl {
				t.Errorf("got (%d, %d), want (%d, %d)", i, e, tc.wantInternal, tc.wantExtl)
			}
		})
	}
}
