package iptables

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/model"
)

// requireRoot skips without root, except in CI where it fails.
func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("privileged test needs root (CI=true: not skipping)")
	}
	t.Skip("skipping privileged test: needs root to create network namespaces")
}

// netLab is a node namespace with a pod namespace behind a veth (pod CIDR
// 198.18.64.0/24) and a client namespace (198.18.200.0/24). Addresses are in
// 198.18.0.0/15 only, and there are no default routes.
type netLab struct {
	t                 testing.TB
	node, pod, client string
}

func sh(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// sweepDeadLabs deletes namespaces of earlier labs whose test process is
// gone (killed by a timeout before its cleanups ran): names are
// kpipt-<pid>-..., and only those of a dead pid are touched.
func sweepDeadLabs(t testing.TB) {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(line, " ")
		parts := strings.Split(name, "-")
		if len(parts) < 3 || parts[0] != "kpipt" {
			continue
		}
		pid, err := strconv.Atoi(parts[1])
		if err != nil || pid == os.Getpid() {
			continue
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			continue
		}
		t.Logf("removing namespace %s left by dead test process %d", name, pid)
		_ = exec.Command("ip", "netns", "del", name).Run()
	}
}

func newNetLab(t testing.TB) *netLab {
	requireRoot(t)
	sweepDeadLabs(t)
	id := fmt.Sprintf("kpipt-%d-%d", os.Getpid(), time.Now().UnixNano()%100000)
	l := &netLab{t: t, node: id + "-node", pod: id + "-pod", client: id + "-cli"}
	for _, ns := range []string{l.node, l.pod, l.client} {
		sh(t, "ip", "netns", "add", ns)
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
		sh(t, "ip", "-n", ns, "link", "set", "lo", "up")
	}
	veth := func(a, aIf, aIP, b, bIf, bIP string) {
		sh(t, "ip", "-n", a, "link", "add", aIf, "type", "veth", "peer", "name", bIf, "netns", b)
		sh(t, "ip", "-n", a, "addr", "add", aIP, "dev", aIf)
		sh(t, "ip", "-n", b, "addr", "add", bIP, "dev", bIf)
		sh(t, "ip", "-n", a, "link", "set", aIf, "up")
		sh(t, "ip", "-n", b, "link", "set", bIf, "up")
	}
	veth(l.node, "vpod", "198.18.64.1/24", l.pod, "eth0", "198.18.64.10/24")
	veth(l.node, "vcli", "198.18.200.1/24", l.client, "eth0", "198.18.200.5/24")
	sh(t, "ip", "netns", "exec", l.node, "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv4.icmp_ratelimit=0")
	sh(t, "ip", "-n", l.pod, "route", "add", "198.18.200.0/24", "via", "198.18.64.1")
	sh(t, "ip", "-n", l.client, "route", "add", "198.19.0.0/16", "via", "198.18.200.1")
	// A real node routes Service IPs somewhere (its default route); give
	// the node one so that un-NATed packets reach the filter hooks.
	sh(t, "ip", "-n", l.node, "route", "add", "198.19.0.0/16", "dev", "vpod")
	return l
}

// in runs fn on a locked thread inside namespace ns: sockets made by fn
// live there.
func (l *netLab) in(ns string, fn func()) {
	l.t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		l.t.Fatal(err)
	}
	defer orig.Close()
	target, err := netns.GetFromName(ns)
	if err != nil {
		l.t.Fatal(err)
	}
	defer target.Close()
	if err := netns.Set(target); err != nil {
		l.t.Fatal(err)
	}
	defer func() {
		if err := netns.Set(orig); err != nil {
			panic(fmt.Sprintf("cannot return to the original network namespace: %v", err))
		}
	}()
	fn()
}

// serve answers every connection to addr in the pod namespace with reply.
func (l *netLab) serve(addr, reply string) {
	var ln net.Listener
	l.in(l.pod, func() {
		var err error
		if ln, err = net.Listen("tcp", addr); err != nil {
			l.t.Fatal(err)
		}
	})
	l.t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = io.WriteString(c, reply)
			c.Close()
		}
	}()
}

// get connects from the client namespace and reads the reply.
func (l *netLab) get(addr string, timeout time.Duration) (string, error) {
	var c net.Conn
	var err error
	l.in(l.client, func() { c, err = net.DialTimeout("tcp", addr, timeout) })
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	b, err := io.ReadAll(c)
	return string(b), err
}

func labConfig() dataplane.Config {
	cfg := testConfig()
	cfg.NodeIPs = nil
	return cfg
}

func TestPrivilegedClusterIPTraffic(t *testing.T) {
	for _, b := range []Backend{BackendNFT, BackendLegacy} {
		t.Run(string(b), func(t *testing.T) {
			l := newNetLab(t)
			ex := NetnsExec{Namespace: l.node}
			p, err := New(labConfig(), WithExec(ex), WithSysctl(ExecSysctl{Exec: ex}), WithBackend(b))
			if err != nil {
				t.Fatal(err)
			}
			l.serve("198.18.64.10:8080", "hello")
			snap := snapshot(
				svc("ns", "web", "198.19.0.10", 80, withEPs(ep("198.18.64.10", 8080, true))),
				svc("ns", "none", "198.19.0.11", 80),
			)
			ctx := context.Background()
			if err := p.Sync(ctx, snap, dataplane.SyncRequest{Full: true}); err != nil {
				t.Fatal(err)
			}
			if got, err := l.get("198.19.0.10:80", 2*time.Second); err != nil || got != "hello" {
				t.Fatalf("ClusterIP: got %q, %v; want hello", got, err)
			}
			start := time.Now()
			_, err = l.get("198.19.0.11:80", 2*time.Second)
			if !errors.Is(err, syscall.ECONNREFUSED) || time.Since(start) > time.Second {
				t.Fatalf("no-endpoints Service: got %v after %v, want a fast connection refused", err, time.Since(start))
			}
			if d, err := p.Drifted(ctx); d || err != nil {
				t.Fatalf("Drifted right after sync: %v %v", d, err)
			}
			// Endpoint comes to "none" (partial sync), then the table is flushed.
			snap2 := snapshot(
				svc("ns", "web", "198.19.0.10", 80, withEPs(ep("198.18.64.10", 8080, true))),
				svc("ns", "none", "198.19.0.11", 80, withEPs(ep("198.18.64.10", 8080, true))),
			)
			if err := p.Sync(ctx, snap2, changed("none")); err != nil {
				t.Fatal(err)
			}
			if got, err := l.get("198.19.0.11:80", 2*time.Second); err != nil || got != "hello" {
				t.Fatalf("after partial sync: got %q, %v", got, err)
			}
			if _, err := ex.Run(ctx, nil, b.cmd(model.IPv4, ""), "-t", "nat", "-F"); err != nil {
				t.Fatal(err)
			}
			if d, _ := p.Drifted(ctx); !d {
				t.Fatal("nat flush not detected")
			}
			if err := p.Sync(ctx, snap2, changed()); err != nil {
				t.Fatal(err)
			}
			if got, err := l.get("198.19.0.10:80", 2*time.Second); err != nil || got != "hello" {
				t.Fatalf("after repair: got %q, %v", got, err)
			}
			if err := p.Cleanup(ctx); err != nil {
				t.Fatal(err)
			}
			out, _ := ex.Run(ctx, nil, b.cmd(model.IPv4, "-save"))
			if s := strings.ReplaceAll(string(out), "KUBE-FIREWALL", ""); strings.Contains(s, "KUBE-") {
				t.Errorf("cleanup left rules:\n%s", out)
			}
		})
	}
}

// TestPrivilegedRenderLoads loads the feature ruleset (both families) into
// each real backend: every rule render emits must be valid.
func TestPrivilegedRenderLoads(t *testing.T) {
	for _, b := range []Backend{BackendNFT, BackendLegacy} {
		t.Run(string(b), func(t *testing.T) {
			l := newNetLab(t)
			ex := NetnsExec{Namespace: l.node}
			cfg := testConfig()
			cfg.Families = []model.Family{model.IPv4, model.IPv6}
			p, _ := New(cfg, WithExec(ex), WithSysctl(ExecSysctl{Exec: ex}), WithBackend(b))
			if err := p.Sync(context.Background(), featureSnapshot(), dataplane.SyncRequest{Full: true}); err != nil {
				t.Fatal(err)
			}
		})
	}
}
