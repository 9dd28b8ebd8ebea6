//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/kproxy/kproxy/internal/explain"
	"github.com/kproxy/kproxy/test/testbed/controlplane"
	"github.com/kproxy/kproxy/test/testbed/netbed"
	"github.com/kproxy/kproxy/test/testbed/netbed/echo"
)

// testSessionAffinity: with sessionAffinity ClientIP, every new connection
// from one client reaches the same one of four endpoints; an endpoint that
// leaves and returns does not get back the client that moved meanwhile.
func testSessionAffinity(t *testing.T, b *fbed, f family) {
	ports := append(defaultPorts(), controlplane.ServicePort("probe", v1.ProtocolTCP, 81, echoPort))
	svc := b.applyService(t, svcName("affinity", f), v1.ServiceTypeClusterIP, withPorts(ports...), func(s *v1.Service) {
		s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{
			ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](60)}}
	})
	b.setSlices(t, svc.Name, nil, readyEPs(b.pods...))
	vip := clusterIP(t, svc, f.v6)
	for _, proto := range []string{echo.ProtoTCP, echo.ProtoUDP} {
		from := b.pods[0]
		pod := b.waitOnePod(t, from.Netns, req(proto, vip, 80), 16)
		again := burst(from.Netns, req(proto, vip, 80), 24)
		if len(again.failures) > 0 || len(again.byPod) != 1 || again.byPod[pod] == 0 {
			t.Errorf("%s %s -> %s: affinity to %s lost: %s", proto, from.PodName, vip, pod, again)
		}
		t.Logf("%s %s -> %s: every reply from %s (%s)", proto, from.PodName, vip, pod, again)
		if a := b.explainOn(t, b.node(0), podIP(from, f), req(proto, vip, 80)); a.Affinity != 60 || len(a.Endpoints) != len(b.pods) {
			t.Errorf("explain: affinity %ds over %d endpoints, want 60s over %d", a.Affinity, len(a.Endpoints), len(b.pods))
		}
	}
	b.checkAffinityFlap(t, svc, f)
}

// checkAffinityFlap: a client goes to endpoint A; A leaves, so the client
// moves to B; A returns within the timeout. The client stays with B, as
// upstream's, which deletes a leaving endpoint's affinity records. A has
// the lower address, so its rules come first: a record of A kept from
// before would win. The Service's "probe" port gets endpoints in the same
// slice update that brings A back: once it answers, that update is live.
func (b *fbed) checkAffinityFlap(t *testing.T, svc *v1.Service, f family) {
	from := b.pods[0]
	cands := slices.Clone(b.pods[1:])
	slices.SortFunc(cands, func(x, y *netbed.Pod) int { return podIP(x, f).Compare(podIP(y, f)) })
	epA, epB := cands[0], cands[len(cands)-1]
	vip := clusterIP(t, svc, f.v6)
	r := req(echo.ProtoTCP, vip, 80)
	b.setSlices(t, svc.Name, nil, readyEPs(epA))
	waitForPods(t, b.exited, from.Netns, r, epA)
	b.setSlices(t, svc.Name, nil, readyEPs(epB))
	waitForPods(t, b.exited, from.Netns, r, epB)
	probe := append(defaultEndpointPorts(), controlplane.EndpointPort("probe", v1.ProtocolTCP, echoPort))
	b.setSlices(t, svc.Name, probe, readyEPs(epA, epB))
	b.waitOnePod(t, from.Netns, req(echo.ProtoTCP, vip, 81), 4)
	got := burst(from.Netns, r, 16)
	if len(got.failures) > 0 || len(got.byPod) != 1 || got.byPod[epB.PodName] == 0 {
		t.Errorf("tcp %s -> %s after %s left and came back: want every reply from %s: %s", from.PodName, vip, epA.PodName, epB.PodName, got)
	}
	t.Logf("tcp %s -> %s after %s left and came back: %s", from.PodName, vip, epA.PodName, got)
}

// testExternalTrafficPolicyLocal: via the node with local endpoints, the
// NodePort and the LB IP answer from those endpoints only and keep the
// client's address; via the other node the NodePort drops (IPVS mode: the
// cluster's endpoints get it and their reply is lost); the health-check
// node port says so (200/503, upstream's JSON); the other node itself and
// its pods reach the cluster's endpoints.
func testExternalTrafficPolicyLocal(t *testing.T, b *fbed, f family) {
	svc := b.applyService(t, svcName("etplocal", f), v1.ServiceTypeLoadBalancer, withETPLocal)
	local := b.podsOn("node1")
	b.setSlices(t, svc.Name, nil, readyEPs(local...))
	lb := extIP(f, ipETPLocal)
	b.setIngress(t, svc, lbIngress{ip: lb})
	n1, n2 := b.node(0), b.node(1)
	routeVia(t, b.bed.Client(), lb, n1, f)
	client := b.clientAddr(f)
	kept, keptWhat := b.sourceKept(client, n1)
	np := nodePort(t, svc, "tcp")
	for _, dst := range []netip.Addr{nodeAddr(n1, f), lb} {
		for _, proto := range []string{echo.ProtoTCP, echo.ProtoUDP} {
			port := np
			if proto == echo.ProtoUDP {
				port = nodePort(t, svc, "udp")
			}
			if dst == lb {
				port = 80
			}
			got := waitForPods(t, b.exited, b.bed.Client(), req(proto, dst, port), local...)
			t.Logf("%s client -> %s:%d: %s", proto, dst, port, got)
			checkSources(t, fmt.Sprintf("%s client -> %s:%d", proto, dst, port), got, kept, keptWhat)
			b.explainAgrees(t, n1, client, req(proto, dst, port), got)
		}
	}
	b.checkHealthCheckNodePort(t, svc, f, map[*netbed.Node]int{n1: len(local), n2: 0})
	b.checkHealthCountsOtherPorts(t, svc, f, n1, n2, len(local))
	viaN2 := req(echo.ProtoTCP, nodeAddr(n2, f), np)
	if b.mode == "ipvs" {
		// Upstream's IPVS mode gives node2's external virtual servers the
		// cluster's endpoints when node2 has none (kubernetes PR 97081):
		// the client's connection goes to node1's pods with its address
		// kept, and their reply, sent straight from node1, never
		// completes it.
		b.expectDropped(t, b.bed.Client(), viaN2, f)
		b.explainSays(t, n2, client, viaN2, explain.Forward)
		// The LB IP is node1's own here (kube-ipvs0): its health-check
		// port answers there too, as a cloud load balancer may probe it.
		b.checkHealthCheckAt(t, svc, lb, len(local))
	} else {
		b.expectTurnedAway(t, b.bed.Client(), viaN2, f)
		b.explainSays(t, n2, client, viaN2, b.turnedAway(viaN2))
	}

	// Short-circuit: the node without local endpoints, and its pods, use
	// the cluster's endpoints (in IPVS mode by the fallback above).
	got := waitForPods(t, b.exited, n2.Netns, req(echo.ProtoTCP, nodeAddr(n2, f), np), local...)
	t.Logf("tcp node2 -> its own NodePort %s:%d: %s", nodeAddr(n2, f), np, got)
	pod := b.podsOn("node2")[0]
	got = waitForPods(t, b.exited, pod.Netns, req(echo.ProtoTCP, nodeAddr(n2, f), np), local...)
	t.Logf("tcp pod %s -> node2's NodePort: %s", pod.PodName, got)
	b.explainAgrees(t, n2, podIP(pod, f), req(echo.ProtoTCP, nodeAddr(n2, f), np), got)
	got = waitForPods(t, b.exited, pod.Netns, req(echo.ProtoTCP, lb, 80), local...)
	t.Logf("tcp pod %s -> LB %s:80: %s", pod.PodName, lb, got)

	// An external IP of a Local-policy Service whose port number is also
	// a Cluster-policy NodePort keeps the client's address too: the
	// external IP is matched before the node ports (IPVS mode once
	// masqueraded it, its external IP being a local address of node1).
	clusterNP := b.applyService(t, svcName("etplocal-np", f), v1.ServiceTypeNodePort)
	port := nodePort(t, clusterNP, "tcp")
	ext := extIP(f, ipETPLocalExternalIP)
	extSvc := b.applyService(t, svcName("etplocal-ext", f), v1.ServiceTypeClusterIP, withETPLocal, func(s *v1.Service) {
		s.Spec.ExternalIPs = []string{ext.String()}
		s.Spec.Ports = []v1.ServicePort{controlplane.ServicePort("tcp", v1.ProtocolTCP, int32(port), echoPort)}
	})
	b.setSlices(t, extSvc.Name, nil, readyEPs(local...))
	routeVia(t, b.bed.Client(), ext, n1, f)
	got = waitForPods(t, b.exited, b.bed.Client(), req(echo.ProtoTCP, ext, port), local...)
	t.Logf("tcp client -> externalIP %s:%d (a Cluster-policy NodePort's number): %s", ext, port, got)
	checkSources(t, fmt.Sprintf("tcp client -> externalIP %s:%d", ext, port), got, kept, keptWhat)
}

// checkHealthCountsOtherPorts: a slice whose port no Service port names
// (a port rename in progress, mirrored Endpoints) with a ready endpoint on
// n2 makes n2's health-check node port answer 200 with one local endpoint,
// as upstream counts local ready endpoints over every slice port; the
// endpoint carries no traffic. Its removal brings back the 503.
func (b *fbed) checkHealthCountsOtherPorts(t *testing.T, svc *v1.Service, f family, n1, n2 *netbed.Node, local int) {
	t.Helper()
	name := svc.Name + "-other-" + f.name
	ports := []discoveryv1.EndpointPort{controlplane.EndpointPort("metrics", v1.ProtocolTCP, echoPort)}
	slice := controlplane.NewEndpointSlice(b.api.ns, svc.Name, name, sliceAddressType(f), ports,
		endpointOf(b.api.ns, ep{pod: b.podsOn("node2")[0]}, f))
	if _, err := b.api.cp.ApplyEndpointSlice(context.Background(), slice); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.api.cp.DeleteEndpointSlice(context.Background(), b.api.ns, name) })
	b.checkHealthCheckNodePort(t, svc, f, map[*netbed.Node]int{n1: local, n2: 1})
	if err := b.api.cp.DeleteEndpointSlice(context.Background(), b.api.ns, name); err != nil {
		t.Fatal(err)
	}
	b.checkHealthCheckNodePort(t, svc, f, map[*netbed.Node]int{n1: local, n2: 0})
}

// checkHealthCheckNodePort GETs the Service's health-check node port on
// every node in want (node -> local endpoints) from the client and checks
// the status (200 with local endpoints, 503 without) and upstream's body.
func (b *fbed) checkHealthCheckNodePort(t *testing.T, svc *v1.Service, f family, want map[*netbed.Node]int) {
	t.Helper()
	hc := uint16(svc.Spec.HealthCheckNodePort)
	if hc == 0 {
		t.Fatalf("service %s has no health-check node port", svc.Name)
	}
	for n, count := range want {
		b.checkHealthCheckAt(t, svc, nodeAddr(n, f), count)
	}
}

// checkHealthCheckAt GETs the Service's health-check node port at addr
// from the client: 200 with count local endpoints, 503 without.
func (b *fbed) checkHealthCheckAt(t *testing.T, svc *v1.Service, addr netip.Addr, count int) {
	t.Helper()
	url := "http://" + netip.AddrPortFrom(addr, uint16(svc.Spec.HealthCheckNodePort)).String() + "/"
	wantCode := 200
	if count == 0 {
		wantCode = 503
	}
	eventually(t, b.exited, func() error {
		code, body, err := b.bed.Client().HTTPGet(context.Background(), url)
		if err != nil {
			return err
		}
		h, perr := parseHC(body)
		switch {
		case code != wantCode:
			return fmt.Errorf("status %d, want %d; body %q", code, wantCode, body)
		case perr != nil:
			return fmt.Errorf("body %q: %v", body, perr)
		case h.Service.Namespace != svc.Namespace || h.Service.Name != svc.Name || h.LocalEndpoints != count || !h.ServiceProxyHealthy:
			return fmt.Errorf("body %+v, want service %s/%s localEndpoints %d serviceProxyHealthy true", h, svc.Namespace, svc.Name, count)
		}
		t.Logf("GET %s: %d %s", url, code, body)
		return nil
	}, "health-check node port %s", url)
}

// testInternalTrafficPolicyLocal: pods and nodes reach only the endpoints
// on their own node; without local endpoints their traffic is dropped.
func testInternalTrafficPolicyLocal(t *testing.T, b *fbed, f family) {
	svc := b.applyService(t, svcName("itplocal", f), v1.ServiceTypeClusterIP, withITPLocal)
	on1, on2 := b.podsOn("node1"), b.podsOn("node2")
	b.setSlices(t, svc.Name, nil, readyEPs(on1[0], on1[1], on2[0]))
	vip := clusterIP(t, svc, f.v6)
	for _, c := range []struct {
		ns   *netbed.Netns
		want []*netbed.Pod
	}{
		{on1[1].Netns, on1}, {b.node(0).Netns, on1},
		{on2[1].Netns, on2[:1]}, {b.node(1).Netns, on2[:1]},
	} {
		got := waitForPods(t, b.exited, c.ns, req(echo.ProtoTCP, vip, 80), c.want...)
		t.Logf("tcp %s -> %s: %s", c.ns.Name, vip, got)
	}
	before, err := noLocalInternal(b.node(1), f)
	if err != nil {
		t.Fatal(err)
	}
	b.setSlices(t, svc.Name, nil, readyEPs(on1...))
	// node2's kubeproxy_sync_proxy_rules_no_local_endpoints_total counts
	// the Service's two ports, or in IPVS mode the Service once, as
	// upstream's modes do.
	wantMore := float64(len(defaultPorts()))
	if b.mode == "ipvs" {
		wantMore = 1
	}
	eventually(t, b.exited, func() error {
		got, err := noLocalInternal(b.node(1), f)
		if err != nil {
			return err
		}
		if got != before+wantMore {
			return fmt.Errorf("%v, want %v (%v before, +%v)", got, before+wantMore, before, wantMore)
		}
		return nil
	}, "node2's no_local_endpoints_total{traffic_policy=internal}")
	// Without local endpoints: dropped; upstream's IPVS mode answers (a
	// virtual server without real servers) with ICMP port unreachable.
	expect := b.expectTurnedAway
	if b.mode == "ipvs" {
		expect = b.expectRefused
	}
	expect(t, on2[1].Netns, req(echo.ProtoTCP, vip, 80), f)
	verdict := b.turnedAway(req(echo.ProtoTCP, vip, 80))
	if b.mode == "ipvs" {
		verdict = explain.Reject
	}
	b.explainSays(t, b.node(1), podIP(on2[1], f), req(echo.ProtoTCP, vip, 80), verdict)
	expect(t, b.node(1).Netns, req(echo.ProtoTCP, vip, 80), f)
	got := waitForPods(t, b.exited, on1[0].Netns, req(echo.ProtoTCP, vip, 80), on1...)
	t.Logf("tcp %s -> %s (still local endpoints): %s", on1[0].PodName, vip, got)
}

// noLocalInternal reads the node's proxy's
// kubeproxy_sync_proxy_rules_no_local_endpoints_total for the internal
// traffic policy and f.
func noLocalInternal(node *netbed.Node, f family) (float64, error) {
	fams, err := scrapeNode(node)
	if err != nil {
		return 0, fmt.Errorf("%s metrics: %w", node.Spec.Name, err)
	}
	for _, m := range fams["kubeproxy_sync_proxy_rules_no_local_endpoints_total"].GetMetric() {
		if l := labels(m.GetLabel()); l["traffic_policy"] == "internal" && l["ip_family"] == familyName(f) {
			return m.GetGauge().GetValue(), nil
		}
	}
	return 0, nil
}

// testTerminatingEndpoints: external traffic with policy Local falls back
// to local serving+terminating endpoints while cluster traffic uses the
// ready ones; with only serving+terminating endpoints cluster traffic uses
// them; endpoints that are neither ready nor serving are not used (reject).
func testTerminatingEndpoints(t *testing.T, b *fbed, f family) {
	svc := b.applyService(t, svcName("terminating", f), v1.ServiceTypeNodePort, withETPLocal)
	a, c := b.podsOn("node1")[0], b.podsOn("node2")[0]
	from := b.podsOn("node1")[1]
	vip := clusterIP(t, svc, f.v6)
	np := req(echo.ProtoTCP, nodeAddr(b.node(0), f), nodePort(t, svc, "tcp"))

	b.setSlices(t, svc.Name, nil, []ep{{pod: a, state: epServingTerminating}, {pod: c}})
	got := waitForPods(t, b.exited, b.bed.Client(), np, a)
	t.Logf("client -> node1 NodePort (local endpoint only terminating): %s", got)
	kept, keptWhat := b.sourceKept(b.clientAddr(f), b.node(0))
	checkSources(t, "client -> NodePort (Local)", got, kept, keptWhat)
	got = waitForPods(t, b.exited, from.Netns, req(echo.ProtoTCP, vip, 80), c)
	t.Logf("pod -> ClusterIP (one ready, one terminating): %s", got)

	b.setSlices(t, svc.Name, nil, []ep{{pod: a, state: epServingTerminating}, {pod: c, state: epServingTerminating}})
	got = waitForPods(t, b.exited, from.Netns, req(echo.ProtoTCP, vip, 80), a, c)
	t.Logf("pod -> ClusterIP (only serving+terminating): %s", got)

	b.setSlices(t, svc.Name, nil, []ep{{pod: a, state: epTerminating}, {pod: c, state: epTerminating}})
	b.expectRefused(t, from.Netns, req(echo.ProtoTCP, vip, 80), f)
	b.expectRefused(t, b.bed.Client(), np, f)
}

// testTopologyHints: when every endpoint has a zone hint, a node uses only
// the endpoints hinted for its zone (nodes carry zone-a / zone-b labels).
func testTopologyHints(t *testing.T, b *fbed, f family) {
	svc := b.applyService(t, svcName("hints", f), v1.ServiceTypeClusterIP)
	var eps []ep
	for _, p := range b.pods {
		eps = append(eps, ep{pod: p, hint: p.Node.Spec.Zone})
	}
	b.setSlices(t, svc.Name, nil, eps)
	vip := clusterIP(t, svc, f.v6)
	on1, on2 := b.podsOn("node1"), b.podsOn("node2")
	for _, c := range []struct {
		ns   *netbed.Netns
		want []*netbed.Pod
	}{{on1[0].Netns, on1}, {b.node(1).Netns, on2}, {on2[0].Netns, on2}} {
		got := waitForPods(t, b.exited, c.ns, req(echo.ProtoTCP, vip, 80), c.want...)
		t.Logf("tcp %s -> %s: %s", c.ns.Name, vip, got)
	}
	got := waitForPods(t, b.exited, on2[1].Netns, req(echo.ProtoTCP, vip, 80), on2...)
	b.explainAgrees(t, b.node(1), podIP(on2[1], f), req(echo.ProtoTCP, vip, 80), got)
}

// testHealthCheckPortTaken: a health-check node port another process
// holds on node1 when the proxy starts there is not served by it; the
// proxy records a FailedToStartServiceHealthcheck Warning on the Service
// (action Listen, reported by kube-proxy, naming the node and the port),
// as upstream's, and opens the port at a later sync once it is free.
func testHealthCheckPortTaken(t *testing.T, b *fbed, f family) {
	svc := b.applyService(t, svcName("hctaken", f), v1.ServiceTypeLoadBalancer, withETPLocal)
	local := b.podsOn("node1")
	b.setSlices(t, svc.Name, nil, readyEPs(local...))
	n1 := b.node(0)
	b.checkHealthCheckNodePort(t, svc, f, map[*netbed.Node]int{n1: len(local)})

	kp := b.kproxys[n1.Spec.Name]
	if err := kp.Stop(); err != nil {
		t.Fatal(err)
	}
	var l net.Listener
	if err := n1.Netns.Do(func() (err error) {
		l, err = net.Listen("tcp", fmt.Sprintf(":%d", svc.Spec.HealthCheckNodePort))
		return err
	}); err != nil {
		t.Fatalf("taking the health-check node port in node1: %v", err)
	}
	defer l.Close()
	if err := kp.Restart(); err != nil {
		t.Fatal(err)
	}
	b.waitHealthy(t)
	ctx := context.Background()
	want := fmt.Sprintf("on port %d", svc.Spec.HealthCheckNodePort)
	eventually(t, b.exited, func() error {
		list, err := b.api.cp.Client.CoreV1().Events(svc.Namespace).List(ctx, metav1.ListOptions{
			FieldSelector: "involvedObject.kind=Service,involvedObject.name=" + svc.Name + ",reason=FailedToStartServiceHealthcheck"})
		if err != nil {
			return err
		}
		for _, ev := range list.Items {
			if ev.Type == v1.EventTypeWarning && ev.Action == "Listen" && ev.ReportingController == "kube-proxy" &&
				strings.Contains(ev.Message, "node1") && strings.Contains(ev.Message, want) {
				t.Logf("event: %s %s (%s): %s", ev.Type, ev.Reason, ev.ReportingInstance, ev.Message)
				return nil
			}
		}
		return fmt.Errorf("no FailedToStartServiceHealthcheck Warning naming node1 %s among %d", want, len(list.Items))
	}, "the health-check port's Warning on %s", svc.Name)

	// Freed, the port opens at the next sync (an endpoint change).
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	b.setSlices(t, svc.Name, nil, readyEPs(local[:1]...))
	b.checkHealthCheckNodePort(t, svc, f, map[*netbed.Node]int{n1: 1})
}
