//go:build e2e

package e2e

import (
	"context"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/kproxy/kproxy/test/testbed/controlplane"
	"github.com/kproxy/kproxy/test/testbed/netbed/echo"
)

// testProtocolsOnOnePort: TCP and UDP on the same port of one ClusterIP are
// two service ports; both reach the endpoints, from a pod and from a node.
func testProtocolsOnOnePort(t *testing.T, b *fbed, f family) {
	svc := b.applyService(t, svcName("proto", f), v1.ServiceTypeClusterIP)
	want := b.podsOn("node2")
	b.setSlices(t, svc.Name, nil, readyEPs(want...))
	vip := clusterIP(t, svc, f.v6)
	for _, proto := range []string{echo.ProtoTCP, echo.ProtoUDP, echo.ProtoHTTP} {
		got := waitForPods(t, b.exited, b.pods[0].Netns, req(proto, vip, 80), want...)
		t.Logf("%s from pod %s to %s:80: %s", proto, b.pods[0].PodName, vip, got)
		b.explainAgrees(t, b.node(0), podIP(b.pods[0], f), req(proto, vip, 80), got)
		got = waitForPods(t, b.exited, b.node(0).Netns, req(proto, vip, 80), want...)
		t.Logf("%s from node1 to %s:80: %s", proto, vip, got)
	}
}

// testTargetPortRemap: two service ports (80, 81) map to the endpoints'
// port 8080; the service port itself is not where the pods listen.
func testTargetPortRemap(t *testing.T, b *fbed, f family) {
	svc := b.applyService(t, svcName("remap", f), v1.ServiceTypeClusterIP, withPorts(
		controlplane.ServicePort("http", v1.ProtocolTCP, 80, echoPort),
		controlplane.ServicePort("alt", v1.ProtocolTCP, 81, echoPort)))
	want := b.pods
	b.setSlices(t, svc.Name, []discoveryv1.EndpointPort{
		controlplane.EndpointPort("http", v1.ProtocolTCP, echoPort),
		controlplane.EndpointPort("alt", v1.ProtocolTCP, echoPort),
	}, readyEPs(want...))
	vip := clusterIP(t, svc, f.v6)
	for _, port := range []uint16{80, 81} {
		got := waitForPods(t, b.exited, b.pods[1].Netns, req(echo.ProtoTCP, vip, port), want...)
		t.Logf("tcp %s:%d -> :%d: %s", vip, port, echoPort, got)
	}
	// The endpoints' own port on the ClusterIP is not a service port.
	r := req(echo.ProtoTCP, vip, echoPort)
	r.Timeout = dropTimeout(f)
	if res := b.pods[1].Send(context.Background(), r); res.OK() {
		t.Errorf("tcp %s:%d (not a service port) answered: %s", vip, echoPort, res)
	}
}

// testUnknownPortRejected: a port a ClusterIP does not serve is rejected at
// once in nftables mode (upstream's cluster-ips-check); upstream iptables
// mode has no such rule, so there it only must not be answered.
func testUnknownPortRejected(t *testing.T, b *fbed, f family) {
	svc := b.applyService(t, svcName("unknown", f), v1.ServiceTypeClusterIP)
	b.setSlices(t, svc.Name, nil, readyEPs(b.pods...))
	vip := clusterIP(t, svc, f.v6)
	from := b.pods[0].Netns
	waitForPods(t, b.exited, from, req(echo.ProtoTCP, vip, 80), b.pods...)
	for _, proto := range []string{echo.ProtoTCP, echo.ProtoUDP} {
		r := req(proto, vip, 82)
		if b.refusesUnknownPorts() {
			b.expectRefused(t, from, r, f)
			continue
		}
		r.Timeout = dropTimeout(f)
		res := from.Send(context.Background(), r)
		t.Logf("%s mode: %s %s:82 (unknown port): %s (upstream iptables mode does not reject unknown ports)", b.mode, proto, vip, res)
		if res.OK() {
			t.Errorf("%s %s:82 (unknown port) answered: %s", proto, vip, res)
		}
	}
}
