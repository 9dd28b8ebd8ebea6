//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/kproxy/kproxy/test/testbed/controlplane"
	"github.com/kproxy/kproxy/test/testbed/netbed"
	"github.com/kproxy/kproxy/test/testbed/netbed/echo"
)

// testOddInput feeds odd but valid objects through the real API server,
// one after the other, and after each checks that the odd Service does
// what upstream's semantics say and that a canary Service still answers
// (no crash, no other Service affected): 1,000 endpoints in 10 slices; a
// Service with 100 ports; names at the API's length limits; slices that
// arrive before their Service; slices whose ports match no Service port;
// a protocol change on a port; a ClusterIP change by re-creation.
func testOddInput(t *testing.T, b *fbed, f family) {
	ctx := context.Background()
	on2 := b.podsOn("node2")
	from := b.pods[0].Netns
	stillFine := b.canary(t, f, "oddcanary", false)
	addrType := sliceAddressType(f)
	applySlice := func(svc, name string, ports []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) {
		t.Helper()
		s := controlplane.NewEndpointSlice(b.api.ns, svc, name, addrType, ports, eps...)
		if _, err := b.api.cp.ApplyEndpointSlice(ctx, s); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.api.cp.DeleteEndpointSlice(context.Background(), b.api.ns, name) })
	}
	podEPs := func() []discoveryv1.Endpoint {
		var out []discoveryv1.Endpoint
		for _, p := range on2 {
			out = append(out, endpointOf(b.api.ns, ep{pod: p}, f))
		}
		return out
	}

	// 1,000 endpoints in 10 slices: the two pods and 998 addresses of
	// the cluster range no pod has (ready, so explain counts them all).
	many := b.applyService(t, svcName("oddmany", f), v1.ServiceTypeClusterIP)
	for s := range 10 {
		var eps []discoveryv1.Endpoint
		if s == 0 {
			eps = podEPs()
		}
		for len(eps) < 100 {
			k := s*100 + len(eps)
			a := netip.AddrFrom4([4]byte{198, 18, 30 + byte(k>>8), byte(k)}) // 198.18.30.0/23..: no pod
			if f.v6 {
				a = netip.MustParseAddr(fmt.Sprintf("fd00:0:0:1ff::%x", k+1))
			}
			eps = append(eps, controlplane.ReadyEndpoint(a, "node2", ""))
		}
		applySlice(many.Name, fmt.Sprintf("%s-%02d", many.Name, s), defaultEndpointPorts(), eps...)
	}
	manyReq := req(echo.ProtoTCP, clusterIP(t, many, f.v6), 80)
	// Programmed: explain counts the 1,000 endpoints and (but in IPVS
	// mode) the kernel's rules agree, that is, send to all of them.
	eventually(t, b.exited, func() error {
		var extra []string
		if b.verifies() {
			extra = append(extra, "--verify")
		}
		a, code, out := b.runExplain(t, b.node(0), podIP(b.pods[0], f), manyReq.Dst.String()+"/tcp", extra...)
		if a.Answer == nil {
			return fmt.Errorf("no answer (exit %d) in %q", code, firstLine(out))
		}
		if code != 0 {
			r := a.Verify
			if r == nil {
				return fmt.Errorf("kproxy explain: exit %d: %s", code, firstLine(out))
			}
			notes := r.Notes[:min(len(r.Notes), 4)]
			return fmt.Errorf("kproxy explain --verify: kernel %.200s (%s), notes %q", r.Kernel, r.KernelError, notes)
		}
		if len(a.Endpoints) != 1000 {
			return fmt.Errorf("explain counts %d endpoints, want 1000", len(a.Endpoints))
		}
		return nil
	}, "1,000 endpoints of %s programmed", many.Name)
	stillFine("1,000 endpoints in 10 slices")

	// A Service with 100 ports, each to the echo port: the first and the
	// last answer.
	var ports []v1.ServicePort
	for i := range 100 {
		ports = append(ports, controlplane.ServicePort(fmt.Sprintf("p%03d", i), v1.ProtocolTCP, int32(1000+i), echoPort))
	}
	wide := b.applyService(t, svcName("oddwide", f), v1.ServiceTypeClusterIP, withPorts(ports...))
	var epPorts []discoveryv1.EndpointPort
	for i := range 100 {
		epPorts = append(epPorts, controlplane.EndpointPort(fmt.Sprintf("p%03d", i), v1.ProtocolTCP, echoPort))
	}
	b.setSlices(t, wide.Name, epPorts, readyEPs(on2...))
	for _, port := range []uint16{1000, 1099} {
		waitForPods(t, b.exited, from, req(echo.ProtoTCP, clusterIP(t, wide, f.v6), port), on2...)
	}
	stillFine("a Service with 100 ports")

	// Names at the API's limits: a 63-character Service name (a DNS
	// label) and a 15-character port name (an IANA service name).
	long := strings.Repeat("x", 63-len(svcName("", f))) + svcName("", f)
	longPort := "abcdefghijklmno"
	longSvc := b.applyService(t, long, v1.ServiceTypeClusterIP,
		withPorts(controlplane.ServicePort(longPort, v1.ProtocolTCP, 80, echoPort)))
	applySlice(longSvc.Name, longSvc.Name[:50]+"-slice",
		[]discoveryv1.EndpointPort{controlplane.EndpointPort(longPort, v1.ProtocolTCP, echoPort)}, podEPs()...)
	waitForPods(t, b.exited, from, req(echo.ProtoTCP, clusterIP(t, longSvc, f.v6), 80), on2...)
	stillFine("names at the API's length limits")

	// Slices that arrive before their Service: the Service answers once
	// it exists.
	early := svcName("oddearly", f)
	applySlice(early, early+"-first", defaultEndpointPorts(), podEPs()...)
	stillFine("slices without their Service")
	earlySvc := b.applyService(t, early, v1.ServiceTypeClusterIP)
	waitForPods(t, b.exited, from, req(echo.ProtoTCP, clusterIP(t, earlySvc, f.v6), 80), on2...)

	// Slices whose ports match no Service port: the Service has no
	// endpoints, so it is rejected, as upstream does.
	nomatch := b.applyService(t, svcName("oddnomatch", f), v1.ServiceTypeClusterIP)
	applySlice(nomatch.Name, nomatch.Name+"-other",
		[]discoveryv1.EndpointPort{controlplane.EndpointPort("other", v1.ProtocolTCP, echoPort)}, podEPs()...)
	b.expectRefused(t, from, req(echo.ProtoTCP, clusterIP(t, nomatch, f.v6), 80), f)
	stillFine("slices whose ports match no Service port")

	// A protocol change on a port: "p" from TCP to UDP (the slices name
	// the port, and say UDP too).
	proto := b.applyService(t, svcName("oddproto", f), v1.ServiceTypeClusterIP,
		withPorts(controlplane.ServicePort("p", v1.ProtocolTCP, 80, echoPort)))
	b.setSlices(t, proto.Name, []discoveryv1.EndpointPort{controlplane.EndpointPort("p", v1.ProtocolTCP, echoPort)}, readyEPs(on2...))
	vip := clusterIP(t, proto, f.v6)
	waitForPods(t, b.exited, from, req(echo.ProtoTCP, vip, 80), on2...)
	cur, err := b.api.cp.Client.CoreV1().Services(b.api.ns).Get(ctx, proto.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec.Ports[0].Protocol = v1.ProtocolUDP
	if _, err := b.api.cp.Client.CoreV1().Services(b.api.ns).Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	b.setSlices(t, proto.Name, []discoveryv1.EndpointPort{controlplane.EndpointPort("p", v1.ProtocolUDP, echoPort)}, readyEPs(on2...))
	waitForPods(t, b.exited, from, req(echo.ProtoUDP, vip, 80), on2...)
	// TCP to the port is now an unknown port: rejected in nftables mode,
	// unanswered in the others (as testUnknownPortRejected says).
	if b.refusesUnknownPorts() {
		b.expectRefused(t, from, req(echo.ProtoTCP, vip, 80), f)
	} else {
		eventually(t, b.exited, func() error {
			r := req(echo.ProtoTCP, vip, 80)
			r.Timeout = dropTimeout(f)
			if res := from.Send(ctx, r); res.OK() {
				return fmt.Errorf("TCP %s:80 still answers after the port became UDP: %s", vip, res)
			}
			return nil
		}, "TCP to the port stops answering")
	}
	stillFine("a protocol change")

	// A ClusterIP change by re-creation: the new address answers, the old
	// one no longer does.
	recreated := b.applyService(t, svcName("oddrecreate", f), v1.ServiceTypeClusterIP)
	b.setSlices(t, recreated.Name, nil, readyEPs(on2...))
	oldIP := clusterIP(t, recreated, f.v6)
	waitForPods(t, b.exited, from, req(echo.ProtoTCP, oldIP, 80), on2...)
	if err := b.api.cp.DeleteService(ctx, b.api.ns, recreated.Name); err != nil {
		t.Fatal(err)
	}
	eventually(t, b.exited, func() error {
		if r := from.Send(ctx, req(echo.ProtoTCP, oldIP, 80)); r.OK() {
			return fmt.Errorf("the deleted Service's %s still answers", oldIP)
		}
		return nil
	}, "the deleted Service's ClusterIP stops answering")
	again := b.applyService(t, recreated.Name, v1.ServiceTypeClusterIP)
	newIP := clusterIP(t, again, f.v6)
	t.Logf("re-created %s: ClusterIP %s, was %s", again.Name, newIP, oldIP)
	waitForPods(t, b.exited, from, req(echo.ProtoTCP, newIP, 80), on2...)
	stillFine("a ClusterIP change by re-creation")
}

// canary applies a Service sending to node2's pods and returns a check
// that it still answers a pod of node1 (and, withNodePort, the client
// through node1's NodePort), failing the test after step when it fails.
func (b *fbed) canary(t *testing.T, f family, name string, withNodePort bool) func(step string) {
	t.Helper()
	on2 := b.podsOn("node2")
	typ := v1.ServiceTypeClusterIP
	if withNodePort {
		typ = v1.ServiceTypeNodePort
	}
	svc := b.applyService(t, svcName(name, f), typ)
	b.setSlices(t, svc.Name, nil, readyEPs(on2...))
	type probe struct {
		ns   *netbed.Netns
		r    echo.Request
		what string
	}
	probes := []probe{{b.pods[0].Netns, req(echo.ProtoTCP, clusterIP(t, svc, f.v6), 80), "from a pod"}}
	if withNodePort {
		probes = append(probes, probe{b.bed.Client(), req(echo.ProtoTCP, nodeAddr(b.node(0), f), nodePort(t, svc, "tcp")), "through node1's NodePort"})
	}
	for _, p := range probes {
		waitForPods(t, b.exited, p.ns, p.r, on2...)
	}
	return func(step string) {
		t.Helper()
		for _, p := range probes {
			if got := burst(p.ns, p.r, 10); len(got.failures) > 0 {
				t.Fatalf("after %s the canary Service fails %s: %s", step, p.what, got)
			}
		}
	}
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// testOddNodeInput feeds the rest of the odd input through the real API
// server, checking after each step that a canary NodePort Service still
// answers from a pod of node1 and from the client through node1:
//   - the same endpoint in two slices with different conditions (ready in
//     one, terminating in the other): the ready one counts, as upstream
//     resolves it, and kproxy logs the duplicate;
//   - node1's Node tainted ToBeDeletedByClusterAutoscaler: its /healthz
//     answers 503 with nodeEligible false, and 200 again once the taint is
//     gone, as upstream's;
//   - node1's Node object deleted: /healthz stays 200, as upstream keeps
//     the Node as last seen; then created again without podCIDRs and
//     addresses (podCIDRs cannot be removed by an update), then restored:
//     Services keep being proxied and kproxy says what it does.
func testOddNodeInput(t *testing.T, b *fbed, f family) {
	ctx := context.Background()
	on2 := b.podsOn("node2")
	from := b.pods[0].Netns
	stillFine := b.canary(t, f, "oddnodecanary", true)
	addrType := sliceAddressType(f)

	// The same endpoint (the first pod of node2) ready in slice -a and
	// terminating (not serving) in slice -b, which also lists the second
	// pod: both pods get traffic.
	dupLogged := b.logWatch(t, "duplicate endpoint "+netip.AddrPortFrom(podIP(on2[0], f), echoPort).String())
	dup := b.applyService(t, svcName("odddup", f), v1.ServiceTypeClusterIP)
	ready := endpointOf(b.api.ns, ep{pod: on2[0]}, f)
	gone := ready
	gone.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(false), Terminating: ptr.To(true)}
	for name, eps := range map[string][]discoveryv1.Endpoint{
		"a": {ready},
		"b": {gone, endpointOf(b.api.ns, ep{pod: on2[1]}, f)},
	} {
		s := controlplane.NewEndpointSlice(b.api.ns, dup.Name, dup.Name+"-"+name, addrType, defaultEndpointPorts(), eps...)
		if _, err := b.api.cp.ApplyEndpointSlice(ctx, s); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.api.cp.DeleteEndpointSlice(context.Background(), b.api.ns, s.Name) })
	}
	waitForPods(t, b.exited, from, req(echo.ProtoTCP, clusterIP(t, dup, f.v6), 80), on2...)
	dupLogged()
	stillFine("a duplicate endpoint")

	spec := b.node(0).Spec
	name := spec.Name
	t.Cleanup(func() { // whatever happens, node1 gets its Node back
		_ = b.api.cp.DeleteNode(context.Background(), name)
		_, _ = b.api.cp.CreateNode(context.Background(), name, []netip.Prefix{spec.PodCIDR4, spec.PodCIDR6}, []netip.Addr{spec.IP4, spec.IP6}, spec.Zone)
	})

	// The cluster autoscaler's taint on node1: not eligible, then again.
	node := controlplane.NewNode(name, []netip.Prefix{spec.PodCIDR4, spec.PodCIDR6}, []netip.Addr{spec.IP4, spec.IP6}, spec.Zone)
	node.Spec.Taints = []v1.Taint{{Key: "ToBeDeletedByClusterAutoscaler", Effect: v1.TaintEffectNoSchedule}}
	if _, err := b.api.cp.ApplyNode(ctx, node); err != nil {
		t.Fatal(err)
	}
	b.checkHealthz(t, b.node(0), false)
	stillFine("tainting node1's Node ToBeDeletedByClusterAutoscaler")
	node.Spec.Taints = nil
	if _, err := b.api.cp.ApplyNode(ctx, node); err != nil {
		t.Fatal(err)
	}
	b.checkHealthz(t, b.node(0), true)

	// node1's Node object deleted, re-created bare, then restored.
	goneLogged, backLogged := b.logWatch(t, "Node object was deleted"), b.logWatch(t, "podCIDRs changed")
	if err := b.api.cp.DeleteNode(ctx, name); err != nil {
		t.Fatal(err)
	}
	goneLogged()
	b.checkHealthz(t, b.node(0), true)
	stillFine("deleting node1's Node")
	if _, err := b.api.cp.CreateNode(ctx, name, nil, nil, spec.Zone); err != nil {
		t.Fatal(err)
	}
	backLogged()
	stillFine("re-creating node1's Node without podCIDRs or addresses")
	if err := b.api.cp.DeleteNode(ctx, name); err != nil {
		t.Fatal(err)
	}
	if _, err := b.api.cp.CreateNode(ctx, name, []netip.Prefix{spec.PodCIDR4, spec.PodCIDR6}, []netip.Addr{spec.IP4, spec.IP6}, spec.Zone); err != nil {
		t.Fatal(err)
	}
	stillFine("restoring node1's Node")
	b.checkKproxysRunning(t)
}

// checkHealthz GETs node n's /healthz from the client until it answers
// 200 with nodeEligible true (eligible) or 503 with nodeEligible false.
func (b *fbed) checkHealthz(t *testing.T, n *netbed.Node, eligible bool) {
	t.Helper()
	url := "http://" + netip.AddrPortFrom(n.Spec.IP4, 10256).String() + "/healthz"
	wantCode := 200
	if !eligible {
		wantCode = 503
	}
	eventually(t, b.exited, func() error {
		code, body, err := b.bed.Client().HTTPGet(context.Background(), url)
		if err != nil {
			return err
		}
		var h struct {
			NodeEligible *bool `json:"nodeEligible"`
		}
		if err := json.Unmarshal([]byte(body), &h); err != nil {
			return fmt.Errorf("body %q: %v", body, err)
		}
		if code != wantCode || h.NodeEligible == nil || *h.NodeEligible != eligible {
			return fmt.Errorf("status %d, body %q; want %d with nodeEligible %v", code, body, wantCode, eligible)
		}
		t.Logf("GET %s: %d %s", url, code, strings.TrimSpace(body))
		return nil
	}, "%s's /healthz", n.Spec.Name)
}

// logWatch counts text in node1's kproxy log now; the function it
// returns waits until the text is logged once more.
func (b *fbed) logWatch(t *testing.T, text string) func() {
	kp := b.kproxys[b.node(0).Spec.Name]
	before := strings.Count(kp.Log(), text)
	return func() {
		t.Helper()
		if isUpstream() {
			return
		}
		eventually(t, b.exited, func() error {
			if strings.Count(kp.Log(), text) == before {
				return fmt.Errorf("not logged yet")
			}
			return nil
		}, "node1's kproxy logs %q", text)
	}
}
