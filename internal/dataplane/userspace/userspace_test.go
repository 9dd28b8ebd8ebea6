package userspace

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/dataplane/dptest"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/sctp"
)

// fakeLinks records the device's addresses.
type fakeLinks struct {
	dev   bool
	addrs map[netip.Addr]bool
	local []netip.Addr // the other interfaces' addresses
}

func (f *fakeLinks) EnsureDevice() error {
	if !f.dev {
		f.dev, f.addrs = true, map[netip.Addr]bool{}
	}
	return nil
}

func (f *fakeLinks) DeviceAddrs() ([]netip.Addr, error) {
	if !f.dev {
		return nil, nil
	}
	var out []netip.Addr
	for a := range f.addrs {
		out = append(out, a)
	}
	return out, nil
}

func (f *fakeLinks) AddAddr(a netip.Addr) error { f.addrs[a] = true; return nil }
func (f *fakeLinks) DelAddr(a netip.Addr) error { delete(f.addrs, a); return nil }
func (f *fakeLinks) DeleteDevice() error        { f.dev, f.addrs = false, nil; return nil }
func (f *fakeLinks) MigrateRequests() error     { return nil }

func (f *fakeLinks) LocalAddrs() ([]netip.Addr, error) { return f.local, nil }

// server answers every connection with its name and a newline, then
// echoes lines until the client closes.
func server(t *testing.T, name string) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				fmt.Fprintln(c, name)
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return netip.MustParseAddrPort(ln.Addr().String())
}

// deadAddr is a loopback port nothing listens on.
func deadAddr(t *testing.T) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := netip.MustParseAddrPort(ln.Addr().String())
	ln.Close()
	return a
}

func eps(addrs ...netip.AddrPort) []*model.Endpoint {
	var out []*model.Endpoint
	for _, a := range addrs {
		out = append(out, dptest.EP(a.Addr().String(), a.Port(), true))
	}
	return out
}

// get connects from src (zero: any) and returns the first line.
func get(t *testing.T, src netip.Addr, to netip.AddrPort) string {
	t.Helper()
	d := net.Dialer{Timeout: 2 * time.Second}
	if src.IsValid() {
		d.LocalAddr = &net.TCPAddr{IP: src.AsSlice()}
	}
	c, err := d.Dial("tcp", to.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("reading from %s: %v", to, err)
	}
	return strings.TrimSpace(line)
}

func testProxier(t *testing.T) (*Proxier, *fakeLinks) {
	t.Helper()
	l := &fakeLinks{}
	p, _ := newProxier(dataplane.Config{Families: []model.Family{model.IPv4}}, l)
	t.Cleanup(func() { _ = p.Cleanup(context.Background()) })
	return p, l
}

func syncTo(t *testing.T, p *Proxier, svcs ...*model.ServicePort) {
	t.Helper()
	if err := p.Sync(context.Background(), dptest.Snapshot(svcs...), dataplane.SyncRequest{}); err != nil {
		t.Fatal(err)
	}
}

// vip is a loopback address standing in for a ClusterIP (every 127/8
// address is local, so no device is needed).
const vip = "127.0.0.10"

func TestRoundRobinAndDeadEndpoint(t *testing.T) {
	p, l := testProxier(t)
	a, b, c := server(t, "a"), server(t, "b"), server(t, "c")
	dead := deadAddr(t)
	svc := dptest.Svc("ns", "rr", vip, 18080, dptest.WithBalancing(model.BalanceRoundRobin), dptest.WithEPs(eps(a, dead, b, c)...))
	syncTo(t, p, svc)
	if !l.addrs[netip.MustParseAddr(vip)] {
		t.Fatalf("device addresses %v, want %s", l.addrs, vip)
	}
	to := netip.MustParseAddrPort(vip + ":18080")
	// The dead endpoint costs no failed connection: its turn goes to the
	// next, and it is skipped while it backs off.
	var got []string
	for range 9 {
		got = append(got, get(t, netip.Addr{}, to))
	}
	for i := 0; i+3 <= len(got); i++ {
		if got[i] == got[i+1] || got[i] == got[i+2] || got[i+1] == got[i+2] {
			t.Fatalf("connections went to %v, want a, b, c in turn", got)
		}
	}
	// The relays end (and count their bytes) as the servers close.
	var stats []Stat
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		stats = p.Stats()
		if slices.ContainsFunc(stats, func(s Stat) bool { return s.Endpoint == b && s.BytesOut == 6 }) {
			break
		}
	}
	for _, st := range stats {
		switch st.Endpoint {
		case dead:
			if st.ConnectErrors != 1 || st.Total != 0 {
				t.Errorf("dead endpoint: %d connect errors, %d relays; want 1 (then it backs off) and none", st.ConnectErrors, st.Total)
			}
		case b:
			if st.Total != 3 || st.Retries != 1 || st.BytesOut != 6 || st.Port != svc.ID {
				t.Errorf("endpoint b: %+v; want 3 relays, 1 after a retry, 6 bytes from it", st)
			}
		}
	}
}

func TestLeastConnections(t *testing.T) {
	p, _ := testProxier(t)
	a, b := server(t, "a"), server(t, "b")
	syncTo(t, p, dptest.Svc("ns", "lc", vip, 18081, dptest.WithBalancing(model.BalanceLeastConnections), dptest.WithEPs(eps(a, b)...)))
	to := netip.MustParseAddrPort(vip + ":18081")
	// Connections held open: each new one goes to the endpoint with fewer
	// open, so the second and the fourth go where the first and the third
	// did not.
	var got []string
	for range 4 {
		c, err := net.Dial("tcp", to.String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		line, _ := bufio.NewReader(c).ReadString('\n')
		got = append(got, strings.TrimSpace(line))
	}
	if got[0] == got[1] || got[2] == got[3] {
		t.Errorf("held connections went to %v, want each new one to the endpoint with fewer", got)
	}
}

func TestSourceHashAndAffinity(t *testing.T) {
	p, _ := testProxier(t)
	servers := map[netip.AddrPort]string{}
	var addrs []netip.AddrPort
	for _, n := range []string{"a", "b", "c"} {
		a := server(t, n)
		servers[a] = n
		addrs = append(addrs, a)
	}
	sh := dptest.Svc("ns", "sh", vip, 18082, dptest.WithBalancing(model.BalanceSourceHash), dptest.WithEPs(eps(addrs...)...))
	aff := dptest.Svc("ns", "aff", "127.0.0.11", 18083, dptest.WithAffinity(60), dptest.WithEPs(eps(addrs...)...))
	syncTo(t, p, sh, aff)
	seen := map[string]bool{}
	for i := range 12 {
		src := netip.AddrFrom4([4]byte{127, 0, 1, byte(1 + i)})
		want := servers[sh.SourceHashPick(sh.ClusterEndpoints, src).AddrPort()]
		for range 2 {
			if got := get(t, src, netip.MustParseAddrPort(vip+":18082")); got != want {
				t.Fatalf("source-hash: client %s reached %s, the model says %s", src, got, want)
			}
		}
		seen[want] = true
		// Affinity: every connection of a client to the same endpoint.
		to := netip.MustParseAddrPort("127.0.0.11:18083")
		one := get(t, src, to)
		for range 3 {
			if got := get(t, src, to); got != one {
				t.Fatalf("affinity: client %s reached %s after %s", src, got, one)
			}
		}
	}
	if len(seen) < 2 {
		t.Errorf("12 clients reached only %v", seen)
	}
}

// TestRemovedFrontendLetsRelaysFinish: a Service that goes stops taking
// connections (refused) while an open one keeps working.
func TestRemovedFrontendLetsRelaysFinish(t *testing.T) {
	p, l := testProxier(t)
	a := server(t, "a")
	syncTo(t, p, dptest.Svc("ns", "web", vip, 18084, dptest.WithEPs(eps(a)...)))
	to := netip.MustParseAddrPort(vip + ":18084")
	c, r := openRelay(t, to, "a")
	defer c.Close()
	syncTo(t, p)
	if len(l.addrs) != 0 {
		t.Errorf("device keeps %v after the Service went", l.addrs)
	}
	if _, err := net.DialTimeout("tcp", to.String(), time.Second); err == nil {
		t.Error("a new connection was accepted after the Service went")
	}
	stillRelays(t, c, r, "after the Service went")
}

// openRelay connects to `to` and reads the greeting of server want.
func openRelay(t *testing.T, to netip.AddrPort, want string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", to.String())
	if err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	if line, _ := r.ReadString('\n'); strings.TrimSpace(line) != want {
		c.Close()
		t.Fatalf("got %q, want %q", line, want)
	}
	return c, r
}

// stillRelays checks that the open relay c still echoes a line.
func stillRelays(t *testing.T, c net.Conn, r *bufio.Reader, when string) {
	t.Helper()
	fmt.Fprintln(c, "still there?")
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if line, err := r.ReadString('\n'); err != nil || strings.TrimSpace(line) != "still there?" {
		t.Fatalf("open relay %s: %q, %v", when, line, err)
	}
}

// TestDrain: as kproxy exits, its sockets close at once (another kproxy
// on the addresses takes new connections) while an open relay goes on;
// Drain returns when that relay ends, or when its context does.
func TestDrain(t *testing.T) {
	p, l := testProxier(t)
	a := server(t, "a")
	syncTo(t, p, dptest.Svc("ns", "web", vip, 18085, dptest.WithEPs(eps(a)...)))
	to := netip.MustParseAddrPort(vip + ":18085")
	c, r := openRelay(t, to, "a")
	drained := make(chan struct{})
	go func() {
		p.Drain(context.Background())
		close(drained)
	}()
	deadline := time.Now().Add(2 * time.Second)
	for {
		probe, err := net.DialTimeout("tcp", to.String(), time.Second)
		if err != nil {
			break
		}
		probe.Close()
		if time.Now().After(deadline) {
			t.Fatal("the socket still accepts while draining")
		}
		time.Sleep(10 * time.Millisecond)
	}
	stillRelays(t, c, r, "while draining")
	select {
	case <-drained:
		t.Fatal("Drain returned with a relay open")
	case <-time.After(100 * time.Millisecond):
	}
	c.Close()
	select {
	case <-drained:
	case <-time.After(2 * time.Second):
		t.Fatal("Drain did not return after the last relay ended")
	}
	if !l.addrs[netip.MustParseAddr(vip)] {
		t.Error("Drain took the Service address off the device; the next kproxy needs it")
	}
	// A relay that does not end is cut short by the context.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	syncTo(t, p, dptest.Svc("ns", "web", vip, 18085, dptest.WithEPs(eps(a)...)))
	held, _ := openRelay(t, to, "a")
	defer held.Close()
	start := time.Now()
	p.Drain(ctx)
	if d := time.Since(start); d > time.Second {
		t.Errorf("Drain waited %v past its context", d)
	}
}

// udpServer answers each datagram with its name.
func udpServer(t *testing.T, name string) netip.AddrPort {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			_, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			_, _ = c.WriteToUDPAddrPort([]byte(name), from)
		}
	}()
	return netip.MustParseAddrPort(c.LocalAddr().String())
}

// TestUDPSessions: each client socket is one session, answered from the
// Service address; round-robin moves from session to session; a Service
// without endpoints has no socket, so the kernel answers port unreachable.
func TestUDPSessions(t *testing.T) {
	p, _ := testProxier(t)
	a, b := udpServer(t, "a"), udpServer(t, "b")
	svc := dptest.Svc("ns", "dns", vip, 15353, dptest.WithProto(model.UDP), dptest.WithBalancing(model.BalanceRoundRobin), dptest.WithEPs(eps(a, b)...))
	syncTo(t, p, svc)
	to := netip.MustParseAddrPort(vip + ":15353")
	exchange := func(c *net.UDPConn) (string, error) {
		if _, err := c.Write([]byte("q")); err != nil {
			return "", err
		}
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		buf := make([]byte, 100)
		n, from, err := c.ReadFromUDPAddrPort(buf)
		if err == nil && from != to {
			t.Errorf("answer from %s, want the Service address %s", from, to)
		}
		return string(buf[:n]), err
	}
	var got []string
	for range 4 {
		c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(to))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		first, err := exchange(c)
		if err != nil {
			t.Fatal(err)
		}
		again, err := exchange(c)
		if err != nil || again != first {
			t.Fatalf("one session reached %s then %q (%v)", first, again, err)
		}
		got = append(got, first)
	}
	if got[0] == got[1] || got[1] == got[2] || got[2] == got[3] {
		t.Errorf("sessions went to %v, want a and b in turn", got)
	}
	// A session whose endpoint goes ends, as upstream deletes the conntrack
	// entries of a removed UDP endpoint: the same client socket reaches
	// the endpoint left.
	c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(to))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	first, err := exchange(c)
	if err != nil {
		t.Fatal(err)
	}
	stay := map[string]netip.AddrPort{"a": b, "b": a}[first] // the other one
	syncTo(t, p, dptest.Svc("ns", "dns", vip, 15353, dptest.WithProto(model.UDP), dptest.WithEPs(eps(stay)...)))
	if again, err := exchange(c); err != nil || again == first {
		t.Errorf("after %s left, the client's session answered %q (%v), want the other endpoint", first, again, err)
	}
	syncTo(t, p, dptest.Svc("ns", "dns", vip, 15353, dptest.WithProto(model.UDP)))
	c, err = net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(to))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := exchange(c); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("no endpoints: %v, want connection refused (port unreachable)", err)
	}
}

// refused says whether from src a TCP client to `to` gets no answer: the
// frontend resets clients it does not take right after the handshake.
func refused(src netip.Addr, to netip.AddrPort) bool {
	d := net.Dialer{Timeout: time.Second, LocalAddr: &net.TCPAddr{IP: src.AsSlice()}}
	c, err := d.Dial("tcp", to.String())
	if err != nil {
		return true
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	_, err = bufio.NewReader(c).ReadString('\n')
	return err != nil
}

// TestClientsNotTaken: load-balancer source ranges and a Local policy
// without a local endpoint keep clients out: TCP ones are reset after the
// handshake (a socket cannot drop a SYN without a filter), UDP datagrams
// are dropped.
func TestClientsNotTaken(t *testing.T) {
	p, _ := testProxier(t)
	remote := server(t, "remote")
	rep := dptest.EP(remote.Addr().String(), remote.Port(), false) // on "another node"
	lb := dptest.Svc("ns", "lb", vip, 18090, dptest.WithLB("127.0.0.12"), dptest.WithSourceRanges("127.0.1.0/24"), dptest.WithEPs(rep))
	local := dptest.Svc("ns", "etp", "127.0.0.13", 18091, dptest.WithLB("127.0.0.14"), dptest.WithETPLocal, dptest.WithEPs(rep))
	syncTo(t, p, lb, local)
	inRange, outside := netip.MustParseAddr("127.0.1.5"), netip.MustParseAddr("127.0.2.5")
	if got := get(t, inRange, netip.MustParseAddrPort("127.0.0.12:18090")); got != "remote" {
		t.Errorf("source range: client in range got %q", got)
	}
	if !refused(outside, netip.MustParseAddrPort("127.0.0.12:18090")) {
		t.Error("source range: a client outside was served")
	}
	if got := get(t, outside, netip.MustParseAddrPort(vip+":18090")); got != "remote" {
		t.Errorf("source ranges do not apply to the ClusterIP: got %q", got)
	}
	if !refused(inRange, netip.MustParseAddrPort("127.0.0.14:18091")) {
		t.Error("Local policy without a local endpoint: a client was served")
	}
	if got := get(t, inRange, netip.MustParseAddrPort("127.0.0.13:18091")); got != "remote" {
		t.Errorf("the ClusterIP of an external-Local Service uses every endpoint: got %q", got)
	}
	// The ranges go: everyone is let in.
	syncTo(t, p, dptest.Svc("ns", "lb", vip, 18090, dptest.WithLB("127.0.0.12"), dptest.WithEPs(rep)), local)
	if got := get(t, outside, netip.MustParseAddrPort("127.0.0.12:18090")); got != "remote" {
		t.Errorf("without source ranges: got %q", got)
	}
}

// TestNodePortAddresses: NodePorts listen on the node's addresses within
// nodePortAddresses, on all of them (but loopback) when it is empty.
func TestNodePortAddresses(t *testing.T) {
	local := addrs("127.0.0.1", "198.18.1.2", "198.18.2.1", "fd00::1", "fe80::1")
	svc := dptest.Svc("ns", "np", "198.18.200.1", 80, dptest.WithNodePort(30080), dptest.WithEPs(dptest.EP("198.18.64.2", 8080, false)))
	for _, tc := range []struct {
		cidrs []string
		want  []string
	}{
		{nil, []string{"198.18.1.2:30080", "198.18.2.1:30080"}},
		{[]string{"198.18.2.0/24"}, []string{"198.18.2.1:30080"}},
		{[]string{"198.18.1.2/32", "fd00::/8"}, []string{"198.18.1.2:30080"}},
	} {
		p, _ := newProxier(dataplane.Config{Families: []model.Family{model.IPv4}, NodePortAddresses: tc.cidrs}, &fakeLinks{})
		fronts, _ := p.desired(dptest.Snapshot(svc), local)
		var got []string
		for k := range fronts {
			if k.addr.Port() == 30080 {
				got = append(got, k.addr.String())
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, tc.want) {
			t.Errorf("nodePortAddresses %v: NodePort sockets on %v, want %v", tc.cidrs, got, tc.want)
		}
	}
}

// TestLocalPolicyShortCircuit: under externalTrafficPolicy Local, a
// client outside the node gets the local endpoints only (here none: it
// is dropped), while the node itself and, by detectLocalMode, its pods
// get every endpoint; the source ranges still hold for them.
func TestLocalPolicyShortCircuit(t *testing.T) {
	local := addrs("198.18.1.2")
	remote := dptest.EP("198.18.65.2", 8080, false)
	svc := dptest.Svc("ns", "etp", "198.18.200.1", 80, dptest.WithETPLocal, dptest.WithNodePort(30080),
		dptest.WithLB("198.18.100.1"), dptest.WithSourceRanges("198.18.0.0/17"), dptest.WithEPs(remote))
	p, _ := newProxier(dataplane.Config{Families: []model.Family{model.IPv4},
		LocalMode: dataplane.LocalClusterCIDR, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("198.18.64.0/18"), netip.MustParsePrefix("198.18.192.0/18")}}, &fakeLinks{})
	fronts, _ := p.desired(dptest.Snapshot(svc), local)
	const nodePort, lb = "198.18.1.2:30080", "198.18.100.1:80"
	for _, to := range []string{nodePort, lb} {
		spec, ok := fronts[frontKey{model.TCP, netip.MustParseAddrPort(to)}]
		if !ok {
			t.Fatalf("no socket on %s", to)
		}
		pl := newPool(spec, nil)
		for _, tc := range []struct {
			client string
			served bool
		}{
			{"198.18.7.7", false},      // outside the node: no local endpoint
			{"198.18.1.2", true},       // the node itself
			{"198.18.100.1", true},     // the node, from a Service address on Device
			{"198.18.66.9", true},      // a pod (the cluster CIDR)
			{"198.18.200.9", to != lb}, // a pod outside the source ranges: the LB IP keeps it out
			{"199.0.0.1", false},       // outside the source ranges and the node
		} {
			c := netip.MustParseAddr(tc.client)
			q := pl.forClient(c)
			served := q.admits(c) && len(q.pick(c, time.Now())) == 1
			if served != tc.served {
				t.Errorf("%s from %s: served %v, want %v", to, c, served, tc.served)
			}
		}
	}
}

func addrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

// TestSCTPWhereTheKernelHasIt: an SCTP port gets a socket when the kernel
// has SCTP (the VM's e2e run relays associations through it); where it has
// not, like this machine's, the port is left out and the sync succeeds, so
// no other Service suffers.
func TestSCTPWhereTheKernelHasIt(t *testing.T) {
	p, _ := testProxier(t)
	a := server(t, "a")
	svc := dptest.Svc("ns", "sig", vip, 18086, dptest.WithProto(model.SCTP), dptest.WithEPs(eps(a)...))
	web := dptest.Svc("ns", "web", vip, 18087, dptest.WithEPs(eps(a)...))
	if err := p.Sync(context.Background(), dptest.Snapshot(svc, web), dataplane.SyncRequest{}); err != nil {
		t.Fatalf("sync with an SCTP port: %v", err)
	}
	_, hasSCTP := p.fronts[frontKey{model.SCTP, netip.MustParseAddrPort(vip + ":18086")}]
	if want := sctp.Supported(); hasSCTP != want {
		t.Errorf("SCTP socket %v, want %v (the kernel has SCTP: %v)", hasSCTP, want, want)
	}
	if got := get(t, netip.Addr{}, netip.MustParseAddrPort(vip+":18087")); got != "a" {
		t.Errorf("the TCP Service beside it answered %q", got)
	}
}

// TestPortInUse: a Service port another process holds gets no socket and
// a log line; the sync succeeds and the other Services are served.
func TestPortInUse(t *testing.T) {
	p, _ := testProxier(t)
	a := server(t, "a")
	held, err := net.Listen("tcp4", vip+":18088")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	taken := dptest.Svc("ns", "taken", vip, 18088, dptest.WithEPs(eps(a)...))
	web := dptest.Svc("ns", "web", vip, 18089, dptest.WithEPs(eps(a)...))
	for range 2 { // the next sync tries again, and again succeeds
		if err := p.Sync(context.Background(), dptest.Snapshot(taken, web), dataplane.SyncRequest{}); err != nil {
			t.Fatalf("sync with a port in use: %v", err)
		}
	}
	if _, ok := p.fronts[frontKey{model.TCP, netip.MustParseAddrPort(vip + ":18088")}]; ok {
		t.Error("a socket on a port another process holds")
	}
	if got := get(t, netip.Addr{}, netip.MustParseAddrPort(vip+":18089")); got != "a" {
		t.Errorf("the Service beside it answered %q", got)
	}
}
