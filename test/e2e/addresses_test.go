//go:build e2e

package e2e

import (
	"net/netip"
	"testing"

	"github.com/kproxy/kproxy/test/testbed/controlplane"
)

// TestAddressPlanRouted checks that every range of the plan (netbed's and
// the control plane's) lies inside the supernets the nodes route, so that
// Service IPs have a route in the node namespaces, and that no two ranges
// overlap. (TestControlPlaneAddressPlan checks the control plane's side.)
func TestAddressPlanRouted(t *testing.T) {
	l := testLayout()
	if err := l.Validate(); err != nil {
		t.Fatal(err)
	}
	ranges := map[string]netip.Prefix{
		"node network v4": l.NodeNet4, "node network v6": l.NodeNet6,
		"service v4": controlplane.ServiceCIDR4, "service v6": controlplane.ServiceCIDR6,
		"lb v4": controlplane.LoadBalancerCIDR4, "lb v6": controlplane.LoadBalancerCIDR6,
	}
	for _, n := range l.Nodes {
		ranges["pods v4 "+n.Name], ranges["pods v6 "+n.Name] = n.PodCIDR4, n.PodCIDR6
	}
	for name, p := range ranges {
		if !l.Supernet4.Contains(p.Addr()) && !l.Supernet6.Contains(p.Addr()) {
			t.Errorf("%s %s is outside the supernets %s, %s", name, p, l.Supernet4, l.Supernet6)
		}
		for other, q := range ranges {
			if name < other && p.Overlaps(q) {
				t.Errorf("%s %s overlaps %s %s", name, p, other, q)
			}
		}
	}
	if !l.NodeNet4.Contains(controlplane.AdvertiseAddress4) {
		t.Errorf("the API server's address %s is not on the node network %s", controlplane.AdvertiseAddress4, l.NodeNet4)
	}
}
