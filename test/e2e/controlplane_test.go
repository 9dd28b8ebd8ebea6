//go:build e2e

package e2e

import (
	"context"
	"net/netip"
	"slices"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kproxy/kproxy/test/testbed/controlplane"
	"github.com/kproxy/kproxy/test/testbed/netbed"
)

// TestControlPlaneServes checks the shared API server: its version, its
// dual-stack Service ranges, and that Nodes, Services and EndpointSlices
// written by the tests read back as written.
func TestControlPlaneServes(t *testing.T) {
	cp := sharedControlPlane(t)
	ctx := context.Background()
	v, err := cp.Client.Discovery().ServerVersion()
	if err != nil || v.GitVersion != controlplane.Version {
		t.Fatalf("server version = %v, %v; want %s", v, err, controlplane.Version)
	}

	node, err := cp.CreateNode(ctx, "cp-node1",
		[]netip.Prefix{netip.MustParsePrefix("198.18.17.0/24"), netip.MustParsePrefix("fd00:0:0:101::/64")},
		[]netip.Addr{netip.MustParseAddr("198.18.0.11"), netip.MustParseAddr("fd00:0:0:10::11")}, "zone-a")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.DeleteNode(context.Background(), node.Name) })
	got, err := cp.Client.CoreV1().Nodes().Get(ctx, node.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Spec.PodCIDRs, []string{"198.18.17.0/24", "fd00:0:0:101::/64"}) ||
		len(got.Status.Addresses) != 3 || got.Labels[controlplane.ZoneLabel] != "zone-a" {
		t.Errorf("node read back as spec=%+v addresses=%v labels=%v", got.Spec, got.Status.Addresses, got.Labels)
	}

	ns := "e2e-controlplane"
	clusterIPs := []netip.Addr{netip.MustParseAddr("198.18.128.10"), netip.MustParseAddr("fd00:0:0:ffff::10")}
	svc, err := cp.ApplyService(ctx, controlplane.NewService(ns, "web", clusterIPs,
		controlplane.ServicePort("http", v1.ProtocolTCP, 80, 8080)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.DeleteService(context.Background(), ns, svc.Name) })
	if !slices.Equal(svc.Spec.ClusterIPs, []string{"198.18.128.10", "fd00:0:0:ffff::10"}) {
		t.Errorf("service ClusterIPs = %v", svc.Spec.ClusterIPs)
	}

	auto, err := cp.ApplyService(ctx, controlplane.NewService(ns, "auto", nil,
		controlplane.ServicePort("dns", v1.ProtocolUDP, 53, 0)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.DeleteService(context.Background(), ns, auto.Name) })
	checkAllocated(t, auto)

	ports := []discoveryv1.EndpointPort{controlplane.EndpointPort("http", v1.ProtocolTCP, 8080)}
	slice := controlplane.NewEndpointSlice(ns, "web", "web-ipv4", discoveryv1.AddressTypeIPv4, ports,
		controlplane.ReadyEndpoint(netip.MustParseAddr("198.18.17.2"), "cp-node1", "zone-a"))
	if _, err := cp.ApplyEndpointSlice(ctx, slice); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.DeleteEndpointSlice(context.Background(), ns, slice.Name) })
	slice.Endpoints = append(slice.Endpoints, controlplane.ReadyEndpoint(netip.MustParseAddr("198.18.17.3"), "cp-node1", "zone-a"))
	if _, err := cp.ApplyEndpointSlice(ctx, slice); err != nil {
		t.Fatal(err)
	}
	readBack, err := cp.Client.DiscoveryV1().EndpointSlices(ns).Get(ctx, slice.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(readBack.Endpoints) != 2 || readBack.Labels[discoveryv1.LabelServiceName] != "web" {
		t.Errorf("endpoint slice read back as %+v", readBack)
	}
}

// checkAllocated checks that the API server allocated one ClusterIP per
// family, from the testbed's Service ranges.
func checkAllocated(t *testing.T, svc *v1.Service) {
	t.Helper()
	if len(svc.Spec.ClusterIPs) != 2 {
		t.Fatalf("PreferDualStack service got ClusterIPs %v, want one per family", svc.Spec.ClusterIPs)
	}
	for i, want := range controlplane.ServiceCIDRs() {
		ip, err := netip.ParseAddr(svc.Spec.ClusterIPs[i])
		if err != nil || !want.Contains(ip) {
			t.Errorf("ClusterIP %s not in %s", svc.Spec.ClusterIPs[i], want)
		}
	}
}

// TestControlPlaneKproxyUser checks that the kproxy user may do what
// upstream kube-proxy does (list and watch Services, EndpointSlices, Nodes)
// and nothing more (e.g. not write Services or read Secrets).
func TestControlPlaneKproxyUser(t *testing.T) {
	cp := sharedControlPlane(t)
	cfg, err := clientcmd.BuildConfigFromFlags("", cp.KproxyKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	kc := kubernetes.NewForConfigOrDie(cfg)
	ctx := context.Background()
	if _, err := kc.CoreV1().Services("").List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("kproxy user cannot list services: %v", err)
	}
	cases := []struct {
		verb, group, resource string
		want                  bool
	}{
		{"watch", "", "services", true},
		{"list", "discovery.k8s.io", "endpointslices", true},
		{"get", "", "nodes", true},
		{"watch", "networking.k8s.io", "servicecidrs", true},
		{"create", "events.k8s.io", "events", true},
		{"create", "", "services", false},
		{"update", "discovery.k8s.io", "endpointslices", false},
		{"get", "", "secrets", false},
	}
	for _, c := range cases {
		review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: c.verb, Group: c.group, Resource: c.resource}}}
		out, err := kc.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("access review: %v", err)
		}
		if out.Status.Allowed != c.want {
			t.Errorf("kproxy user may %s %s.%s = %v, want %v", c.verb, c.resource, c.group, out.Status.Allowed, c.want)
		}
	}
}

// TestControlPlaneAddressPlan checks that the Service ranges stay clear of
// the network bed's node network and pod CIDRs, and inside the allowed space.
func TestControlPlaneAddressPlan(t *testing.T) {
	l := netbed.DefaultLayout()
	used := []netip.Prefix{l.NodeNet4, l.NodeNet6, netbed.ClusterCIDR4, netbed.ClusterCIDR6}
	mine := append(controlplane.ServiceCIDRs(), controlplane.LoadBalancerCIDR4, controlplane.LoadBalancerCIDR6)
	for _, p := range mine {
		if !netbed.AllowedV4.Contains(p.Addr()) && !netbed.AllowedV6.Contains(p.Addr()) {
			t.Errorf("%s is outside the testbed's address space", p)
		}
		for _, u := range used {
			if p.Overlaps(u) {
				t.Errorf("%s overlaps the bed's %s", p, u)
			}
		}
	}
	if !l.NodeNet4.Contains(controlplane.AdvertiseAddress4) || testLayout().Host4 != controlplane.AdvertiseAddress4 {
		t.Errorf("advertise address %s is not the bed's root-namespace address %s", controlplane.AdvertiseAddress4, testLayout().Host4)
	}
}
