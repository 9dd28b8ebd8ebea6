//go:build e2e

package e2e

import (
	"context"
	"net/netip"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/kproxy/kproxy/test/testbed/netbed"
	"github.com/kproxy/kproxy/test/testbed/netbed/echo"
)

// Addresses of the external-traffic cases (extIP indexes), one per case so
// that routes added to the client never collide.
const (
	ipLBIngress = 10 + iota
	ipLBNoNodePorts
	ipLBModeVIP
	ipLBModeProxy
	ipLBSourceRanges
	ipExternalIP
	ipETPLocal
	ipTerminating
	ipNoExternalIP
	ipETPLocalExternalIP
)

// nodePortCIDRs is --nodeport-addresses of the NodePortAddresses variant:
// the cluster CIDRs, which hold every node's pod bridge address but not its
// node-network address.
var nodePortCIDRs = netbed.ClusterCIDR4.String() + "," + netbed.ClusterCIDR6.String()

// testLoadBalancerIngress: a VIP-mode ingress IP set in the Service status,
// routed from the client to node1, reaches every endpoint (masqueraded, as
// the policy is Cluster); pods reach it too.
func testLoadBalancerIngress(t *testing.T, b *fbed, f family) {
	svc := b.applyService(t, svcName("lb", f), v1.ServiceTypeLoadBalancer)
	b.setSlices(t, svc.Name, nil, readyEPs(b.pods...))
	lb := extIP(f, ipLBIngress)
	b.setIngress(t, svc, lbIngress{ip: lb})
	routeVia(t, b.bed.Client(), lb, b.node(0), f)
	client := b.clientAddr(f)
	for _, proto := range []string{echo.ProtoTCP, echo.ProtoUDP} {
		got := waitForPods(t, b.exited, b.bed.Client(), req(proto, lb, 80), b.pods...)
		t.Logf("%s client -> %s:80: %s", proto, lb, got)
		checkSources(t, proto+" client -> LB", got, func(a netip.Addr) bool { return a != client }, "masqueraded (not the client's)")
	}
	got := waitForPods(t, b.exited, b.pods[3].Netns, req(echo.ProtoTCP, lb, 80), b.pods...)
	t.Logf("tcp pod %s -> %s:80: %s", b.pods[3].PodName, lb, got)
}

// testLoadBalancerNoNodePorts: with allocateLoadBalancerNodePorts=false the
// Service has no node port, and its ingress IP still works.
func testLoadBalancerNoNodePorts(t *testing.T, b *fbed, f family) {
	svc := b.applyService(t, svcName("lbnonp", f), v1.ServiceTypeLoadBalancer, func(s *v1.Service) {
		s.Spec.AllocateLoadBalancerNodePorts = ptr.To(false)
	})
	for _, p := range svc.Spec.Ports {
		if p.NodePort != 0 {
			t.Fatalf("port %s got node port %d despite allocateLoadBalancerNodePorts=false", p.Name, p.NodePort)
		}
	}
	b.setSlices(t, svc.Name, nil, readyEPs(b.pods...))
	lb := extIP(f, ipLBNoNodePorts)
	b.setIngress(t, svc, lbIngress{ip: lb})
	routeVia(t, b.bed.Client(), lb, b.node(1), f)
	got := waitForPods(t, b.exited, b.bed.Client(), req(echo.ProtoTCP, lb, 80), b.pods...)
	t.Logf("tcp client -> %s:80 via node2: %s", lb, got)
}

// testLoadBalancerIPModeProxy: an ingress IP with ipMode Proxy gets no rules.
// The Proxy IP is an address of node1 itself, so traffic that is not DNATed
// reaches node1's own stack, where nothing listens on port 80 (refused); the
// VIP-mode IP of the same Service shows the update was programmed.
func testLoadBalancerIPModeProxy(t *testing.T, b *fbed, f family) {
	svc := b.applyService(t, svcName("lbproxy", f), v1.ServiceTypeLoadBalancer)
	b.setSlices(t, svc.Name, nil, readyEPs(b.pods...))
	vip, proxy := extIP(f, ipLBModeVIP), extIP(f, ipLBModeProxy)
	node := b.node(0)
	addLocalAddr(t, node, proxy)
	b.setIngress(t, svc, lbIngress{ip: vip}, lbIngress{ip: proxy, proxy: true})
	routeVia(t, b.bed.Client(), vip, node, f)
	routeVia(t, b.bed.Client(), proxy, node, f)
	got := waitForPods(t, b.exited, b.bed.Client(), req(echo.ProtoTCP, vip, 80), b.pods...)
	t.Logf("tcp client -> VIP-mode %s:80: %s", vip, got)
	b.expectRefused(t, b.bed.Client(), req(echo.ProtoTCP, proxy, 80), f)
}

// addLocalAddr adds addr to node's loopback until t ends.
func addLocalAddr(t *testing.T, node *netbed.Node, addr netip.Addr) {
	t.Helper()
	ctx := context.Background()
	pfx := netip.PrefixFrom(addr, addr.BitLen()).String()
	if _, err := node.IP(ctx, "addr", "replace", pfx, "dev", "lo"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = node.IP(context.Background(), "addr", "del", pfx, "dev", "lo") })
}

// testLoadBalancerSourceRanges: the client's first address is in
// loadBalancerSourceRanges and is answered; its second address is not and
// is dropped; the first is answered again afterwards. In IPVS mode the
// node's own connection (its address out of range) is dropped too. The client ignores
// redirects (netbed): in iptables mode the out-of-range packet is forwarded
// back towards the on-link LB IP before filter drops it, and the node's
// ICMPv6 redirect would otherwise misroute the client (see
// redirects_test.go).
func testLoadBalancerSourceRanges(t *testing.T, b *fbed, f family) {
	in4, in6 := b.clientAddr(family{}), b.clientAddr(family{v6: true})
	svc := b.applyService(t, svcName("lbsrc", f), v1.ServiceTypeLoadBalancer, func(s *v1.Service) {
		s.Spec.LoadBalancerSourceRanges = []string{
			netip.PrefixFrom(in4, 32).String(), netip.PrefixFrom(in6, 128).String()}
	})
	b.setSlices(t, svc.Name, nil, readyEPs(b.pods...))
	lb := extIP(f, ipLBSourceRanges)
	b.setIngress(t, svc, lbIngress{ip: lb})
	routeVia(t, b.bed.Client(), lb, b.node(0), f)
	got := waitForPods(t, b.exited, b.bed.Client(), req(echo.ProtoTCP, lb, 80), b.pods...)
	t.Logf("tcp from %s (in range) -> %s:80: %s", b.clientAddr(f), lb, got)
	b.explainAgrees(t, b.node(0), b.clientAddr(f), req(echo.ProtoTCP, lb, 80), got)
	out := req(echo.ProtoTCP, lb, 80)
	out.Src = netip.AddrPortFrom(client2Addr(f), 0)
	b.expectTurnedAway(t, b.bed.Client(), out, f)
	b.explainSays(t, b.node(0), client2Addr(f), out, b.turnedAway(out))
	// The range check is on new connections only; in-range keeps working.
	if r := b.bed.Client().Send(context.Background(), req(echo.ProtoTCP, lb, 80)); !r.OK() {
		t.Errorf("in-range client after the out-of-range one: %s\n%s", r, redirectState(b.bed.Client(), b.node(0), b.clientAddr(f), lb))
	}
	if b.mode == "ipvs" {
		// The LB IP is node1's own (kube-ipvs0), and node1's address is
		// out of range: its own connection is dropped, as upstream's
		// KUBE-IPVS-OUT-FILTER drops it (IPVS takes it at LOCAL_OUT).
		b.expectDropped(t, b.node(0).Netns, req(echo.ProtoTCP, lb, 80), f)
	}
}

// testExternalIPs: spec.externalIPs routed from the client to node2 reach
// every endpoint; pods reach them too.
func testExternalIPs(t *testing.T, b *fbed, f family) {
	ext := extIP(f, ipExternalIP)
	svc := b.applyService(t, svcName("extip", f), v1.ServiceTypeClusterIP, func(s *v1.Service) {
		s.Spec.ExternalIPs = []string{ext.String()}
	})
	b.setSlices(t, svc.Name, nil, readyEPs(b.pods...))
	routeVia(t, b.bed.Client(), ext, b.node(1), f)
	for _, proto := range []string{echo.ProtoTCP, echo.ProtoUDP} {
		got := waitForPods(t, b.exited, b.bed.Client(), req(proto, ext, 80), b.pods...)
		t.Logf("%s client -> externalIP %s:80: %s", proto, ext, got)
	}
	got := waitForPods(t, b.exited, b.pods[0].Netns, req(echo.ProtoTCP, ext, 80), b.pods...)
	t.Logf("tcp pod %s -> externalIP %s:80: %s", b.pods[0].PodName, ext, got)
}

// testNoExternalIPs (kproxy started with --feature-gates
// AllowServiceExternalIPs=false, upstream's gate): a Service's external IP,
// routed from the client to node2, reaches no pod, while its ClusterIP,
// from a pod, reaches every endpoint.
func testNoExternalIPs(t *testing.T, b *fbed, f family) {
	ext := extIP(f, ipNoExternalIP)
	svc := b.applyService(t, svcName("noextip", f), v1.ServiceTypeClusterIP, func(s *v1.Service) {
		s.Spec.ExternalIPs = []string{ext.String()}
	})
	b.setSlices(t, svc.Name, nil, readyEPs(b.pods...))
	routeVia(t, b.bed.Client(), ext, b.node(1), f)
	vip := clusterIP(t, svc, f.v6)
	got := waitForPods(t, b.exited, b.pods[0].Netns, req(echo.ProtoTCP, vip, 80), b.pods...)
	t.Logf("tcp pod %s -> ClusterIP %s:80: %s", b.pods[0].PodName, vip, got)
	r := req(echo.ProtoTCP, ext, 80)
	r.Timeout = dropTimeout(f)
	for range 3 {
		if res := b.bed.Client().Send(context.Background(), r); res.OK() {
			t.Errorf("tcp client -> externalIP %s:80 answered with AllowServiceExternalIPs=false: %s", ext, res)
		} else {
			t.Logf("tcp client -> externalIP %s:80: %s", ext, res)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// testNodePortAddresses (kproxy started with --nodeport-addresses
// nodePortCIDRs): a NodePort is answered on node1's pod-bridge address (in
// the CIDRs) and not on its node-network address (outside them).
func testNodePortAddresses(t *testing.T, b *fbed, f family) {
	svc := b.applyService(t, svcName("npaddr", f), v1.ServiceTypeNodePort)
	b.setSlices(t, svc.Name, nil, readyEPs(b.pods...))
	node := b.node(0)
	inRange := pick(f, node.Gateway4, node.Gateway6)
	routeVia(t, b.bed.Client(), inRange, node, f)
	port := nodePort(t, svc, "tcp")
	got := waitForPods(t, b.exited, b.bed.Client(), req(echo.ProtoTCP, inRange, port), b.pods...)
	t.Logf("tcp client -> %s:%d (in --nodeport-addresses): %s", inRange, port, got)
	r := req(echo.ProtoTCP, nodeAddr(node, f), port)
	r.Timeout = dropTimeout(f)
	for range 3 {
		if res := b.bed.Client().Send(context.Background(), r); res.OK() {
			t.Errorf("tcp client -> %s (outside --nodeport-addresses) answered: %s", r.Dst, res)
		} else {
			t.Logf("tcp client -> %s (outside --nodeport-addresses): %s", r.Dst, res)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
