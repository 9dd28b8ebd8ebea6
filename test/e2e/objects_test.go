//go:build e2e

package e2e

import (
	"context"
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"

	"github.com/kproxy/kproxy/test/testbed/controlplane"
	"github.com/kproxy/kproxy/test/testbed/netbed"
)

// api writes the Kubernetes objects of one test (through the control
// plane's helpers) in its own namespace and deletes them when the test ends
// (no controller-manager runs, so nothing else would).
type api struct {
	t  *testing.T
	cp *controlplane.ControlPlane
	ns string
}

func newAPI(t *testing.T, namespace string) *api {
	t.Helper()
	a := &api{t: t, cp: sharedControlPlane(t), ns: namespace}
	if err := a.cp.EnsureNamespace(context.Background(), namespace); err != nil {
		t.Fatal(err)
	}
	return a
}

// applyNodes writes a Node object for every bed node (both InternalIPs, both
// pod CIDRs, zone label) and deletes them when the test ends.
func (a *api) applyNodes(bed *netbed.Bed) {
	a.t.Helper()
	ctx := context.Background()
	for _, n := range bed.Nodes() {
		s := n.Spec
		_, err := a.cp.CreateNode(ctx, s.Name, []netip.Prefix{s.PodCIDR4, s.PodCIDR6}, []netip.Addr{s.IP4, s.IP6}, s.Zone)
		if err != nil {
			a.t.Fatal(err)
		}
		a.t.Cleanup(func() { _ = a.cp.DeleteNode(context.Background(), s.Name) })
	}
}

// createService creates a dual-stack Service of type typ (ClusterIP or
// NodePort), ports "tcp" and "udp" 80 -> echoPort; the API server allocates
// its IPs and node ports.
func (a *api) createService(name string, typ v1.ServiceType) *v1.Service {
	return a.createAnnotatedService(name, typ, nil)
}

// createAnnotatedService is createService with annotations.
func (a *api) createAnnotatedService(name string, typ v1.ServiceType, annotations map[string]string) *v1.Service {
	a.t.Helper()
	svc := controlplane.NewService(a.ns, name, nil,
		controlplane.ServicePort("tcp", v1.ProtocolTCP, 80, echoPort),
		controlplane.ServicePort("udp", v1.ProtocolUDP, 80, echoPort))
	svc.Spec.Type = typ
	svc.Annotations = annotations
	svc.Spec.IPFamilyPolicy = ptr.To(v1.IPFamilyPolicyRequireDualStack)
	out, err := a.cp.ApplyService(context.Background(), svc)
	if err != nil {
		a.t.Fatal(err)
	}
	a.t.Cleanup(func() { _ = a.cp.DeleteService(context.Background(), a.ns, name) })
	return out
}

// setEndpoints writes the Service's two EndpointSlices (<svc>-ipv4 and
// <svc>-ipv6) so that they list exactly pods, ready, on echoPort for TCP and
// UDP. An empty pods still writes (empty) slices.
func (a *api) setEndpoints(svc string, pods []*netbed.Pod) {
	a.t.Helper()
	ports := []discoveryv1.EndpointPort{
		controlplane.EndpointPort("tcp", v1.ProtocolTCP, echoPort),
		controlplane.EndpointPort("udp", v1.ProtocolUDP, echoPort),
	}
	for _, fam := range []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6} {
		var eps []discoveryv1.Endpoint
		for _, p := range pods {
			addr := p.IP4
			if fam == discoveryv1.AddressTypeIPv6 {
				addr = p.IP6
			}
			ep := controlplane.ReadyEndpoint(addr, p.Node.Spec.Name, p.Node.Spec.Zone)
			ep.TargetRef = &v1.ObjectReference{Kind: "Pod", Namespace: a.ns, Name: p.PodName}
			eps = append(eps, ep)
		}
		name := svc + "-" + map[discoveryv1.AddressType]string{
			discoveryv1.AddressTypeIPv4: "ipv4", discoveryv1.AddressTypeIPv6: "ipv6"}[fam]
		slice := controlplane.NewEndpointSlice(a.ns, svc, name, fam, ports, eps...)
		if _, err := a.cp.ApplyEndpointSlice(context.Background(), slice); err != nil {
			a.t.Fatal(err)
		}
		a.t.Cleanup(func() { _ = a.cp.DeleteEndpointSlice(context.Background(), a.ns, name) })
	}
}

// clusterIP returns the Service's ClusterIP of the given family.
func clusterIP(t *testing.T, svc *v1.Service, v6 bool) netip.Addr {
	t.Helper()
	for _, s := range svc.Spec.ClusterIPs {
		if a, err := netip.ParseAddr(s); err == nil && a.Is6() == v6 {
			return a
		}
	}
	t.Fatalf("service %s has no ClusterIP of family v6=%v: %v", svc.Name, v6, svc.Spec.ClusterIPs)
	return netip.Addr{}
}

// nodePort returns the node port of the Service's port named name.
func nodePort(t *testing.T, svc *v1.Service, name string) uint16 {
	t.Helper()
	for _, p := range svc.Spec.Ports {
		if p.Name == name && p.NodePort != 0 {
			return uint16(p.NodePort)
		}
	}
	t.Fatalf("service %s has no node port %q", svc.Name, name)
	return 0
}
