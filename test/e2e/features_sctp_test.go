//go:build e2e

package e2e

import (
	"errors"
	"net/netip"
	"os"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/kproxy/kproxy/test/testbed/controlplane"
	"github.com/kproxy/kproxy/test/testbed/netbed/echo"
	"golang.org/x/sys/unix"
)

// ipSCTPLB is the SCTP case's LoadBalancer ingress address (extIP index).
const ipSCTPLB = 30

// testSCTP: an SCTP service port beside a TCP one on the same port number.
// Associations reach every endpoint through the ClusterIP (from a pod and
// from a node), the NodePort and the LoadBalancer ingress IP (from the
// external client, masqueraded as the policy is Cluster). This machine's
// kernel has no SCTP, so the case runs in the VM (make e2e-ipvs runs it
// for every mode); the host's make e2e skips it by name.
func testSCTP(t *testing.T, b *fbed, f family) {
	requireSCTP(t)
	svc := b.applyService(t, svcName("sctp", f), v1.ServiceTypeLoadBalancer, withPorts(
		controlplane.ServicePort("tcp", v1.ProtocolTCP, 80, echoPort),
		controlplane.ServicePort("sctp", v1.ProtocolSCTP, 80, echoPort)))
	b.setSlices(t, svc.Name, []discoveryv1.EndpointPort{
		controlplane.EndpointPort("tcp", v1.ProtocolTCP, echoPort),
		controlplane.EndpointPort("sctp", v1.ProtocolSCTP, echoPort),
	}, readyEPs(b.pods...))
	vip := clusterIP(t, svc, f.v6)

	got := waitForPods(t, b.exited, b.pods[0].Netns, req(echo.ProtoSCTP, vip, 80), b.pods...)
	t.Logf("sctp pod %s -> %s:80: %s", b.pods[0].PodName, vip, got)
	got = waitForPods(t, b.exited, b.node(1).Netns, req(echo.ProtoSCTP, vip, 80), b.pods...)
	t.Logf("sctp node2 -> %s:80: %s", vip, got)

	client := b.clientAddr(f)
	masqueraded := func(a netip.Addr) bool { return a != client }
	np := nodePort(t, svc, "sctp")
	got = waitForPods(t, b.exited, b.bed.Client(), req(echo.ProtoSCTP, nodeAddr(b.node(0), f), np), b.pods...)
	t.Logf("sctp client -> node1:%d: %s", np, got)
	checkSources(t, "sctp client -> NodePort", got, masqueraded, "masqueraded (not the client's)")

	lb := extIP(f, ipSCTPLB)
	b.setIngress(t, svc, lbIngress{ip: lb})
	routeVia(t, b.bed.Client(), lb, b.node(1), f)
	got = waitForPods(t, b.exited, b.bed.Client(), req(echo.ProtoSCTP, lb, 80), b.pods...)
	t.Logf("sctp client -> LB %s:80 via node2: %s", lb, got)
	checkSources(t, "sctp client -> LB", got, masqueraded, "masqueraded (not the client's)")

	// The TCP port of the same number still answers: the two protocols are
	// two frontends.
	got = waitForPods(t, b.exited, b.pods[2].Netns, req(echo.ProtoTCP, vip, 80), b.pods...)
	t.Logf("tcp pod %s -> %s:80: %s", b.pods[2].PodName, vip, got)
}

// requireSCTP fails t in CI, and skips it elsewhere, when the kernel has no
// SCTP.
func requireSCTP(t *testing.T) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_SCTP)
	if err == nil {
		_ = unix.Close(fd)
		return
	}
	if !errors.Is(err, unix.EPROTONOSUPPORT) && !errors.Is(err, unix.ESOCKTNOSUPPORT) {
		t.Fatalf("sctp socket: %v", err)
	}
	msg := "this kernel has no SCTP (the case runs in the VM: make e2e-ipvs)"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}
