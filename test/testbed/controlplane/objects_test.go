package controlplane

import (
	"net/netip"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
)

func TestNewService(t *testing.T) {
	v4, v6 := netip.MustParseAddr("198.18.128.5"), netip.MustParseAddr("fd00:0:0:ffff::5")
	cases := []struct {
		name     string
		ips      []netip.Addr
		policy   v1.IPFamilyPolicy
		families []v1.IPFamily
	}{
		{"allocated", nil, v1.IPFamilyPolicyPreferDualStack, nil},
		{"v4 only", []netip.Addr{v4}, v1.IPFamilyPolicySingleStack, []v1.IPFamily{v1.IPv4Protocol}},
		{"v6 primary", []netip.Addr{v6, v4}, v1.IPFamilyPolicyRequireDualStack, []v1.IPFamily{v1.IPv6Protocol, v1.IPv4Protocol}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := NewService("ns", "svc", c.ips, ServicePort("p", v1.ProtocolTCP, 80, 0))
			if *s.Spec.IPFamilyPolicy != c.policy || !slices.Equal(s.Spec.IPFamilies, c.families) {
				t.Errorf("policy %s families %v, want %s %v", *s.Spec.IPFamilyPolicy, s.Spec.IPFamilies, c.policy, c.families)
			}
			if len(c.ips) > 0 && s.Spec.ClusterIP != c.ips[0].String() {
				t.Errorf("ClusterIP %s, want %s", s.Spec.ClusterIP, c.ips[0])
			}
			if s.Spec.Ports[0].TargetPort.IntVal != 80 {
				t.Errorf("targetPort %v, want 80", s.Spec.Ports[0].TargetPort)
			}
		})
	}
}

func TestMergeServiceKeepsAllocations(t *testing.T) {
	cur := NewService("ns", "svc", []netip.Addr{netip.MustParseAddr("198.18.128.5")}, ServicePort("p", v1.ProtocolTCP, 80, 0))
	cur.ResourceVersion = "7"
	cur.Spec.Ports[0].NodePort = 30080
	want := NewService("ns", "svc", nil, ServicePort("p", v1.ProtocolTCP, 80, 8080))
	got := mergeService(want, cur)
	if got.ResourceVersion != "7" || got.Spec.ClusterIP != "198.18.128.5" || got.Spec.Ports[0].NodePort != 30080 ||
		got.Spec.Ports[0].TargetPort.IntVal != 8080 {
		t.Errorf("merged spec = %+v (rv %s)", got.Spec, got.ResourceVersion)
	}
}

func TestNewNode(t *testing.T) {
	n := NewNode("n1", []netip.Prefix{netip.MustParsePrefix("198.18.17.0/24"), netip.MustParsePrefix("fd00:0:0:101::/64")},
		[]netip.Addr{netip.MustParseAddr("198.18.0.11")}, "zone-a")
	if n.Spec.PodCIDR != "198.18.17.0/24" || len(n.Spec.PodCIDRs) != 2 || n.Labels[ZoneLabel] != "zone-a" ||
		len(n.Status.Addresses) != 2 || n.Status.Addresses[0].Type != v1.NodeInternalIP {
		t.Errorf("node = %+v", n)
	}
}

func TestAddressPlanInAllowedSpace(t *testing.T) {
	v4, v6 := netip.MustParsePrefix("198.18.0.0/15"), netip.MustParsePrefix("fd00::/8")
	for _, p := range []netip.Prefix{ServiceCIDR4, ServiceCIDR6, LoadBalancerCIDR4, LoadBalancerCIDR6} {
		if !(v4.Contains(p.Addr()) && p.Bits() >= v4.Bits()) && !(v6.Contains(p.Addr()) && p.Bits() >= v6.Bits()) {
			t.Errorf("%s is outside the testbed's address space", p)
		}
	}
	if !ServiceCIDR4.Contains(KubernetesServiceIP4) || KubernetesServiceIP4 != ServiceCIDR4.Addr().Next() {
		t.Errorf("KubernetesServiceIP4 %s is not the first address of %s", KubernetesServiceIP4, ServiceCIDR4)
	}
}
