package conntrack

import (
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/kproxy/kproxy/internal/model"
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
			if tc.family == model.IPv6 {
				n, err = NewNetlinkTableWith(h).DeleteFlows(tc.family, NewPlan(nil, snap, true).Stale)
			} else {
				// The daemon's table: its socket opened on first use in the
				// calling thread's namespace, and kept.
				inNetns(t, ns, func() {
					tbl := NewNetlinkTable()
					n, err = tbl.DeleteFlows(tc.family, NewPlan(nil, snap, true).Stale)
					if again, err2 := tbl.DeleteFlows(tc.family, NewPlan(nil, snap, true).Stale); again != 0 || err2 != nil {
						t.Errorf("second DeleteFlows on the kept socket = %d, %v; want 0, nil", again, err2)
					}
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
