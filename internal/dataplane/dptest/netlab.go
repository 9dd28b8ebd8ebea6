package dptest

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/kproxy/kproxy/internal/nfnl"
)

// RequireRoot skips a privileged test, with the reason printed, when it
// does not run as root; under CI=true it fails instead of skipping.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("privileged test needs root (CI=true: not skipping)")
	}
	t.Skip("skipping privileged test: needs root to create network namespaces")
}

// Run runs a command and fails the test, with its output, when it fails.
func Run(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// Output runs a command and returns its output; it fails the test, with
// the output, when the command fails.
func Output(t testing.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// Lab is a node namespace with a pod namespace behind a veth (pod CIDR
// 198.18.64.0/24, the pod is 198.18.64.10) and a client namespace behind
// another (198.18.200.0/24, the client is 198.18.200.5). The client routes
// 198.19.0.0/16 (Service addresses) through the node. Addresses are in
// 198.18.0.0/15 only, and there are no default routes.
type Lab struct {
	t                 testing.TB
	Node, Pod, Client string // namespace names
}

// NewLab builds a lab whose namespaces are named <prefix>-<pid>-<n>-node,
// -pod and -cli, and deletes them when the test ends. It first sweeps the
// namespaces of this prefix that dead test processes left behind. Without
// root it skips (or fails under CI=true, see RequireRoot).
func NewLab(t testing.TB, prefix string) *Lab {
	RequireRoot(t)
	SweepDeadLabs(t, prefix)
	id := fmt.Sprintf("%s-%d-%d", prefix, os.Getpid(), time.Now().UnixNano()%100000)
	l := &Lab{t: t, Node: id + "-node", Pod: id + "-pod", Client: id + "-cli"}
	for _, ns := range []string{l.Node, l.Pod, l.Client} {
		Run(t, "ip", "netns", "add", ns)
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
		Run(t, "ip", "-n", ns, "link", "set", "lo", "up")
	}
	// Netlink sockets kept for reuse hold their namespace alive: close
	// them before the namespaces go (cleanups run last-in first-out).
	t.Cleanup(nfnl.CloseIdle)
	veth := func(a, aIf, aIP, b, bIf, bIP string) {
		Run(t, "ip", "-n", a, "link", "add", aIf, "type", "veth", "peer", "name", bIf, "netns", b)
		Run(t, "ip", "-n", a, "addr", "add", aIP, "dev", aIf)
		Run(t, "ip", "-n", b, "addr", "add", bIP, "dev", bIf)
		Run(t, "ip", "-n", a, "link", "set", aIf, "up")
		Run(t, "ip", "-n", b, "link", "set", bIf, "up")
	}
	veth(l.Node, "vpod", "198.18.64.1/24", l.Pod, "eth0", "198.18.64.10/24")
	veth(l.Node, "vcli", "198.18.200.1/24", l.Client, "eth0", "198.18.200.5/24")
	Run(t, "ip", "netns", "exec", l.Node, "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv4.icmp_ratelimit=0")
	Run(t, "ip", "-n", l.Pod, "route", "add", "198.18.200.0/24", "via", "198.18.64.1")
	Run(t, "ip", "-n", l.Client, "route", "add", "198.19.0.0/16", "via", "198.18.200.1")
	// A real node routes Service IPs somewhere (its default route); give
	// the node one so that packets no rule redirects reach the filter
	// hooks of the forward path.
	Run(t, "ip", "-n", l.Node, "route", "add", "198.19.0.0/16", "dev", "vpod")
	return l
}

// AddClientAddr gives the client namespace another address of
// 198.18.200.0/24, which the node reaches through the same link.
func (l *Lab) AddClientAddr(a netip.Addr) {
	Run(l.t, "ip", "-n", l.Client, "addr", "add", a.String()+"/24", "dev", "eth0")
}

// SweepDeadLabs deletes the namespaces of earlier labs whose test process
// is gone (killed by a timeout before its cleanups ran): only names
// <prefix>-<pid>-... whose pid no longer exists are touched.
func SweepDeadLabs(t testing.TB, prefix string) {
	t.Helper()
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(line, " ")
		parts := strings.Split(name, "-")
		if len(parts) < 3 || parts[0] != prefix {
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

// In runs fn on a locked thread inside namespace ns: sockets and child
// processes fn makes live there.
func (l *Lab) In(ns string, fn func()) {
	l.t.Helper()
	InNamespace(l.t, ns, fn)
}

// InNamespace runs fn on a locked thread inside the named network
// namespace ns (of any lab, also one another process built) and returns
// the thread to the original namespace.
func InNamespace(t testing.TB, ns string, fn func()) {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	orig, err := netns.Get()
	must(err)
	defer orig.Close()
	target, err := netns.GetFromName(ns)
	must(err)
	defer target.Close()
	must(netns.Set(target))
	defer func() {
		if err := netns.Set(orig); err != nil {
			panic(fmt.Sprintf("cannot return to the original network namespace: %v", err))
		}
	}()
	fn()
}

// Serve answers every TCP connection to addr in the pod namespace with
// reply, until the test ends.
func (l *Lab) Serve(addr, reply string) {
	var ln net.Listener
	l.In(l.Pod, func() {
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

// Get connects to addr from the client namespace and returns what the
// server says; timeout bounds the connect and, again, the read.
func (l *Lab) Get(addr string, timeout time.Duration) (string, error) {
	return l.GetFrom(netip.Addr{}, addr, timeout)
}

// GetFrom is Get from the client's address src (one AddClientAddr gave
// it); an invalid src lets the kernel choose.
func (l *Lab) GetFrom(src netip.Addr, addr string, timeout time.Duration) (string, error) {
	var c net.Conn
	var err error
	d := net.Dialer{Timeout: timeout}
	if src.IsValid() {
		d.LocalAddr = &net.TCPAddr{IP: src.AsSlice()}
	}
	l.In(l.Client, func() { c, err = d.Dial("tcp", addr) })
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	b, err := io.ReadAll(c)
	return string(b), err
}

// GetInTurn makes count connections to addr from the client and fails t
// unless every n consecutive ones reached n different servers (by their
// replies): round-robin's promise.
func (l *Lab) GetInTurn(addr string, n, count int) {
	l.t.Helper()
	var got []string
	for range count {
		r, err := l.Get(addr, 2*time.Second)
		if err != nil {
			l.t.Fatal(err)
		}
		got = append(got, r)
	}
	for i := 0; i+n <= len(got); i++ {
		seen := map[string]bool{}
		for _, r := range got[i : i+n] {
			seen[r] = true
		}
		if len(seen) != n {
			l.t.Fatalf("connections went to %v, want each of %d servers in turn", got, n)
		}
	}
}
