package conntrack

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/nfnl"
)

// requireRoot skips locally without root, but fails in CI.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("privileged test needs root, and CI=true forbids skipping")
	}
	t.Skip("privileged test: needs root (netns + conntrack netlink)")
}

// newNetnsHandle returns a netlink handle in a fresh, anonymous network
// namespace that disappears when the test ends, and the namespace.
func newNetnsHandle(t *testing.T) (*netlink.Handle, netns.NsHandle) {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatalf("current netns: %v", err)
	}
	defer orig.Close()
	ns, err := netns.New()
	if err != nil {
		t.Fatalf("new netns: %v", err)
	}
	if err := netns.Set(orig); err != nil {
		t.Fatalf("back to the original netns: %v", err)
	}
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_NETFILTER)
	if err != nil {
		ns.Close()
		t.Fatalf("netlink handle in netns: %v", err)
	}
	t.Cleanup(func() { h.Close(); ns.Close() })
	return h, ns
}

// inNetns runs fn on a locked thread inside ns.
func inNetns(t *testing.T, ns netns.NsHandle, fn func()) {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	if err := netns.Set(ns); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := netns.Set(orig); err != nil {
			panic(err) // the thread must not go back to the pool in ns
		}
	}()
	fn()
}

// newTableIn returns a NetlinkTable whose socket is opened in ns.
func newTableIn(t *testing.T, ns netns.NsHandle) *NetlinkTable {
	t.Helper()
	var fd int
	var err error
	inNetns(t, ns, func() { fd, err = nfnl.OpenSocket(0) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return &NetlinkTable{fd: fd, open: func() (int, error) { return -1, errors.New("test table: socket lost") }}
}

func ctFlow(proto uint8, client, service, endpoint netip.AddrPort) *netlink.ConntrackFlow {
	fam := uint8(unix.AF_INET)
	if client.Addr().Is6() {
		fam = unix.AF_INET6
	}
	ip := func(a netip.AddrPort) net.IP { return net.IP(a.Addr().AsSlice()) }
	return &netlink.ConntrackFlow{
		FamilyType: fam,
		Forward:    netlink.IPTuple{Protocol: proto, SrcIP: ip(client), DstIP: ip(service), SrcPort: client.Port(), DstPort: service.Port()},
		Reverse:    netlink.IPTuple{Protocol: proto, SrcIP: ip(endpoint), DstIP: ip(client), SrcPort: endpoint.Port(), DstPort: client.Port()},
		TimeOut:    120,
	}
}

// TestPrivilegedNetlinkDeleteFlows inserts conntrack entries in a private
// network namespace and checks that exactly the stale ones are deleted.
func TestPrivilegedNetlinkDeleteFlows(t *testing.T) {
	requireRoot(t)
	h, ns := newNetnsHandle(t)
	ap := netip.MustParseAddrPort
	tests := []struct {
		family  model.Family
		inetFam netlink.InetFamily
		client  string
		service string
		keep    string // serving endpoint
		gone    string // removed endpoint
	}{{
		family: model.IPv4, inetFam: unix.AF_INET,
		client: "198.18.5.5:40000", service: "198.18.0.10:53", keep: "198.19.1.1:5353", gone: "198.19.1.2:5353",
	}, {
		family: model.IPv6, inetFam: unix.AF_INET6,
		client: "[fd00::5]:40000", service: "[fd00:10::10]:53", keep: "[fd00:19::1]:5353", gone: "[fd00:19::2]:5353",
	}}
	for _, tc := range tests {
		t.Run(tc.family.String(), func(t *testing.T) {
			client, service := ap(tc.client), ap(tc.service)
			entries := []*netlink.ConntrackFlow{
				ctFlow(unix.IPPROTO_UDP, client, service, ap(tc.keep)),
				ctFlow(unix.IPPROTO_UDP, netip.AddrPortFrom(client.Addr(), 40001), service, ap(tc.gone)),
				ctFlow(unix.IPPROTO_TCP, client, service, ap(tc.gone)), // TCP: left alone
			}
			for _, e := range entries {
				if err := h.ConntrackCreate(netlink.ConntrackTable, tc.inetFam, e); err != nil {
					t.Fatalf("inserting %v: %v", e, err)
				}
			}
			keep := ap(tc.keep)
			port := &model.ServicePort{
				ID: model.PortID{Namespace: "ns", Name: "dns", Protocol: model.UDP}, Family: tc.family, Protocol: model.UDP,
				Port: service.Port(), ClusterIP: service.Addr(),
				Endpoints: []*model.Endpoint{{IP: keep.Addr(), Port: keep.Port(), Ready: true, Serving: true}},
			}
			snap := &model.FamilySnapshot{Family: tc.family, Ports: []*model.ServicePort{port}}
			var n int
			var err error
			plan := NewPlan(nil, snap, true)
			scope := plan.Scopes()[0]
			if tc.family == model.IPv6 {
				n, err = newTableIn(t, ns).DeleteFlows(tc.family, scope, plan.Stale)
			} else {
				// The daemon's table: its socket opened on first use in the
				// calling thread's namespace, and kept.
				inNetns(t, ns, func() {
					tbl := NewNetlinkTable()
					n, err = tbl.DeleteFlows(tc.family, scope, plan.Stale)
					if again, err2 := tbl.DeleteFlows(tc.family, scope, plan.Stale); again != 0 || err2 != nil {
						t.Errorf("second DeleteFlows on the kept socket = %d, %v; want 0, nil", again, err2)
					}
					unix.Close(tbl.fd)
				})
			}
			if err != nil || n != 1 {
				t.Fatalf("DeleteFlows() = %d, %v; want 1 deleted", n, err)
			}
			left, err := h.ConntrackTableList(netlink.ConntrackTable, tc.inetFam)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, f := range left {
				got = append(got, addrPort(f.Reverse.SrcIP, f.Reverse.SrcPort).String()+"/"+map[uint8]string{6: "tcp", 17: "udp"}[f.Forward.Protocol])
			}
			slices.Sort(got)
			want := []string{ap(tc.gone).String() + "/tcp", ap(tc.keep).String() + "/udp"}
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("entries left = %v, want %v", got, want)
			}
		})
	}
}

func addrPort(ip net.IP, port uint16) netip.AddrPort {
	a, _ := netip.AddrFromSlice(ip)
	return netip.AddrPortFrom(a.Unmap(), port)
}

// createEntry inserts a conntrack entry given by its attributes (wireEntry)
// through fd, with a timeout.
func createEntry(t *testing.T, fd int, attrs []byte) {
	t.Helper()
	const msgCTNew = 0 // IPCTNL_MSG_CT_NEW
	const ctaTimeout = 7
	req := nfnl.SubsysMessage(unix.NFNL_SUBSYS_CTNETLINK, msgCTNew, unix.NLM_F_CREATE|unix.NLM_F_ACK, unix.AF_INET, func(b *nfnl.Batch) {
		nfnl.EachAttr(attrs, func(typ uint16, data []byte) { b.Attr(typ, data) })
		b.AttrBE32(ctaTimeout, 120)
	})
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		t.Fatal(err)
	}
	var errno syscall.Errno
	if err := nfnl.ReadAcks(fd, 1, func(e syscall.Errno) { errno = e }); err != nil || errno != 0 {
		t.Fatalf("creating conntrack entry % x: %v %v", attrs, err, errno)
	}
}

// kernelAtLeast reports whether the running kernel is major.minor or later.
func kernelAtLeast(t *testing.T, major, minor int) bool {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	var ma, mi int
	fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &ma, &mi)
	return ma > major || ma == major && mi >= minor
}

// TestPrivilegedNetlinkScopes checks that a scoped walk is shown only the
// entries of its scope: the kernel filters the dump (by protocol since
// 5.8, by reply status since 5.15), and a table that stopped filtering
// shows them all.
func TestPrivilegedNetlinkScopes(t *testing.T) {
	requireRoot(t)
	_, ns := newNetnsHandle(t)
	tbl := newTableIn(t, ns)
	ap := netip.MustParseAddrPort
	client, svc, ep := ap("198.18.5.5:40000"), ap("198.18.0.10:53"), ap("198.19.1.1:5353")
	createEntry(t, tbl.fd, wireEntry(unix.IPPROTO_UDP, client, svc, ep, 0, false, 0))
	createEntry(t, tbl.fd, wireEntry(unix.IPPROTO_TCP, client, svc, svc, 3, true, 0))                                    // established
	createEntry(t, tbl.fd, wireEntry(unix.IPPROTO_TCP, ap("198.18.5.5:40001"), svc, svc, tcpConntrackSynSent, false, 0)) // unanswered SYN
	seen := func(scope Scope) []string {
		var got []string
		if _, err := tbl.DeleteFlows(model.IPv4, scope, func(f Flow) bool {
			got = append(got, fmt.Sprintf("%s/%v", f.Protocol, f.SynSent))
			return false
		}); err != nil {
			t.Fatal(err)
		}
		slices.Sort(got)
		return got
	}
	for _, tc := range []struct {
		scope     Scope
		want      []string
		minKernel [2]int
	}{
		{Scope{}, []string{"TCP/false", "TCP/true", "UDP/false"}, [2]int{0, 0}},
		{Scope{Protocol: model.UDP}, []string{"UDP/false"}, [2]int{5, 8}},
		{Scope{Protocol: model.TCP, Unreplied: true}, []string{"TCP/true"}, [2]int{5, 15}},
	} {
		got := seen(tc.scope)
		if !kernelAtLeast(t, tc.minKernel[0], tc.minKernel[1]) {
			t.Logf("scope %+v shown %v (this kernel predates its filter)", tc.scope, got)
			continue
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("scope %+v shown %v, want %v", tc.scope, got, tc.want)
		}
	}
	if tbl.unfiltered {
		t.Fatal("the kernel refused a filtered dump")
	}
	tbl.unfiltered = true
	if got := seen(Scope{Protocol: model.UDP}); len(got) != 3 {
		t.Errorf("an unfiltered table showed %v, want all 3 entries", got)
	}
}

// BenchmarkPrivilegedWalk measures one cleanup walk of a table holding
// KPROXY_CT_ENTRIES established TCP entries (default 50,000: a busy node)
// and one UDP entry, for a plan that cleans a UDP frontend: the kernel's
// UDP-only dump, the whole dump read by this package, and the whole dump
// read by vishvananda/netlink's ConntrackDeleteFilters.
//
//	sudo go test -run '^$' -bench PrivilegedWalk -benchmem ./internal/conntrack/
func BenchmarkPrivilegedWalk(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root (netns + conntrack netlink)")
	}
	n := 50000
	if v := os.Getenv("KPROXY_CT_ENTRIES"); v != "" {
		fmt.Sscan(v, &n)
	}
	t := &testing.T{}
	h, ns := newNetnsHandle(t)
	defer h.Close()
	tbl := newTableIn(t, ns)
	defer unix.Close(tbl.fd)
	ap := netip.MustParseAddrPort
	svc := ap("198.18.0.10:53")
	createEntry(t, tbl.fd, wireEntry(unix.IPPROTO_UDP, ap("198.18.5.5:40000"), svc, ap("198.19.1.1:5353"), 0, false, 0))
	for i := range n {
		client := netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 18, 6 + byte(i/60000), byte(i / 250 % 240)}), uint16(1024+i%60000))
		createEntry(t, tbl.fd, wireEntry(unix.IPPROTO_TCP, client, ap("198.18.0.20:80"), ap("198.18.0.20:80"), 3, true, 0))
	}
	stale := func(Flow) bool { return false }
	b.Run("udp-scope", func(b *testing.B) {
		for b.Loop() {
			if _, err := tbl.DeleteFlows(model.IPv4, Scope{Protocol: model.UDP}, stale); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("whole", func(b *testing.B) {
		tbl.unfiltered = true
		defer func() { tbl.unfiltered = false }()
		for b.Loop() {
			if _, err := tbl.DeleteFlows(model.IPv4, Scope{Protocol: model.UDP}, stale); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("vishvananda", func(b *testing.B) {
		filter := vishFilter(stale)
		for b.Loop() {
			if _, err := h.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, filter); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// vishFilter adapts a stale func to vishvananda/netlink's filter.
type vishFilter func(Flow) bool

func (f vishFilter) MatchConntrackFlow(c *netlink.ConntrackFlow) bool {
	return f(Flow{OrigDst: addrPort(c.Forward.DstIP, c.Forward.DstPort), ReplySrc: addrPort(c.Reverse.SrcIP, c.Reverse.SrcPort)})
}

// TestPrivilegedNetlinkLocal: the table's namespace's own addresses and
// loopback are local, a neighbour's is not.
func TestPrivilegedNetlinkLocal(t *testing.T) {
	requireRoot(t)
	_, ns := newNetnsHandle(t)
	inNetns(t, ns, func() {
		link := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "kpct0"}, PeerName: "kpct1"}
		if err := netlink.LinkAdd(link); err != nil {
			t.Fatal(err)
		}
		addr, _ := netlink.ParseAddr("198.18.77.1/24")
		if err := netlink.AddrAdd(link, addr); err != nil {
			t.Fatal(err)
		}
		local, err := NewNetlinkTable().Local(model.IPv4)
		if err != nil {
			t.Fatal(err)
		}
		for a, want := range map[string]bool{"198.18.77.1": true, "127.0.0.1": true, "127.0.0.9": true, "198.18.77.2": false} {
			if got := local(netip.MustParseAddr(a)); got != want {
				t.Errorf("local(%s) = %v, want %v", a, got, want)
			}
		}
	})
}
