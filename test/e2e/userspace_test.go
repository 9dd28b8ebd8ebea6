//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/objects"
	"github.com/kproxy/kproxy/test/testbed/controlplane"
	"github.com/kproxy/kproxy/test/testbed/netbed"
	"github.com/kproxy/kproxy/test/testbed/netbed/echo"
)

// TestUserspaceMode runs kproxy's userspace mode (--proxy-mode userspace)
// on the bed: ClusterIPs from pods and nodes and NodePorts from the
// client, TCP, HTTP and UDP, reach every pod through kproxy's relays; a
// Service without endpoints is refused at once; each algorithm picks as
// it promises; a dead endpoint costs a client no failed connection; and
// --cleanup removes the mode's interface. The backends see the node's
// address: the relays connect from it.
func TestUserspaceMode(t *testing.T) {
	kproxyOnly(t, "the userspace mode is kproxy's")
	c := newCluster(t, "userspace")
	for _, f := range families {
		t.Run(f.name, func(t *testing.T) {
			t.Run("ClusterIP", func(t *testing.T) { testUserspaceClusterIP(t, c, f) })
			t.Run("NodePortFromClient", func(t *testing.T) { testUserspaceNodePort(t, c, f) })
			t.Run("RejectWithoutEndpoints", func(t *testing.T) { testRejectWithoutEndpoints(t, c, f) })
			t.Run("EndpointUpdates", func(t *testing.T) { testEndpointUpdates(t, c, f) })
			t.Run("Balancing", func(t *testing.T) { testUserspaceBalancing(t, c, f) })
			t.Run("DeadEndpoint", func(t *testing.T) { testUserspaceDeadEndpoint(t, c, f) })
			c.checkKproxysRunning(t)
		})
	}
	t.Run("HealthAndMetrics", func(t *testing.T) { testHealthAndMetrics(t, c) })
	t.Run("HandOver", func(t *testing.T) { testUserspaceHandOver(t, c) })
	t.Run("Cleanup", func(t *testing.T) {
		node := c.bed.Nodes()[1]
		if err := c.kproxys[node.Spec.Name].Stop(); err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if out, err := node.Run(ctx, kproxyBinary(t), "--cleanup", "--v", "2"); err != nil {
			t.Fatalf("--cleanup: %v\n%s", err, tail(out, 20))
		}
		if out, _ := node.IP(ctx, "link", "show"); strings.Contains(out, "kproxy0") {
			t.Errorf("after --cleanup the node still has kproxy0:\n%s", out)
		}
	})
}

func testUserspaceClusterIP(t *testing.T, c *cluster, f family) {
	svc := c.api.createService(svcName("us", f), v1.ServiceTypeClusterIP)
	c.api.setEndpoints(svc.Name, c.pods)
	vip := clusterIP(t, svc, f.v6)
	from := c.pods[0]
	for _, proto := range []string{echo.ProtoTCP, echo.ProtoHTTP, echo.ProtoUDP} {
		got := waitForPods(t, c.exited, from.Netns, req(proto, vip, 80), c.pods...)
		t.Logf("%s from pod %s to %s: %s", proto, from.PodName, vip, got)
	}
	for _, n := range c.bed.Nodes() {
		got := waitForPods(t, c.exited, n.Netns, tcpTo(vip, 80), c.pods...)
		t.Logf("tcp from node %s to %s: %s", n.Spec.Name, vip, got)
	}
}

func testUserspaceNodePort(t *testing.T, c *cluster, f family) {
	svc := c.api.createService(svcName("usnp", f), v1.ServiceTypeNodePort)
	c.api.setEndpoints(svc.Name, c.pods)
	for _, n := range c.bed.Nodes() {
		for _, pp := range []struct{ port, proto string }{{"tcp", echo.ProtoTCP}, {"udp", echo.ProtoUDP}} {
			dst := netip.AddrPortFrom(pick(f, n.Spec.IP4, n.Spec.IP6), nodePort(t, svc, pp.port))
			got := waitForPods(t, c.exited, c.bed.Client(), echo.Request{Proto: pp.proto, Dst: dst}, c.pods...)
			t.Logf("%s from the client to %s: %s", pp.proto, dst, got)
		}
	}
}

// testUserspaceBalancing: round-robin takes the four pods in turn (TCP
// connections and UDP sessions), least-connections sends a new
// connection to a pod without one, source-hash keeps each client on one
// pod.
func testUserspaceBalancing(t *testing.T, c *cluster, f family) {
	from := c.pods[0]
	rr := c.api.createAnnotatedService(svcName("usrr", f), v1.ServiceTypeClusterIP, map[string]string{objects.AnnotationLoadBalancing: "round-robin"})
	c.api.setEndpoints(rr.Name, c.pods)
	vip := clusterIP(t, rr, f.v6)
	for i, proto := range []string{echo.ProtoTCP, echo.ProtoUDP} {
		r := req(proto, vip, 80)
		waitForPods(t, c.exited, from.Netns, r, c.pods...)
		checkInTurn(t, "round-robin "+proto, inTurnRequests(t, from, r, f, 6*len(c.pods), uint16(25000+100*i)), len(c.pods))
	}

	lc := c.api.createAnnotatedService(svcName("uslc", f), v1.ServiceTypeClusterIP, map[string]string{objects.AnnotationLoadBalancing: "least-connections"})
	c.api.setEndpoints(lc.Name, c.pods)
	dst := netip.AddrPortFrom(clusterIP(t, lc, f.v6), 80)
	waitForPods(t, c.exited, from.Netns, req(echo.ProtoTCP, dst.Addr(), dst.Port()), c.pods...)
	held := map[string]bool{}
	for range c.pods {
		k, err := echo.DialKeepAlive(from.Netns.Do, dst, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer k.Close()
		res := k.Exchange()
		if !res.OK() || held[res.Reply.Pod] {
			t.Fatalf("least-connections: open connection %d went to %s (%v), which already had one", len(held)+1, res.Reply.Pod, res.Err)
		}
		held[res.Reply.Pod] = true
	}

	sh := c.api.createAnnotatedService(svcName("ussh", f), v1.ServiceTypeClusterIP, map[string]string{objects.AnnotationLoadBalancing: "source-hash"})
	c.api.setEndpoints(sh.Name, c.pods)
	shVIP := clusterIP(t, sh, f.v6)
	eventuallyOK(t, c.pods[1].Netns, req(echo.ProtoTCP, shVIP, 80))
	for _, p := range c.pods {
		got := burst(p.Netns, req(echo.ProtoTCP, shVIP, 80), 8)
		if len(got.failures) > 0 || len(got.byPod) != 1 {
			t.Errorf("source-hash from %s: %s; want every connection to one pod", p.PodName, got)
		}
	}
}

// testUserspaceDeadEndpoint: with an endpoint where nothing answers (an
// address of node2's pod range no pod has) among the pods, 40 new
// connections all succeed: a failed connect is retried on another
// endpoint and the dead one is skipped while it backs off.
func testUserspaceDeadEndpoint(t *testing.T, c *cluster, f family) {
	svc := c.api.createService(svcName("usdead", f), v1.ServiceTypeClusterIP)
	n2 := c.bed.Nodes()[1]
	dead := pick(f, n2.Spec.PodCIDR4.Addr(), n2.Spec.PodCIDR6.Addr())
	for range 250 {
		dead = dead.Next()
	}
	slice := controlplane.NewEndpointSlice(c.api.ns, svc.Name, svc.Name+"-dead", addressType(f),
		[]discoveryv1.EndpointPort{controlplane.EndpointPort("tcp", v1.ProtocolTCP, echoPort), controlplane.EndpointPort("udp", v1.ProtocolUDP, echoPort)},
		controlplane.ReadyEndpoint(dead, n2.Spec.Name, n2.Spec.Zone))
	c.api.setEndpoints(svc.Name, c.pods)
	if _, err := c.api.cp.Client.DiscoveryV1().EndpointSlices(c.api.ns).Create(context.Background(), slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	vip := clusterIP(t, svc, f.v6)
	waitForPods(t, c.exited, c.pods[0].Netns, tcpTo(vip, 80), c.pods...)
	got := burst(c.pods[0].Netns, tcpTo(vip, 80), 40)
	if len(got.failures) > 0 {
		t.Errorf("with a dead endpoint among %d pods: %s; want every connection answered", len(c.pods), got)
	}
	t.Logf("dead endpoint %s among the pods: %s", dead, got)
}

func addressType(f family) discoveryv1.AddressType {
	if f.v6 {
		return discoveryv1.AddressTypeIPv6
	}
	return discoveryv1.AddressTypeIPv4
}

// testUserspaceHandOver: a second kproxy started on node1 next to the first
// (a DaemonSet update with maxSurge), then the first stopped, then the
// first's successor started and the second stopped: new connections from
// a pod on node1 to a ClusterIP, every 10 ms in both families, never fail.
// The listeners share their addresses (SO_REUSEPORT); the one that exits
// closes its sockets first and lets its relays finish.
func testUserspaceHandOver(t *testing.T, c *cluster) {
	n1 := c.bed.Nodes()[0]
	svc := c.api.createService("us-handover", v1.ServiceTypeClusterIP)
	c.api.setEndpoints(svc.Name, c.pods)
	from := c.pods[0]
	var probers []*prober
	for _, f := range families {
		r := tcpTo(clusterIP(t, svc, f.v6), 80)
		waitForPods(t, c.exited, from.Netns, r, c.pods...)
		r.Timeout = dropTimeout(f)
		probers = append(probers, startProber(from.Netns, r, 10*time.Millisecond, time.Minute))
	}
	// The surge process: the same flags but for its own serving ports.
	surgeHealth := netip.AddrPortFrom(n1.Spec.IP4, 10266)
	args := withFlags(c.kproxyArgs(t, n1), map[string]string{
		"--healthz-bind-address": surgeHealth.String(),
		"--metrics-bind-address": "127.0.0.1:10250",
		"--debug-bind-address":   "127.0.0.1:10269",
	})
	surge, err := n1.Start("kproxy-surge", args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = surge.Stop() })
	healthy := func(p *netbed.Process, at netip.AddrPort) {
		t.Helper()
		eventually(t, func() error {
			if !p.Running() {
				return fmt.Errorf("kproxy exited (%v):\n%s", p.ExitErr(), tail(p.Log(), 20))
			}
			return nil
		}, func() error {
			code, body, err := n1.HTTPGet(context.Background(), "http://"+at.String()+"/healthz")
			if err == nil && code != 200 {
				err = fmt.Errorf("status %d: %s", code, body)
			}
			return err
		}, "healthz of the kproxy at %s", at)
	}
	healthy(surge, surgeHealth)
	time.Sleep(time.Second) // both serve
	first := c.kproxys[n1.Spec.Name]
	if err := first.Stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("first kproxy stopped: %s", lastLine(first.Log(), "Stopped relaying"))
	time.Sleep(time.Second) // the surge process alone
	next, err := n1.Start("kproxy", c.kproxyArgs(t, n1)...)
	if err != nil {
		t.Fatal(err)
	}
	c.kproxys[n1.Spec.Name] = next
	healthy(next, netip.AddrPortFrom(n1.Spec.IP4, 10256))
	time.Sleep(time.Second)
	if err := surge.Stop(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	stopFamilyProbers(t, probers, "two hand-overs")
}

// withFlags returns args with the values of the flags in set replaced.
func withFlags(args []string, set map[string]string) []string {
	out := slices.Clone(args)
	for i := 0; i+1 < len(out); i++ {
		if v, ok := set[out[i]]; ok {
			out[i+1] = v
		}
	}
	return out
}

// lastLine is the last line of log that contains text ("" if none).
func lastLine(log, text string) string {
	lines := strings.Split(log, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], text) {
			return lines[i]
		}
	}
	return ""
}
