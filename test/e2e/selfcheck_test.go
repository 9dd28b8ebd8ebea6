//go:build e2e

package e2e

import (
	"context"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/test/testbed/netbed"
	"github.com/kproxy/kproxy/test/testbed/netbed/echo"
)

// The self-checks prove the testbed itself, without kproxy: pods reach pods
// on other nodes, clients reach nodes, and nothing routes out of the machine.

func TestSelfPodToPodAcrossNodes(t *testing.T) {
	_, pods := newBedWithPods(t)
	ctx := context.Background()
	from := pods[0] // on node1
	for _, to := range pods {
		if to.Node == from.Node {
			continue
		}
		for _, dst := range []netip.Addr{to.IP4, to.IP6} {
			for _, proto := range []string{echo.ProtoHTTP, echo.ProtoTCP, echo.ProtoUDP} {
				res := from.Send(ctx, echo.Request{Proto: proto, Dst: netip.AddrPortFrom(dst, echoPort)})
				if !res.OK() || res.Reply.Pod != to.PodName {
					t.Errorf("%s %s -> %s (%s): %s", proto, from.PodName, to.PodName, dst, res)
					continue
				}
				// No NAT between pods: the server sees the sender's own address.
				if want := podAddr(from, dst); res.Reply.Source.Addr() != want {
					t.Errorf("%s %s -> %s: server saw %s, want %s", proto, from.PodName, to.PodName, res.Reply.Source, want)
				}
			}
		}
	}
}

func TestSelfNodeToPodFixedSourcePort(t *testing.T) {
	bed, pods := newBedWithPods(t)
	ctx := context.Background()
	node := bed.Nodes()[0]
	to := pods[len(pods)-1] // on the last node
	for i, dst := range []netip.Addr{to.IP4, to.IP6} {
		src := netip.AddrPortFrom(netip.Addr{}, uint16(41000+i))
		res := node.Send(ctx, echo.Request{Proto: echo.ProtoTCP, Dst: netip.AddrPortFrom(dst, echoPort), Src: src})
		if !res.OK() || res.Reply.Source.Port() != src.Port() {
			t.Errorf("node1 -> %s from port %d: %s", dst, src.Port(), res)
		}
	}
}

func TestSelfClientToNode(t *testing.T) {
	bed := newBed(t)
	client := bed.Client()
	for _, node := range bed.Nodes() {
		srv, err := node.Start("echo-selfcheck", echoBinary(t), "serve", "--name", node.Spec.Name,
			"--tcp", "9999", "--udp", "9999", "--sctp", "")
		if err != nil {
			t.Fatal(err)
		}
		for _, dst := range []netip.Addr{node.Spec.IP4, node.Spec.IP6} {
			req := echo.Request{Proto: echo.ProtoTCP, Dst: netip.AddrPortFrom(dst, 9999)}
			res := eventuallyOK(t, client, req)
			if res.Reply.Pod != node.Spec.Name {
				t.Errorf("client -> %s: %s", dst, res)
			}
		}
		if err := srv.Stop(); err != nil {
			t.Error(err)
		}
	}
}

// TestSelfNoRouteOut checks every namespace of the bed: no default route,
// and no route to addresses outside the testbed's space.
func TestSelfNoRouteOut(t *testing.T) {
	bed, _ := newBedWithPods(t)
	ctx := context.Background()
	outside := []string{"1.1.1.1", "8.8.8.8", "10.0.0.1", "192.168.1.1", "2001:4860:4860::8888"}
	for _, ns := range bed.Namespaces() {
		for _, fam := range []string{"-4", "-6"} {
			out, err := ns.IP(ctx, fam, "route", "show", "default")
			if err != nil || strings.TrimSpace(out) != "" {
				t.Errorf("%s: default route %s: %q %v", ns.Name, fam, out, err)
			}
		}
		for _, dst := range outside {
			if out, err := ns.IP(ctx, "route", "get", dst); err == nil {
				t.Errorf("%s: route to %s exists: %s", ns.Name, dst, strings.TrimSpace(out))
			}
		}
		// And a packet really goes nowhere.
		res := ns.Send(ctx, echo.Request{Proto: echo.ProtoUDP, Dst: netip.MustParseAddrPort("1.1.1.1:53"), Timeout: 200e6})
		if res.OK() || res.Kind != echo.KindUnreachable {
			t.Errorf("%s: UDP to 1.1.1.1: want unreachable, got %s", ns.Name, res)
		}
	}
}

// podAddr returns the pod's address of dst's family.
func podAddr(p *netbed.Pod, dst netip.Addr) netip.Addr {
	if dst.Is4() {
		return p.IP4
	}
	return p.IP6
}

// TestSelfHostLink checks the root namespace's side: it reaches the nodes
// over the host link (the path kproxy takes to the API server), and testbed
// addresses that are not on the node network are blackholed, not sent to
// the machine's default route.
func TestSelfHostLink(t *testing.T) {
	bed := newBed(t)
	l := bed.Layout()
	if !l.Host4.IsValid() {
		t.Fatal("testLayout has no host link")
	}
	node := bed.Nodes()[0]
	if _, err := node.Start("echo-hostlink", echoBinary(t), "serve", "--name", "hostlink",
		"--tcp", "9998", "--udp", "", "--sctp", ""); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	dst := netip.AddrPortFrom(node.Spec.IP4, 9998)
	var res echo.Result
	for range 50 {
		if res = echo.Send(ctx, echo.Request{Proto: echo.ProtoTCP, Dst: dst, Timeout: time.Second}); res.OK() {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !res.OK() || res.Reply.Source.Addr() != l.Host4 {
		t.Errorf("root -> %s: %s (want a reply that saw %s)", dst, res, l.Host4)
	}
	out, err := exec.Command("ip", "route", "get", "198.18.255.1").CombinedOutput()
	if err == nil && !strings.Contains(string(out), "blackhole") {
		t.Errorf("root namespace routes 198.18.255.1 somewhere: %s", out)
	}
}
