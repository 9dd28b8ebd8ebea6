package model

import (
	"strings"
	"testing"
)

func TestNoLocalEndpoints(t *testing.T) {
	port := func(name string, ip, ep bool, local int, hasEndpoints bool) *ServicePort {
		svc, portName, _ := strings.Cut(name, ":")
		p := &ServicePort{ID: PortID{Namespace: "ns", Name: svc, Port: portName}, InternalPolicyLocal: ip, ExternalPolicyLocal: ep, HasEndpoints: hasEndpoints}
		for range local {
			p.LocalEndpoints = append(p.LocalEndpoints, &Endpoint{IsLocal: true, Ready: true})
		}
		return p
	}
	tests := []struct {
		name                   string
		ports                  []*ServicePort
		wantInternal, wantExtl int
		// by Service (IPVS mode's count); -1: the same as by port
		svcInternal, svcExtl int
	}{
		{"no ports", nil, 0, 0, -1, -1},
		{"cluster policies", []*ServicePort{port("a", false, false, 0, true)}, 0, 0, -1, -1},
		{"itp local none", []*ServicePort{port("a", true, false, 0, true)}, 1, 0, -1, -1},
		{"etp local none", []*ServicePort{port("a", false, true, 0, true)}, 0, 1, -1, -1},
		{"both local none", []*ServicePort{port("a", true, true, 0, true)}, 1, 1, -1, -1},
		{"local present", []*ServicePort{port("a", true, true, 2, true)}, 0, 0, -1, -1},
		{"no endpoints at all", []*ServicePort{port("a", true, true, 0, false)}, 0, 0, -1, -1},
		{"two ports of one Service", []*ServicePort{port("a:dns", true, true, 0, true), port("a:dns-tcp", true, true, 0, true), port("b", false, true, 0, true)}, 2, 3, 1, 2},
		{"several", []*ServicePort{port("a", true, false, 0, true), port("b", true, false, 0, true), port("c", false, true, 1, true)}, 2, 0, -1, -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fs := NewFamilySnapshot(IPv4, tc.ports)
			i, e := fs.NoLocalEndpoints()
			if i != tc.wantInternal || e != tc.wantExtl {
				t.Errorf("got (%d, %d), want (%d, %d)", i, e, tc.wantInternal, tc.wantExtl)
			}
			wantI, wantE := tc.svcInternal, tc.svcExtl
			if wantI < 0 {
				wantI, wantE = tc.wantInternal, tc.wantExtl
			}
			if i, e := fs.NoLocalEndpointServices(); i != wantI || e != wantE {
				t.Errorf("by Service: got (%d, %d), want (%d, %d)", i, e, wantI, wantE)
			}
		})
	}
}
