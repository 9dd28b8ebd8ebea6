//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/daemon"
	"github.com/kproxy/kproxy/test/testbed/netbed/echo"
)

// testVerify: kproxy explain --verify on node1 (every other explain in the
// suite verifies too, and must agree) reports, with exit status 3, an
// element or rule of a Service deleted by hand while kproxy is stopped
// (SIGSTOP, so it cannot repair it first), and a stale table of another
// proxy mode: iptables rules that DNAT the Service elsewhere while kproxy
// runs nftables mode, a kube-proxy nftables table while it runs iptables
// mode. In IPVS mode it says clearly that it does not verify IPVS.
func testVerify(t *testing.T, b *fbed, f family) {
	kproxyOnly(t, "explain --verify")
	svc := b.applyService(t, svcName("verify", f), v1.ServiceTypeClusterIP)
	on2 := b.podsOn("node2")
	b.setSlices(t, svc.Name, nil, readyEPs(on2...))
	vip := clusterIP(t, svc, f.v6)
	r := req(echo.ProtoTCP, vip, 80)
	waitForPods(t, b.exited, b.pods[0].Netns, r, on2...)
	node := b.node(0)
	from := podIP(b.pods[0], f)
	verify := func() (daemon.Report, int, string) {
		t.Helper()
		a, code, out := b.runExplain(t, node, from, r.Dst.String()+"/tcp", "--verify")
		if a.Verify == nil {
			return daemon.Report{}, code, out
		}
		return *a.Verify, code, out
	}
	if b.mode == "ipvs" {
		if _, code, out := verify(); code != 1 || !strings.Contains(out, "ipvs mode is not supported") {
			t.Errorf("explain --verify in IPVS mode: exit %d, output:\n%s", code, out)
		}
		return
	}
	if rep, code, out := verify(); code != 0 || !rep.Agree {
		t.Fatalf("intact rules: exit %d, report %+v\n%s", code, rep, out)
	}
	ipX, v4v6 := "ip", "iptables"
	if f.v6 {
		ipX, v4v6 = "ip6", "ip6tables"
	}
	sh := func(args ...string) {
		t.Helper()
		if _, err := node.Run(context.Background(), args...); err != nil {
			t.Fatal(err)
		}
	}

	// A hand edit while kproxy cannot repair it.
	pid := b.kproxys[node.Spec.Name].PID()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	resume := func() {
		if stopped {
			_ = syscall.Kill(pid, syscall.SIGCONT)
			stopped = false
		}
	}
	defer resume()
	var want string
	if b.mode == "nftables" {
		sh("nft", "delete", "element", ipX, "kube-proxy", "service-ips", fmt.Sprintf("{ %s . tcp . 80 }", vip))
		want = "the kernel lacks kproxy's element " + vip.String() + " . tcp . 80"
	} else {
		saved, err := node.Run(context.Background(), v4v6+"-save", "-t", "nat")
		if err != nil {
			t.Fatal(err)
		}
		rule := ""
		for _, line := range strings.Split(saved, "\n") {
			// The ClusterIP's rule, in its dispatch bucket of KUBE-SERVICES.
			if strings.HasPrefix(line, "-A KUBE-SVC-IP-") && strings.Contains(line, " "+vip.String()+"/") && strings.Contains(line, " -p tcp ") && strings.Contains(line, "-j KUBE-SVC-") {
				rule = line
			}
		}
		if rule == "" {
			t.Fatalf("no dispatch rule for %s:\n%s", vip, saved)
		}
		sh("sh", "-c", v4v6+" -t nat -D "+strings.TrimPrefix(rule, "-A "))
		want = "nat/" + strings.Fields(rule)[1] + ": the kernel has"
	}
	rep, code, out := verify()
	resume()
	if code != 3 || rep.Agree || strings.Contains(rep.Kernel, "DNAT") || !hasNote(rep.Notes, want) {
		t.Errorf("after a hand edit: exit %d, report %+v, want a note %q\n%s", code, rep, want, out)
	}
	if b.mode == "nftables" {
		// The ruleset monitor sees the edit once kproxy runs again, and
		// the repair brings the Service back. (iptables mode repairs
		// such an edit at its next full sync, as upstream does.)
		waitForPods(t, b.exited, b.pods[0].Netns, r, on2...)
	}

	// A stale table of another proxy mode.
	stale := podIP(b.pods[0], f).String() // an endpoint the stale rules still send to
	if b.mode == "nftables" {
		dst := stale + ":8080"
		if f.v6 {
			dst = "[" + stale + "]:8080"
		}
		sh(v4v6+"-nft", "-t", "nat", "-N", "KUBE-SERVICES")
		defer func() {
			_, _ = node.Run(context.Background(), v4v6+"-nft", "-t", "nat", "-D", "PREROUTING", "-j", "KUBE-SERVICES")
			_, _ = node.Run(context.Background(), v4v6+"-nft", "-t", "nat", "-F", "KUBE-SERVICES")
			_, _ = node.Run(context.Background(), v4v6+"-nft", "-t", "nat", "-X", "KUBE-SERVICES")
		}()
		sh(v4v6+"-nft", "-t", "nat", "-A", "KUBE-SERVICES", "-d", vip.String(), "-p", "tcp", "--dport", "80", "-j", "DNAT", "--to-destination", dst)
		sh(v4v6+"-nft", "-t", "nat", "-A", "PREROUTING", "-j", "KUBE-SERVICES")
		want = "they DNAT this packet to " + dst
	} else {
		sh("nft", "add", "table", ipX, "kube-proxy")
		defer func() { _, _ = node.Run(context.Background(), "nft", "delete", "table", ipX, "kube-proxy") }()
		sh("nft", "add", "chain", ipX, "kube-proxy", "nat-prerouting", "{ type nat hook prerouting priority dstnat ; }")
		want = "stale nftables table " + ipX + " kube-proxy of another proxy"
	}
	rep, code, out = verify()
	if code != 3 || rep.Agree || !hasNote(rep.Notes, want) {
		t.Errorf("with another proxy's table: exit %d, report %+v, want a note %q\n%s", code, rep, want, out)
	}
}

func hasNote(notes []string, s string) bool {
	for _, n := range notes {
		if strings.Contains(n, s) {
			return true
		}
	}
	return false
}
