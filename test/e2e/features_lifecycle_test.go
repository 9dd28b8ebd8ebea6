//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/explain"
	"github.com/kproxy/kproxy/test/testbed/netbed"
	"github.com/kproxy/kproxy/test/testbed/netbed/echo"
)

// Fixed client source ports of the conntrack cases (per family, so the two
// families never share a flow).
func srcPort(f family, base uint16) uint16 {
	if f.v6 {
		return base + 1
	}
	return base
}

// retryUntilPod sends r from ns every 200 ms until a reply comes from want,
// for at most bound, and returns the last result.
func retryUntilPod(ns *netbed.Netns, r echo.Request, want string, bound time.Duration) (echo.Result, bool) {
	var last echo.Result
	deadline := time.Now().Add(bound)
	for time.Now().Before(deadline) {
		if last = ns.Send(context.Background(), r); last.OK() && last.Reply.Pod == want {
			return last, true
		}
		time.Sleep(200 * time.Millisecond)
	}
	return last, false
}

// testStaleConntrackUDP: a UDP flow (fixed source port) to a ClusterIP
// whose endpoint is replaced by another pod reaches the new pod: kproxy
// deletes the conntrack entries that still DNAT to the removed endpoint.
// The retries keep the stale entry alive, so only the cleanup can pass.
func testStaleConntrackUDP(t *testing.T, b *fbed, f family) {
	svc := b.applyService(t, svcName("stale", f), v1.ServiceTypeClusterIP)
	on2 := b.podsOn("node2")
	old, repl := on2[0], on2[1]
	b.setSlices(t, svc.Name, nil, readyEPs(old))
	from := b.pods[0]
	r := req(echo.ProtoUDP, clusterIP(t, svc, f.v6), 80)
	r.Src = netip.AddrPortFrom(netip.Addr{}, srcPort(f, 40100))
	res, ok := retryUntilPod(from.Netns, r, old.PodName, convergeTimeout)
	if !ok {
		t.Fatalf("udp %s:%d -> %s: no reply from %s (last: %s)%s", from.PodName, r.Src.Port(), r.Dst, old.PodName, res, b.udpFlowState(r.Src.Port()))
	}
	t.Logf("udp %s:%d -> %s: %s", from.PodName, r.Src.Port(), r.Dst, res)
	b.setSlices(t, svc.Name, nil, readyEPs(repl))
	res, ok = retryUntilPod(from.Netns, r, repl.PodName, 10*time.Second)
	if !ok {
		t.Fatalf("udp from the same source port still not at %s after 10s (last: %s)%s", repl.PodName, res, b.udpFlowState(r.Src.Port()))
	}
	got := burst(from.Netns, r, 8)
	if len(got.failures) > 0 || len(got.byPod) != 1 || got.byPod[repl.PodName] == 0 {
		t.Errorf("after the endpoint moved: %s, want only %s", got, repl.PodName)
	}
}

// udpFlowState is node1's view of the UDP flows from source port sport:
// conntrack, and IPVS's connections in IPVS mode.
func (b *fbed) udpFlowState(sport uint16) string {
	ctx := context.Background()
	out, err := b.node(0).Run(ctx, "conntrack", "-L", "-p", "udp", "--orig-port-src", fmt.Sprint(sport))
	s := fmt.Sprintf("\nconntrack on node1 (err=%v):\n%s", err, out)
	out, err = b.node(0).Run(ctx, "conntrack", "-S")
	s += fmt.Sprintf("\nconntrack -S on node1 (err=%v):\n%s", err, out)
	if b.mode == "ipvs" {
		out, err = b.node(0).Run(ctx, "cat", "/proc/net/ip_vs_conn")
		s += fmt.Sprintf("\n/proc/net/ip_vs_conn on node1 (err=%v):\n%s", err, out)
	}
	return s
}

// testUDPGainsEndpoint: a UDP Service without endpoints is rejected; once it
// gains an endpoint, the same flow (fixed source port) reaches it.
func testUDPGainsEndpoint(t *testing.T, b *fbed, f family) {
	svc := b.applyService(t, svcName("udpgain", f), v1.ServiceTypeClusterIP)
	b.setSlices(t, svc.Name, nil, nil)
	from, target := b.pods[0], b.podsOn("node2")[0]
	r := req(echo.ProtoUDP, clusterIP(t, svc, f.v6), 80)
	r.Src = netip.AddrPortFrom(netip.Addr{}, srcPort(f, 40200))
	b.expectRefused(t, from.Netns, r, f)
	b.explainSays(t, b.node(0), podIP(from, f), r, explain.Reject)
	b.setSlices(t, svc.Name, nil, readyEPs(target))
	if res, ok := retryUntilPod(from.Netns, r, target.PodName, 10*time.Second); !ok {
		t.Fatalf("udp flow not answered by the new endpoint %s within 10s: %s", target.PodName, res)
	}
}

// addBackCycles is how many remove/add-back cycles the blackhole case runs.
const addBackCycles = 3

// testNoBlackholeOnAddBack: while the only endpoint of a Service is removed
// and added back, connections probed every 5 ms are either answered or
// rejected fast; none is silently dropped (a dropped SYN shows as a timeout
// or as a connect that took a retransmit, ~1 s), and after the first answer
// following the add-back every probe is answered.
func testNoBlackholeOnAddBack(t *testing.T, b *fbed, f family) {
	svc := b.applyService(t, svcName("addback", f), v1.ServiceTypeClusterIP)
	target := b.podsOn("node2")[0]
	b.setSlices(t, svc.Name, nil, readyEPs(target))
	from := b.pods[0]
	r := req(echo.ProtoTCP, clusterIP(t, svc, f.v6), 80)
	waitForPods(t, b.exited, from.Netns, r, target)
	r.Timeout = 2 * f.rejectBound
	for cycle := range addBackCycles {
		p := startProber(from.Netns, r, 5*time.Millisecond, 30*time.Second)
		time.Sleep(100 * time.Millisecond)
		b.setSlices(t, svc.Name, nil, nil)
		removed := waitProbe(p, func(res echo.Result) bool { return res.Kind == echo.KindRefused }, 10*time.Second)
		b.setSlices(t, svc.Name, nil, readyEPs(target))
		back := waitProbe(p, echo.Result.OK, 10*time.Second)
		time.Sleep(300 * time.Millisecond)
		rs := p.Stop()
		t.Logf("cycle %d: %d probes; rejected from %s, answered again at %s", cycle, len(rs), fmtTime(removed), fmtTime(back))
		if removed.IsZero() || back.IsZero() {
			t.Fatalf("cycle %d: never saw the reject (%v) or the answer after add-back (%v):%s", cycle, removed, back, describeProbes(rs, 20))
		}
		if !checkAddBackProbes(t, cycle, rs, back, f, b.mode == "userspace") {
			dumpAddBackState(t, b, r)
		}
	}
}

// dumpAddBackState logs what a late failure needs to be explained: the
// rules of both nodes (static since the add-back: kproxy syncs at most once
// per second) and node1's conntrack entries for the ClusterIP (a refused
// SYN that matched an existing entry would show here).
func dumpAddBackState(t *testing.T, b *fbed, r echo.Request) {
	t.Helper()
	b.dumpRules(t)
	out, err := b.node(0).Run(context.Background(), "conntrack", "-L", "-d", r.Dst.Addr().String())
	t.Logf("---- conntrack on node1 for %s (err=%v) ----\n%s", r.Dst.Addr(), err, out)
}

// checkAddBackProbes fails t for probes that were dropped, or that failed
// after the Service answered again at back; it reports whether all were fine.
// With resetOK (userspace mode), a probe reset fast before the add-back is
// not a drop: the handshake completed in the accept queue of the listener
// that the removal closed, and the kernel resets what that queue held.
func checkAddBackProbes(t *testing.T, cycle int, rs []probeResult, back time.Time, f family, resetOK bool) bool {
	t.Helper()
	var bad []probeResult
	for _, pr := range rs {
		// A probe sent before the add-back may be slow: an ICMPv6 reject
		// (IPVS mode answers a Service without endpoints with one) only
		// takes effect at the first SYN retransmit, which the add-back
		// may answer. One sent after it may not.
		sent := pr.at.Add(-pr.res.Elapsed)
		slow := pr.res.OK() && pr.res.Elapsed > 500*time.Millisecond && !sent.Before(back.Add(-100*time.Millisecond))
		fastReset := resetOK && pr.res.Kind == echo.KindReset && pr.res.Elapsed < f.rejectBound
		dropped := !pr.res.OK() && pr.res.Kind != echo.KindRefused && !fastReset
		late := !pr.res.OK() && pr.at.After(back)
		if slow || dropped || late {
			bad = append(bad, pr)
		}
	}
	if len(bad) > 0 {
		t.Errorf("cycle %d: %d of %d probes dropped, slow (a lost SYN) or failing after the add-back answered:%s",
			cycle, len(bad), len(rs), describeProbes(bad, 10))
	}
	return len(bad) == 0
}

// waitProbe polls p's results until one (newer than the call) satisfies ok,
// and returns its time; zero after bound.
func waitProbe(p *prober, ok func(echo.Result) bool, bound time.Duration) time.Time {
	start := time.Now()
	for time.Since(start) < bound {
		p.mu.Lock()
		for _, r := range p.results {
			if r.at.After(start) && ok(r.res) {
				p.mu.Unlock()
				return r.at
			}
		}
		p.mu.Unlock()
		time.Sleep(10 * time.Millisecond)
	}
	return time.Time{}
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return t.Format("15:04:05.000")
}

// testRestartUnderTraffic: restarting node1's kproxy (SIGTERM, then
// SIGKILL) while a pod on node1 probes a ClusterIP every 10 ms loses no
// connection: the rules stay in place and the new process takes them over.
func testRestartUnderTraffic(t *testing.T, b *fbed, f family) {
	svc := b.applyService(t, svcName("restartprobe", f), v1.ServiceTypeClusterIP)
	b.setSlices(t, svc.Name, nil, readyEPs(b.pods...))
	from := b.pods[0]
	r := req(echo.ProtoTCP, clusterIP(t, svc, f.v6), 80)
	waitForPods(t, b.exited, from.Netns, r, b.pods...)
	r.Timeout = dropTimeout(f)
	kp := b.kproxys[b.node(0).Spec.Name]
	p := startProber(from.Netns, r, 10*time.Millisecond, 2*time.Minute)
	steps := []struct {
		name string
		stop func() error
	}{{"SIGTERM", kp.Stop}, {"SIGKILL", kp.Kill}}
	for _, s := range steps {
		if err := s.stop(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond) // traffic with no kproxy at all
		if err := kp.Restart(); err != nil {
			t.Fatal(err)
		}
		b.waitHealthy(t)
		time.Sleep(time.Second) // the first syncs of the new process
		t.Logf("%s restart done", s.name)
	}
	rs := p.Stop()
	if bad := failuresOf(rs); len(bad) > 0 {
		t.Errorf("%d of %d probes failed across the restarts:%s", len(bad), len(rs), describeProbes(bad, 10))
	} else {
		t.Logf("%d probes, none failed", len(rs))
	}
}

// testFlushRepair (kproxy-only): deleting kproxy's nftables table,
// flushing iptables' nat (and filter) table, or deleting kube-ipvs0 (IPVS
// mode) or kproxy0 (userspace mode), is repaired within 5 s (15 s in
// IPVS mode; see waitRepaired).
func testFlushRepair(t *testing.T, b *fbed, f family) {
	kproxyOnly(t, "upstream does not repair nftables state, and its iptables canary only notices deleted chains (mangle, polled every syncPeriod), not a flush")
	svc := b.applyService(t, svcName("flush", f), v1.ServiceTypeClusterIP)
	b.setSlices(t, svc.Name, nil, readyEPs(b.pods...))
	from, node := b.pods[0], b.node(0)
	r := req(echo.ProtoTCP, clusterIP(t, svc, f.v6), 80)
	waitForPods(t, b.exited, from.Netns, r, b.pods...)
	r.Timeout = 300 * time.Millisecond
	b.breakRules(t, node, f, "nat")
	b.waitRepaired(t, from.Netns, r, echo.Result.OK, "answered")
	waitForPods(t, b.exited, from.Netns, r, b.pods...)
	if b.mode != "iptables" {
		return
	}
	empty := b.applyService(t, svcName("flushempty", f), v1.ServiceTypeClusterIP)
	b.setSlices(t, empty.Name, nil, nil)
	re := req(echo.ProtoTCP, clusterIP(t, empty, f.v6), 80)
	b.expectRefused(t, from.Netns, re, f)
	re.Timeout = 2 * f.rejectBound
	b.breakRules(t, node, f, "filter")
	b.waitRepaired(t, from.Netns, re, func(res echo.Result) bool { return res.Kind == echo.KindRefused }, "rejected")
}

// breakRules deletes kproxy's nftables table (named kube-proxy) of the
// family, or flushes the given iptables table, in node.
func (b *fbed) breakRules(t *testing.T, node *netbed.Node, f family, iptTable string) {
	t.Helper()
	argv := []string{"nft", "delete", "table", "ip", "kube-proxy"}
	if f.v6 {
		argv[3] = "ip6"
	}
	switch b.mode {
	case "iptables":
		argv = []string{iptablesTool(t, node, f), "-t", iptTable, "-F"}
	case "ipvs":
		// Every Service IP goes with the dummy interface.
		argv = []string{"ip", "link", "del", "kube-ipvs0"}
	case "userspace":
		// Every Service address goes with kproxy0; the sockets stay.
		argv = []string{"ip", "link", "del", "kproxy0"}
	}
	if out, err := node.Run(context.Background(), argv...); err != nil {
		t.Fatalf("%v: %v %s", argv, err, out)
	}
	t.Logf("ran %s in %s", strings.Join(argv, " "), node.Spec.Name)
}

// waitRepaired re-sends r every 100 ms until ok holds, failing t if that
// takes longer than the mode's repair bound: 5 s, 15 s in IPVS mode (run
// in a VM under TCG, where the full sync that repairs reads and rewrites
// IPVS, the ip sets and iptables, seconds of emulated work).
func (b *fbed) waitRepaired(t *testing.T, ns *netbed.Netns, r echo.Request, ok func(echo.Result) bool, what string) {
	t.Helper()
	bound := 5 * time.Second
	if b.mode == "ipvs" {
		bound = 15 * time.Second
	}
	start := time.Now()
	last := ns.Send(context.Background(), r)
	t.Logf("right after breaking the rules: %s", last)
	for !ok(last) {
		if time.Since(start) >= bound {
			checkAbort(t, b.exited)
			t.Fatalf("not %s again within %v of breaking the rules; last: %s", what, bound, last)
		}
		time.Sleep(100 * time.Millisecond)
		last = ns.Send(context.Background(), r)
	}
	t.Logf("%s again after %v", what, time.Since(start).Round(time.Millisecond))
}

// testCleanup: `kproxy --cleanup` in a node (kproxy stopped there) removes
// every nftables table and KUBE-* iptables chain of kproxy and kube-proxy,
// and the interfaces of the IPVS and userspace modes;
// kproxy then starts again on the cleaned node.
func testCleanup(t *testing.T, b *fbed) {
	node := b.node(1)
	kp := b.kproxys[node.Spec.Name]
	if err := kp.Stop(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	out, err := node.Run(ctx, kproxyBinary(t), "--cleanup", "--v", "2")
	t.Logf("--cleanup (err=%v):\n%s", err, tail(out, 20))
	if err != nil {
		t.Fatalf("--cleanup failed: %v", err)
	}
	tables, err := node.Run(ctx, "nft", "list", "tables")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(tables, "\n") {
		if strings.Contains(l, "kproxy") || strings.Contains(l, "kube-proxy") {
			t.Errorf("after --cleanup, nftables still has %q", l)
		}
	}
	for _, v6 := range []bool{false, true} {
		save, err := node.IptablesSave(ctx, v6)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range leftoverChains(save) {
			if isUpstream() && l == "mangle KUBE-PROXY-CANARY" {
				t.Logf("upstream leaves %s (ipv6=%v) after --cleanup", l, v6)
				continue
			}
			t.Errorf("after --cleanup, iptables (ipv6=%v) still has chain %s", v6, l)
		}
	}
	links, err := node.IP(ctx, "-o", "link", "show")
	if err != nil {
		t.Fatal(err)
	}
	for _, dev := range []string{"kproxy0", "kube-ipvs0"} {
		if strings.Contains(links, ": "+dev+":") {
			t.Errorf("after --cleanup the node still has %s:\n%s", dev, links)
		}
	}
	if err := kp.Restart(); err != nil {
		t.Fatal(err)
	}
	b.waitHealthy(t)
}

// leftoverChains lists the KUBE-* chains of an iptables-save output as
// "table chain".
func leftoverChains(save string) []string {
	var out []string
	table := ""
	for _, l := range strings.Split(save, "\n") {
		switch {
		case strings.HasPrefix(l, "*"):
			table = l[1:]
		case strings.HasPrefix(l, ":KUBE-"):
			out = append(out, table+" "+strings.Fields(l[1:])[0])
		}
	}
	return out
}
