//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	libipvs "github.com/moby/ipvs"
	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/test/testbed/controlplane"
	"github.com/kproxy/kproxy/test/testbed/netbed"
	"github.com/kproxy/kproxy/test/testbed/netbed/echo"
)

// TestIPVSMode: what only IPVS mode does, with real traffic, on a kernel
// with IPVS (make e2e-ipvs runs it in the VM; make e2e skips it on this
// machine's kernel, which has none): the schedulers (default rr exact,
// sh stable per client, lc toward the idle endpoint, wrr by weight, the
// ipvs.kproxy.io/scheduler annotation, an unknown one reported),
// graceful termination of a real server with a live connection (weight
// 0, the connection served, the real server deleted once it closed), the
// repair of virtual servers deleted behind kproxy's back, and strictARP.
// kproxy runs on node1 with --ipvs-sync-period 2s, so drained real servers
// are looked at, and the kernel re-read, every 2 s.
func TestIPVSMode(t *testing.T) {
	kproxyOnly(t, "kproxy's IPVS mode")
	if _, err := os.Stat("/proc/net/ip_vs"); err != nil {
		t.Fatalf("this kernel has no IPVS (/proc/net/ip_vs: %v): run it with make e2e-ipvs", err)
	}
	b := newMigBed(t, "e2e-ipvs-mode")
	b.start(proxySpec{bin: kproxyBinary(t), mode: "ipvs", extra: []string{"--ipvs-sync-period", "2s", "--ipvs-strict-arp"}})
	b.waitServing(b.pods...)
	t.Run("Schedulers", func(t *testing.T) { testIPVSSchedulers(t, b) })
	t.Run("GracefulTermination", func(t *testing.T) { testIPVSGracefulTermination(t, b) })
	t.Run("InitOnly", func(t *testing.T) { testIPVSInitOnly(t, b) })
	t.Run("RepairWithinSyncPeriod", func(t *testing.T) { testIPVSRepair(t, b) })
	t.Run("HealthCheckThroughHostFirewall", func(t *testing.T) { testIPVSHealthCheckFirewall(t, b) })
	t.Run("StrictARP", func(t *testing.T) {
		for sysctl, want := range map[string]string{"arp_ignore": "1", "arp_announce": "2"} {
			out, err := b.node.Run(context.Background(), "cat", "/proc/sys/net/ipv4/conf/all/"+sysctl)
			if err != nil || strings.TrimSpace(out) != want {
				t.Errorf("net.ipv4.conf.all.%s = %q (%v), want %s", sysctl, out, err, want)
			}
		}
	})
}

// testIPVSRepair: every sync in IPVS mode is whole, as upstream's, so
// virtual servers someone else deleted (`ipvsadm -C`) are back within a
// sync period (2 s here; 30 s by default), and the Service answers again.
func testIPVSRepair(t *testing.T, b *migBed) {
	svc := b.ipvsService(t, "repair", "", b.pods...)
	vip := clusterIP(t, svc, false)
	var deleted int
	err := b.node.Do(func() error {
		h, err := libipvs.New("")
		if err != nil {
			return err
		}
		defer h.Close()
		svcs, err := h.GetServices()
		if err != nil {
			return err
		}
		for _, s := range svcs {
			if err := h.DelService(s); err != nil {
				return err
			}
			deleted++
		}
		return nil
	})
	if err != nil || deleted == 0 {
		t.Fatalf("deleting node1's virtual servers: %d deleted, %v", deleted, err)
	}
	cleared := time.Now()
	if r := b.pods[0].Netns.Send(context.Background(), b.tcpTo(svc)); r.OK() {
		t.Logf("%s answered right after its virtual server went (%s): a sync came first", vip, r)
	}
	eventuallyWithin(t, 20*time.Second, b.exited, func() error {
		if r := b.pods[0].Netns.Send(context.Background(), b.tcpTo(svc)); !r.OK() {
			return fmt.Errorf("%s", r)
		}
		return nil
	}, "Service %s answers after its virtual server was deleted", vip)
	t.Logf("%d virtual servers deleted; %s answered again after %v", deleted, vip, time.Since(cleared).Round(time.Millisecond))
}

// testIPVSHealthCheckFirewall: on a node whose INPUT drops what it does not
// accept (a host firewall: loopback and established traffic in, policy
// DROP), a load balancer still reaches the health-check node port of an
// externalTrafficPolicy Local Service: kproxy's filter KUBE-NODE-PORT
// accepts it, as upstream's IPVS mode does.
func testIPVSHealthCheckFirewall(t *testing.T, b *migBed) {
	ctx := context.Background()
	svc := controlplane.NewService(b.api.ns, "hc-firewall", nil, controlplane.ServicePort("tcp", v1.ProtocolTCP, 80, echoPort))
	svc.Spec.Type = v1.ServiceTypeLoadBalancer
	svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	svc, err := b.api.cp.ApplyService(ctx, svc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.api.cp.DeleteService(context.Background(), b.api.ns, "hc-firewall") })
	local := b.pods[:2] // node1's
	b.api.setEndpoints("hc-firewall", local)
	url := "http://" + netip.AddrPortFrom(b.node.Spec.IP4, uint16(svc.Spec.HealthCheckNodePort)).String() + "/"
	get := func() error {
		code, body, err := b.bed.Client().HTTPGet(ctx, url)
		if err != nil {
			return err
		}
		if want := fmt.Sprintf(`"localEndpoints": %d`, len(local)); code != 200 || !strings.Contains(body, want) {
			return fmt.Errorf("%d %s, want 200 with %s", code, body, want)
		}
		return nil
	}
	eventually(t, b.exited, get, "health-check node port %s", url)

	iptables := func(args ...string) error {
		if out, err := b.node.Run(context.Background(), append([]string{"iptables", "-w"}, args...)...); err != nil {
			return fmt.Errorf("iptables %v: %v %s", args, err, out)
		}
		return nil
	}
	// Each step and its undo; an undo is registered once its step is in
	// place (cleanups run last first: the policy goes back first).
	for _, step := range [][2][]string{
		{{"-I", "INPUT", "-i", "lo", "-j", "ACCEPT"}, {"-D", "INPUT", "-i", "lo", "-j", "ACCEPT"}},
		{{"-A", "INPUT", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"},
			{"-D", "INPUT", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"}},
		{{"-P", "INPUT", "DROP"}, {"-P", "INPUT", "ACCEPT"}},
	} {
		if err := iptables(step[0]...); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := iptables(step[1]...); err != nil {
				t.Error(err)
			}
		})
	}
	if err := get(); err != nil {
		rules, _ := b.node.IptablesSave(ctx, false)
		t.Fatalf("health-check node port %s behind the node's firewall: %v\n%s", url, err, rules)
	}
}

// testIPVSInitOnly: kproxy --init-only in ipvs mode, run in a namespace of
// its own (the last pod's, where no proxy runs), sets IPVS mode's sysctls
// there, as upstream's proxier does before its init-only return, so that
// a proxy container without write access to /proc/sys finds them.
func testIPVSInitOnly(t *testing.T, b *migBed) {
	ns := b.pods[len(b.pods)-1].Netns
	read := func(name string) string {
		out, err := ns.Run(context.Background(), "cat", "/proc/sys/net/ipv4/"+name)
		if err != nil {
			t.Fatalf("reading %s: %v", name, err)
		}
		return strings.TrimSpace(out)
	}
	sysctls := []string{"vs/expire_nodest_conn", "vs/expire_quiescent_template", "vs/conntrack", "ip_forward"}
	for _, s := range sysctls {
		t.Logf("before: net.ipv4.%s = %s", strings.ReplaceAll(s, "/", "."), read(s))
	}
	out, err := ns.Run(context.Background(), kproxyBinary(t), "--init-only", "--proxy-mode", "ipvs",
		"--hostname-override", "init-only", "--conntrack-max-per-core", "0")
	if err != nil {
		t.Fatalf("kproxy --init-only --proxy-mode ipvs: %v\n%s", err, out)
	}
	for _, s := range sysctls {
		if got := read(s); got != "1" {
			t.Errorf("after --init-only: net.ipv4.%s = %s, want 1", strings.ReplaceAll(s, "/", "."), got)
		}
	}
}

// ipvsService creates a Service whose endpoints are pods, with the IPVS
// scheduler annotation when sched is set, and waits until its ClusterIP
// answers (from node1's first pod; kproxy runs on node1 only).
func (b *migBed) ipvsService(t *testing.T, name, sched string, pods ...*netbed.Pod) *v1.Service {
	t.Helper()
	var ann map[string]string
	if sched != "" {
		ann = map[string]string{"ipvs.kproxy.io/scheduler": sched}
	}
	svc := b.api.createAnnotatedService(name, v1.ServiceTypeClusterIP, ann)
	b.api.setEndpoints(name, pods)
	eventually(t, b.exited, func() error {
		if r := b.pods[0].Netns.Send(context.Background(), b.tcpTo(svc)); !r.OK() {
			return fmt.Errorf("%s", r)
		}
		return nil
	}, "Service %s answers", name)
	return svc
}

func (b *migBed) tcpTo(svc *v1.Service) echo.Request {
	return echo.Request{Proto: echo.ProtoTCP, Dst: netip.AddrPortFrom(clusterIP(b.t, svc, false), 80), Timeout: 2 * time.Second}
}

func testIPVSSchedulers(t *testing.T, b *migBed) {
	// rr (the default): 8 new connections over 4 endpoints, 2 each.
	rr := b.ipvsService(t, "sched-rr", "", b.pods...)
	if got := burst(b.pods[0].Netns, b.tcpTo(rr), 8); len(got.failures) > 0 || len(got.byPod) != 4 || !allEqual(got.byPod, 2) {
		t.Errorf("rr: 8 connections over 4 endpoints: %s, want 2 each", got)
	}
	// sh: one client, always the same endpoint.
	sh := b.ipvsService(t, "sched-sh", "sh", b.pods...)
	if got := burst(b.pods[0].Netns, b.tcpTo(sh), 12); len(got.failures) > 0 || len(got.byPod) != 1 {
		t.Errorf("sh: 12 connections from one client: %s, want one endpoint", got)
	}
	// lc: with a connection held open on one endpoint, new ones go to
	// the other. Clients are node1's pods (kproxy runs on node1 only),
	// endpoints node2's.
	two := b.pods[2:4]
	lc := b.ipvsService(t, "sched-lc", "lc", two...)
	held, err := echo.DialKeepAlive(b.pods[0].Netns.Do, b.tcpTo(lc).Dst, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	first := held.Exchange()
	if !first.OK() {
		t.Fatalf("held connection: %s", first)
	}
	got := burst(b.pods[1].Netns, b.tcpTo(lc), 4)
	if len(got.failures) > 0 || len(got.byPod) != 1 || got.byPod[first.Reply.Pod] != 0 {
		t.Errorf("lc with a connection held on %s: %s, want every new one elsewhere", first.Reply.Pod, got)
	}
	// An unknown scheduler is reported and the default used.
	bad := b.ipvsService(t, "sched-bad", "bogus", b.pods...)
	if got := burst(b.pods[0].Netns, b.tcpTo(bad), 8); len(got.failures) > 0 || !allEqual(got.byPod, 2) {
		t.Errorf("unknown scheduler: %s, want the default (rr)", got)
	}
	eventually(t, b.exited, func() error {
		if log := b.proc.Log(); !strings.Contains(log, "unknown IPVS scheduler") || !strings.Contains(log, "bogus") {
			return fmt.Errorf("no log line about the unknown scheduler")
		}
		return nil
	}, "the unknown scheduler reported")
	testIPVSMissingScheduler(t, b)
}

// testIPVSMissingScheduler: a Service whose scheduler annotation names one
// this kernel lacks (the kernel refuses its virtual server) fails alone,
// as upstream's per-Service errors do: kproxy logs it at every sync and
// keeps syncing (no failed sync, /healthz stays 200 past twice the sync
// period), and a Service made after it answers.
func testIPVSMissingScheduler(t *testing.T, b *migBed) {
	missing := missingIPVSScheduler(t)
	failedBefore := strings.Count(b.proc.Log(), "Sync failed")
	svc := b.api.createAnnotatedService("sched-missing", v1.ServiceTypeClusterIP, map[string]string{"ipvs.kproxy.io/scheduler": missing})
	b.api.setEndpoints(svc.Name, b.pods)
	eventually(t, b.exited, func() error {
		for _, l := range strings.Split(b.proc.Log(), "\n") {
			if strings.Contains(l, "IPVS state failed") && strings.Contains(l, svc.Name) {
				t.Logf("kproxy: %s", l)
				return nil
			}
		}
		return fmt.Errorf("no log line about %s's virtual server", svc.Name)
	}, "the refused virtual server reported")
	after := b.ipvsService(t, "sched-after", "", b.pods...)
	time.Sleep(3 * 2 * time.Second) // three of kproxy's 2 s sync periods
	url := "http://" + netip.AddrPortFrom(b.node.Spec.IP4, 10256).String() + "/healthz"
	if code, body, err := b.node.HTTPGet(context.Background(), url); err != nil || code != 200 {
		t.Errorf("/healthz with a Service the kernel refuses: %d %s (%v), want 200", code, body, err)
	}
	if n := strings.Count(b.proc.Log(), "Sync failed") - failedBefore; n > 0 {
		t.Errorf("%d syncs failed over a Service the kernel refuses", n)
	}
	if r := b.pods[0].Netns.Send(context.Background(), b.tcpTo(after)); !r.OK() {
		t.Errorf("%s, made after the refused one: %s", after.Name, r)
	}
	if err := b.api.cp.DeleteService(context.Background(), b.api.ns, svc.Name); err != nil {
		t.Fatal(err)
	}
}

// missingIPVSScheduler names an IPVS scheduler of the model's list that this
// kernel has neither loaded nor as a module (twos on the VM's 6.1 kernel:
// it came in 6.2); the test needs one.
func missingIPVSScheduler(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		t.Fatal(err)
	}
	rel := strings.TrimSpace(string(b))
	for _, s := range []string{"twos", "ovf", "fo", "mh"} {
		mods, _ := filepath.Glob(filepath.Join("/lib/modules", rel, "kernel/net/netfilter/ipvs", "ip_vs_"+s+".ko*"))
		if _, err := os.Stat("/sys/module/ip_vs_" + s); err != nil && len(mods) == 0 {
			return s
		}
	}
	t.Fatalf("kernel %s has every IPVS scheduler this step could ask for", rel)
	return ""
}

func allEqual(m map[string]int, n int) bool {
	for _, v := range m {
		if v != n {
			return false
		}
	}
	return len(m) > 0
}

// testIPVSGracefulTermination: an endpoint removed while a connection to
// it is open keeps serving that connection at weight 0, and the Service's
// wrr scheduler sends new connections by weight: exactly half to each of
// the two endpoints at weight 1, none to the draining one. Once the client
// resets the connection (IPVS then forgets it within its 10 s CLOSE
// timeout) the real server is deleted.
func testIPVSGracefulTermination(t *testing.T, b *migBed) {
	stays, gone := b.pods[1:3], b.pods[3]
	svc := b.ipvsService(t, "drain", "wrr", stays...)
	b.api.setEndpoints(svc.Name, append(slices.Clone(stays), gone))
	var ka *echo.KeepAlive
	eventually(t, b.exited, func() error {
		c, err := echo.DialKeepAlive(b.pods[0].Netns.Do, b.tcpTo(svc).Dst, 2*time.Second)
		if err != nil {
			return err
		}
		if r := c.Exchange(); !r.OK() || r.Reply.Pod != gone.PodName {
			c.Reset()
			return fmt.Errorf("connection answered by %s, not %s", r, gone.PodName)
		}
		ka = c
		return nil
	}, "a connection to %s", gone.PodName)
	defer ka.Close()
	b.api.setEndpoints(svc.Name, stays)
	// No new connection until the real server is at weight 0: one that
	// reached it and closed normally would keep it in the kernel for
	// IPVS's TIME_WAIT (2 min).
	realServer := netip.AddrPortFrom(podIP(gone, families[0]), echoPort)
	eventually(t, b.exited, func() error {
		if w, ok := b.ipvsWeight(t, b.tcpTo(svc).Dst.Addr(), realServer); !ok || w != 0 {
			return fmt.Errorf("removed endpoint with a live connection: real server present %v, weight %d; want weight 0", ok, w)
		}
		return nil
	}, "the removed endpoint at weight 0")
	if got := burst(b.pods[0].Netns, b.tcpTo(svc), 8); len(got.failures) > 0 || len(got.byPod) != 2 || !allEqual(got.byPod, 4) {
		t.Errorf("wrr with weights 1, 1, 0 (draining): 8 connections: %s, want 4 on each of %s and %s",
			got, stays[0].PodName, stays[1].PodName)
	}
	for i := 0; i < 10; i++ {
		if r := ka.Exchange(); !r.OK() || r.Reply.Pod != gone.PodName {
			t.Fatalf("exchange %d on the draining connection: %s", i, r)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := ka.Reset(); err != nil {
		t.Fatal(err)
	}
	eventually(t, b.exited, func() error {
		if w, ok := b.ipvsWeight(t, b.tcpTo(svc).Dst.Addr(), realServer); ok {
			conns, _ := b.node.Run(context.Background(), "grep", "-c", fmt.Sprintf("%X", podIP(gone, families[0]).AsSlice()), "/proc/net/ip_vs_conn")
			return fmt.Errorf("real server %s still there (weight %d, %s IPVS connections)", realServer, w, strings.TrimSpace(conns))
		}
		return nil
	}, "the drained real server deleted")
}

// ipvsWeight reads node1's /proc/net/ip_vs: the weight of real server a in
// the TCP virtual server vip:80, and whether it is there.
func (b *migBed) ipvsWeight(t *testing.T, vip netip.Addr, a netip.AddrPort) (int, bool) {
	t.Helper()
	out, err := b.node.Run(context.Background(), "cat", "/proc/net/ip_vs")
	if err != nil {
		t.Fatal(err)
	}
	in := false
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) >= 2 && (f[0] == "TCP" || f[0] == "UDP" || f[0] == "SCTP") {
			ap, ok := parseProcIPVS(f[1])
			in = ok && f[0] == "TCP" && ap == netip.AddrPortFrom(vip, 80)
			continue
		}
		if len(f) >= 4 && f[0] == "->" && in {
			if ap, ok := parseProcIPVS(f[1]); ok && ap == a {
				var w int
				fmt.Sscan(f[3], &w)
				return w, true
			}
		}
	}
	return 0, false
}
