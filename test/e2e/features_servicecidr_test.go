//go:build e2e

package e2e

import (
	"context"
	"net/netip"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/kproxy/kproxy/test/testbed/controlplane"
	"github.com/kproxy/kproxy/test/testbed/netbed"
	"github.com/kproxy/kproxy/test/testbed/netbed/echo"
)

// Addresses of the ServiceCIDR case: an extra Service range the case adds
// as a ServiceCIDR object, free in the testbed's address plan, and one
// address in it.
var (
	extraServiceCIDR4 = netip.MustParsePrefix("198.18.96.0/24")
	extraServiceCIDR6 = netip.MustParsePrefix("fd00:0:0:fffd::/112")
	extraServiceIP4   = netip.MustParseAddr("198.18.96.10")
	extraServiceIP6   = netip.MustParseAddr("fd00:0:0:fffd::10")
)

// testServiceCIDR (nftables mode, as upstream: its iptables mode has no such
// rule): new connections to an address of a Service range (a ServiceCIDR
// object's spec.cidrs) that is no allocated ClusterIP are dropped, while
// allocated ClusterIPs work. kproxy also follows ServiceCIDR objects added
// and deleted at once (a change triggers a sync); upstream applies such a
// change only at its next full sync (hourly), so that part is kproxy-only.
// A ServiceCIDR deleted while a Service holds an address from it stays,
// terminating, until its finalizer goes: its range stays in force and the
// Service keeps working, then and after the range is gone.
//
// To show that the drop is kproxy's rule and not a missing route, a
// "catcher" pod owns the probed addresses and the source pod's node routes
// them to it: without the rule the catcher answers.
func testServiceCIDR(t *testing.T, b *fbed, f family) {
	if b.mode != "nftables" {
		t.Skipf("nftables mode only (upstream's %s mode has no rule for unallocated service addresses)", b.mode)
	}
	ctx := context.Background()
	cidrs := b.api.cp.Client.NetworkingV1().ServiceCIDRs()
	checkDefaultServiceCIDR(t, cidrs, pick(f, controlplane.ServiceCIDR4.Addr(), controlplane.ServiceCIDR6.Addr()))

	// An allocated ClusterIP works.
	svc := b.applyService(t, svcName("cidr", f), v1.ServiceTypeClusterIP)
	want := b.podsOn("node2")
	b.setSlices(t, svc.Name, nil, readyEPs(want...))
	from, catcher := b.pods[0], b.pods[1] // both on node1
	waitForPods(t, b.exited, from.Netns, req(echo.ProtoTCP, clusterIP(t, svc, f.v6), 80), want...)

	unallocated := b.unallocatedServiceIP(t, f)
	extra := pick(f, extraServiceIP4, extraServiceIP6)
	b.catch(t, catcher, unallocated, extra)
	for _, ns := range []*netbed.Netns{from.Netns, b.node(0).Netns} {
		// Outside every range: the catcher answers.
		waitForPods(t, b.exited, ns, req(echo.ProtoTCP, extra, echoPort), catcher)
		// In the default range, not allocated: dropped.
		b.expectDropped(t, ns, req(echo.ProtoTCP, unallocated, echoPort), f)
	}
	b.expectDropped(t, from.Netns, req(echo.ProtoUDP, unallocated, echoPort), f)
	if isUpstream() {
		t.Logf("upstream kube-proxy: not checking ServiceCIDR changes (applied only at its next full sync)")
		return
	}

	// A new ServiceCIDR covers the extra address: dropped from now on. It
	// carries the finalizer kube-controller-manager puts on every
	// ServiceCIDR (there is none here to put it), so that deleting it while
	// a Service holds an address from it leaves it terminating, as on a
	// real cluster.
	name := "e2e-extra-" + f.name
	obj := &networkingv1.ServiceCIDR{
		ObjectMeta: metav1.ObjectMeta{Name: name, Finalizers: []string{serviceCIDRFinalizer}},
		Spec:       networkingv1.ServiceCIDRSpec{CIDRs: []string{pick2(f, extraServiceCIDR4, extraServiceCIDR6).String()}},
	}
	if _, err := cidrs.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		releaseServiceCIDR(t, cidrs, name)
		_ = cidrs.Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	b.expectDropped(t, from.Netns, req(echo.ProtoTCP, extra, echoPort), f)

	// A Service allocated from the new range works.
	inRange := b.serviceAt(t, svcName("cidr-in", f), extra.Next(), f)
	b.setSlices(t, inRange.Name, nil, readyEPs(want...))
	waitForPods(t, b.exited, from.Netns, req(echo.ProtoTCP, extra.Next(), 80), want...)

	// Deleted while in use: the object stays, terminating, and so does its
	// range (as upstream, which takes every object's spec.cidrs): the
	// Service keeps working and the free address is still dropped.
	if err := cidrs.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, err := cidrs.Get(ctx, name, metav1.GetOptions{}); err != nil || got.DeletionTimestamp == nil {
		t.Fatalf("ServiceCIDR %s after delete with a finalizer: %v, %v; want it terminating", name, got, err)
	}
	waitForPods(t, b.exited, from.Netns, req(echo.ProtoTCP, extra.Next(), 80), want...)
	b.expectDropped(t, from.Netns, req(echo.ProtoTCP, extra, echoPort), f)

	// Released (the finalizer removed, as the controller does once no
	// address is allocated from it, or as an operator may force): the range
	// is gone from the rules, so the catcher answers again, and the
	// Service, whose ClusterIP now lies outside every range, still works.
	releaseServiceCIDR(t, cidrs, name)
	waitForPods(t, b.exited, from.Netns, req(echo.ProtoTCP, extra, echoPort), catcher)
	waitForPods(t, b.exited, from.Netns, req(echo.ProtoTCP, extra.Next(), 80), want...)
}

// serviceCIDRFinalizer is the finalizer kube-controller-manager's
// servicecidrs controller keeps on a ServiceCIDR while addresses in it are
// allocated.
const serviceCIDRFinalizer = "networking.k8s.io/service-cidr-finalizer"

// releaseServiceCIDR removes the finalizers of the ServiceCIDR name (gone
// already is fine).
func releaseServiceCIDR(t *testing.T, cidrs interface {
	Patch(context.Context, string, types.PatchType, []byte, metav1.PatchOptions, ...string) (*networkingv1.ServiceCIDR, error)
}, name string) {
	t.Helper()
	_, err := cidrs.Patch(context.Background(), name, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("releasing ServiceCIDR %s: %v", name, err)
	}
}

// serviceAt creates a single-family ClusterIP Service with the given
// ClusterIP. The API server learns of a new ServiceCIDR through its own
// watch, so an address in a range just created may be refused for a moment:
// it tries for up to 10 s.
func (b *fbed) serviceAt(t *testing.T, name string, ip netip.Addr, f family) *v1.Service {
	t.Helper()
	svc := controlplane.NewService(b.api.ns, name, nil, defaultPorts()...)
	svc.Spec.ClusterIP = ip.String()
	svc.Spec.ClusterIPs = []string{ip.String()}
	svc.Spec.IPFamilyPolicy = ptr.To(v1.IPFamilyPolicySingleStack)
	svc.Spec.IPFamilies = []v1.IPFamily{v1.IPv4Protocol}
	if f.v6 {
		svc.Spec.IPFamilies = []v1.IPFamily{v1.IPv6Protocol}
	}
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		var out *v1.Service
		out, err = b.api.cp.ApplyService(context.Background(), svc)
		if err == nil {
			t.Cleanup(func() { _ = b.api.cp.DeleteService(context.Background(), b.api.ns, name) })
			return out
		}
		if time.Now().After(deadline) {
			break
		}
	}
	t.Fatalf("Service %s at %s: %v", name, ip, err)
	return nil
}

// checkDefaultServiceCIDR checks that the API server made its default
// ServiceCIDR "kubernetes" from --service-cluster-ip-range.
func checkDefaultServiceCIDR(t *testing.T, cidrs interface {
	Get(context.Context, string, metav1.GetOptions) (*networkingv1.ServiceCIDR, error)
}, in netip.Addr) {
	t.Helper()
	def, err := cidrs.Get(context.Background(), "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the API server's default ServiceCIDR: %v", err)
	}
	for _, s := range def.Spec.CIDRs {
		if p, err := netip.ParsePrefix(s); err == nil && p.Contains(in) {
			return
		}
	}
	t.Fatalf("default ServiceCIDR %v does not cover %s", def.Spec.CIDRs, in)
}

func pick2(f family, v4, v6 netip.Prefix) netip.Prefix {
	if f.v6 {
		return v6
	}
	return v4
}

// unallocatedServiceIP returns an address near the end of the family's
// Service range that no Service holds.
func (b *fbed) unallocatedServiceIP(t *testing.T, f family) netip.Addr {
	t.Helper()
	svcs, err := b.api.cp.Client.CoreV1().Services(metav1.NamespaceAll).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	used := map[netip.Addr]bool{}
	for _, s := range svcs.Items {
		for _, ip := range s.Spec.ClusterIPs {
			if a, err := netip.ParseAddr(ip); err == nil {
				used[a] = true
			}
		}
	}
	rng := pick2(f, controlplane.ServiceCIDR4, controlplane.ServiceCIDR6)
	a := pick(f, netip.MustParseAddr("198.18.255.200"), netip.MustParseAddr("fd00:0:0:ffff::fff0"))
	for range 50 {
		if !used[a] && rng.Contains(a) {
			return a
		}
		a = a.Next()
	}
	t.Fatalf("no unallocated address near the end of %s", rng)
	return netip.Addr{}
}

// catch gives pod the addresses (so its echo server answers on them) and
// routes them from the pod's node to it; undone when t ends.
func (b *fbed) catch(t *testing.T, pod *netbed.Pod, addrs ...netip.Addr) {
	t.Helper()
	ctx := context.Background()
	for _, a := range addrs {
		p := netip.PrefixFrom(a, a.BitLen()).String()
		args := []string{"addr", "replace", p, "dev", "eth0"}
		if a.Is6() {
			args = append([]string{"-6"}, append(args, "nodad")...)
		}
		if _, err := pod.IP(ctx, args...); err != nil {
			t.Fatal(err)
		}
		via := pick(family{v6: a.Is6()}, pod.IP4, pod.IP6)
		if err := pod.Node.AddRoute(ctx, netip.PrefixFrom(a, a.BitLen()), via); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_, _ = pod.Node.IP(context.Background(), "route", "del", p)
			_, _ = pod.IP(context.Background(), "addr", "del", p, "dev", "eth0")
		})
	}
}
