//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/objects"
	"github.com/kproxy/kproxy/test/testbed/netbed"
	"github.com/kproxy/kproxy/test/testbed/netbed/echo"
)

// withBalancing sets the kproxy.io/load-balancing annotation.
func withBalancing(name string) svcOpt {
	return func(s *v1.Service) {
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[objects.AnnotationLoadBalancing] = name
	}
}

// testBalancingRoundRobin: a Service annotated round-robin over the four
// pods takes them exactly in turn: every four consecutive new connections
// (TCP) and flows (UDP) from one pod reach four different pods. Every mode
// supports it (nftables numgen inc, iptables statistic nth, IPVS rr).
func testBalancingRoundRobin(t *testing.T, b *fbed, f family) {
	kproxyOnly(t, "the kproxy.io/load-balancing annotation is kproxy's")
	svc := b.applyService(t, svcName("rr", f), v1.ServiceTypeClusterIP, withBalancing("round-robin"))
	b.setSlices(t, svc.Name, nil, readyEPs(b.pods...))
	vip := clusterIP(t, svc, f.v6)
	from := b.pods[0]
	for i, proto := range []string{echo.ProtoTCP, echo.ProtoUDP} {
		r := req(proto, vip, 80)
		waitForPods(t, b.exited, from.Netns, r, b.pods...)
		order := inTurnRequests(t, from, r, f, 6*len(b.pods), uint16(22000+100*i))
		checkInTurn(t, fmt.Sprintf("%s %s -> %s", proto, from.PodName, vip), order, len(b.pods))
		t.Logf("%s %s -> %s: %d connections, the %d pods in turn", proto, from.PodName, vip, len(order), len(b.pods))
	}
	if b.mode != "ipvs" {
		a := b.explainOn(t, b.node(0), podIP(from, f), req(echo.ProtoTCP, vip, 80))
		if a.Balancing != "round-robin" || len(a.Endpoints) != len(b.pods) {
			t.Errorf("explain: %s over %d endpoints, want round-robin over %d", a.Balancing, len(a.Endpoints), len(b.pods))
		}
	}
}

// inTurnRequests sends n requests from pod, one after the other, and
// returns the pod each reached. UDP requests come from source ports
// firstPort, firstPort+1, …: a flow is an address and port pair (a
// conntrack entry, a userspace session), and a port the kernel hands out
// again within the flow's timeout would reuse the flow, not make a new one.
// The ports lie below the ephemeral range (32768–60999), so that no earlier
// request's flow from a kernel-chosen port can be one of them.
func inTurnRequests(t *testing.T, from *netbed.Pod, r echo.Request, f family, n int, firstPort uint16) []string {
	t.Helper()
	var order []string
	for j := range n {
		if r.Proto == echo.ProtoUDP {
			r.Src = netip.AddrPortFrom(podIP(from, f), firstPort+uint16(j))
		}
		res := from.Netns.Send(context.Background(), r)
		if !res.OK() {
			t.Fatalf("%s request %d: %v", r.Proto, j+1, res)
		}
		order = append(order, res.Reply.Pod)
	}
	return order
}

// checkInTurn fails t unless every n consecutive replies in order came
// from n different pods: round-robin's promise.
func checkInTurn(t *testing.T, what string, order []string, n int) {
	t.Helper()
	for i := 0; i+n <= len(order); i++ {
		seen := map[string]bool{}
		for _, p := range order[i : i+n] {
			seen[p] = true
		}
		if len(seen) != n {
			t.Fatalf("%s: replies came from %v; want the %d pods in turn", what, order, n)
		}
	}
}

// hashClients are the client namespace's extra addresses the source-hash
// case sends from: 48 addresses of the node network no other case uses.
func hashClients(f family) []netip.Addr {
	a := pick(f, netip.MustParseAddr("198.18.0.160"), netip.MustParseAddr("fd00:0:0:10::a0"))
	out := make([]netip.Addr, 48)
	for i := range out {
		out[i] = a
		a = a.Next()
	}
	return out
}

// addHashClients gives the client namespace the hashClients addresses
// (IPv6 ones deprecated: never picked as a source unless bound), removed
// when t ends.
func (b *fbed) addHashClients(t *testing.T, f family) []netip.Addr {
	t.Helper()
	ctx := context.Background()
	l := b.bed.Layout()
	addrs := hashClients(f)
	for _, a := range addrs {
		p := netip.PrefixFrom(a, pick2(f, l.NodeNet4, l.NodeNet6).Bits()).String()
		args := []string{"addr", "replace", p, "dev", "eth0"}
		if f.v6 {
			args = append(args, "nodad", "preferred_lft", "0")
		}
		if _, err := b.bed.Client().IP(ctx, args...); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = b.bed.Client().IP(context.Background(), "addr", "del", p, "dev", "eth0") })
	}
	return addrs
}

// hashedPods sends two TCP connections from each client address to dst and
// returns the pod each client reached; a client reaching two pods fails t.
func (b *fbed) hashedPods(t *testing.T, clients []netip.Addr, dst netip.AddrPort) map[netip.Addr]string {
	t.Helper()
	out, err := b.tryHashedPods(clients, dst)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// tryHashedPods is hashedPods that returns a client reaching two pods (or
// failing) as an error: while a change of endpoints is going in, a
// client's two connections may straddle it.
func (b *fbed) tryHashedPods(clients []netip.Addr, dst netip.AddrPort) (map[netip.Addr]string, error) {
	out := map[netip.Addr]string{}
	for _, c := range clients {
		r := echo.Request{Proto: echo.ProtoTCP, Dst: dst, Src: netip.AddrPortFrom(c, 0)}
		got := burst(b.bed.Client(), r, 2)
		if len(got.failures) > 0 || len(got.byPod) != 1 {
			return nil, fmt.Errorf("client %s -> %s: %s; want both connections to one pod", c, dst, got)
		}
		out[c] = got.pods()[0]
	}
	return out, nil
}

// predictedPods is where kproxy's nftables rules send each client of a
// source-hash port whose endpoints are pods (on echoPort): the model's
// Maglev table and the kernel's jhash, computed here without the kernel.
func predictedPods(ns, svc string, pods []*netbed.Pod, clients []netip.Addr, f family) map[netip.Addr]string {
	sp := &model.ServicePort{ID: model.PortID{Namespace: ns, Name: svc, Port: "tcp", Protocol: model.TCP}}
	eps := make([]*model.Endpoint, len(pods))
	byAddr := map[netip.Addr]string{}
	for i, p := range pods {
		eps[i] = &model.Endpoint{IP: podIP(p, f), Port: echoPort}
		byAddr[podIP(p, f)] = p.PodName
	}
	out := map[netip.Addr]string{}
	for _, c := range clients {
		out[c] = byAddr[sp.SourceHashPick(eps, c).IP]
	}
	return out
}

// testBalancingSourceHash: a NodePort Service annotated source-hash over
// the four pods sends every connection of a client to one pod, spreads 48
// clients over all four, and when one pod goes, moves the clients of that
// pod and at most 10 % of the others (Maglev's table; IPVS's mh). In
// nftables mode every client's pod is the one kproxy's model predicts
// (its table and the kernel's jhash), before and after, and explain names
// it. iptables mode cannot do source-hash: the Service gets a Warning
// Event from each node's kproxy and keeps working at random.
func testBalancingSourceHash(t *testing.T, b *fbed, f family) {
	kproxyOnly(t, "the kproxy.io/load-balancing annotation is kproxy's")
	svc := b.applyService(t, svcName("sh", f), v1.ServiceTypeNodePort, withBalancing("source-hash"))
	b.setSlices(t, svc.Name, nil, readyEPs(b.pods...))
	n1 := b.node(0)
	dst := netip.AddrPortFrom(nodeAddr(n1, f), nodePort(t, svc, "tcp"))
	if b.mode == "iptables" {
		waitForPods(t, b.exited, b.bed.Client(), req(echo.ProtoTCP, dst.Addr(), dst.Port()), b.pods...)
		b.expectEvent(t, svc, model.ReasonUnsupportedBalancing, "source-hash is not supported in iptables mode")
		return
	}
	// One client reaches one pod: wait for an answer, not for every pod.
	eventuallyOK(t, b.bed.Client(), req(echo.ProtoTCP, dst.Addr(), dst.Port()))
	clients := b.addHashClients(t, f)
	before := b.hashedPods(t, clients, dst)
	// The userspace mode hashes as nftables mode's kernel does.
	predicts := b.mode == "nftables" || b.mode == "userspace"
	if predicts {
		if want := predictedPods(b.api.ns, svc.Name, b.pods, clients, f); !maps.Equal(before, want) {
			t.Fatalf("clients reached %v; kproxy's model predicts %v", before, want)
		}
		c := clients[0]
		a := b.explainOn(t, n1, c, req(echo.ProtoTCP, dst.Addr(), dst.Port()))
		if a.Balancing != "source-hash" || len(a.Endpoints) != 1 || a.Endpoints[0].Endpoint.Addr() != podAddrByName(b.pods, before[c], f) {
			t.Errorf("explain for %s: %s, endpoints %v; want source-hash to %s", c, a.Balancing, a.Endpoints, before[c])
		}
	}
	spread := map[string]int{}
	for _, p := range before {
		spread[p]++
	}
	if len(spread) != len(b.pods) {
		t.Errorf("48 clients reached %d of %d pods: %v", len(spread), len(b.pods), spread)
	}

	// One pod goes.
	gone, rest := b.pods[0], b.pods[1:]
	b.setSlices(t, svc.Name, nil, readyEPs(rest...))
	var after map[netip.Addr]string
	for deadline := time.Now().Add(convergeTimeout); ; time.Sleep(resample) {
		// A pass in which every client reached one pod, none of them the
		// pod that went, saw the change whole.
		var err error
		after, err = b.tryHashedPods(clients, dst)
		if err == nil && !slices.Contains(slices.Collect(maps.Values(after)), gone.PodName) {
			break
		}
		if time.Now().After(deadline) {
			if err != nil {
				t.Fatalf("after %s left the endpoints: %v", gone.PodName, err)
			}
			t.Fatalf("%s still answers after it left the endpoints", gone.PodName)
		}
		checkAbort(t, b.exited)
	}
	movedOthers := 0
	for _, c := range clients {
		if before[c] != gone.PodName && after[c] != before[c] {
			movedOthers++
		}
	}
	t.Logf("source-hash: 48 clients over %v; after %s went, %d clients of the other pods moved", spread, gone.PodName, movedOthers)
	if limit := len(clients) / 10; movedOthers > limit {
		t.Errorf("%d of %d clients of the remaining pods moved, want at most %d (10 %%)", movedOthers, len(clients), limit)
	}
	if predicts {
		if want := predictedPods(b.api.ns, svc.Name, rest, clients, f); !maps.Equal(after, want) {
			t.Errorf("after %s went, clients reached %v; kproxy's model predicts %v", gone.PodName, after, want)
		}
	}
}

func podAddrByName(pods []*netbed.Pod, name string, f family) netip.Addr {
	for _, p := range pods {
		if p.PodName == name {
			return podIP(p, f)
		}
	}
	return netip.Addr{}
}

// expectEvent waits (up to 30 s) until every node's kproxy recorded a
// Warning Event with reason on svc whose message has text.
func (b *fbed) expectEvent(t *testing.T, svc *v1.Service, reason, text string) {
	t.Helper()
	ctx := context.Background()
	nodes := len(b.bed.Nodes())
	var last []string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		list, err := b.api.cp.Client.CoreV1().Events(svc.Namespace).List(ctx, metav1.ListOptions{
			FieldSelector: fmt.Sprintf("involvedObject.kind=Service,involvedObject.name=%s,involvedObject.uid=%s", svc.Name, svc.UID),
		})
		if err != nil {
			t.Fatal(err)
		}
		last = last[:0]
		hosts := map[string]bool{}
		for _, e := range list.Items {
			last = append(last, e.Source.Host+": "+e.Reason+": "+e.Message)
			if e.Type == v1.EventTypeWarning && e.Reason == reason && strings.Contains(e.Message, text) {
				hosts[e.Source.Host] = true
			}
		}
		if len(hosts) == nodes {
			t.Logf("Events on %s: %s", svc.Name, strings.Join(last, "; "))
			return
		}
	}
	t.Fatalf("want a %s Event (%q) on %s from each of %d nodes; have %v", reason, text, svc.Name, nodes, last)
}

// testBalancingLeastConnections (IPVS mode: the netfilter modes cannot
// count open connections, and refuse the annotation): four connections
// held open from one pod reach the four pods; after the connections to two
// pods end, the next two new ones go to exactly those two, the pods with
// the fewest open connections.
func testBalancingLeastConnections(t *testing.T, b *fbed, f family) {
	kproxyOnly(t, "the kproxy.io/load-balancing annotation is kproxy's")
	if b.mode != "ipvs" && b.mode != "userspace" {
		t.Skipf("%s mode has no least-connections (IPVS's lc and the userspace mode do it; see the README)", b.mode)
	}
	svc := b.applyService(t, svcName("lc", f), v1.ServiceTypeClusterIP, withBalancing("least-connections"))
	b.setSlices(t, svc.Name, nil, readyEPs(b.pods...))
	dst := netip.AddrPortFrom(clusterIP(t, svc, f.v6), 80)
	from := b.pods[0]
	waitForPods(t, b.exited, from.Netns, req(echo.ProtoTCP, dst.Addr(), dst.Port()), b.pods...)
	hold := func() (*echo.KeepAlive, string) {
		t.Helper()
		k, err := echo.DialKeepAlive(from.Netns.Do, dst, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = k.Reset() })
		res := k.Exchange()
		if !res.OK() {
			t.Fatal(res.Err)
		}
		return k, res.Reply.Pod
	}
	held := map[string]*echo.KeepAlive{}
	for range b.pods {
		k, pod := hold()
		if held[pod] != nil {
			t.Fatalf("a second open connection went to %s while another pod had none", pod)
		}
		held[pod] = k
	}
	freed := []string{b.pods[1].PodName, b.pods[2].PodName}
	for _, p := range freed {
		_ = held[p].Reset()
	}
	if b.mode == "userspace" {
		// The relay counts a connection out once it reads the reset.
		time.Sleep(200 * time.Millisecond)
	}
	got := map[string]bool{}
	for range freed {
		_, pod := hold()
		got[pod] = true
	}
	if !got[freed[0]] || !got[freed[1]] {
		t.Errorf("after the connections to %v ended, two new ones went to %v; want those two pods", freed, got)
	}
}
