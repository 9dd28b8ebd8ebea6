package nfacct_test

import (
	"errors"
	"net"
	"syscall"
	"testing"

	"github.com/kproxy/kproxy/internal/dataplane/dptest"
	"github.com/kproxy/kproxy/internal/nfacct"
)

// TestPrivilegedCounter: a counter is created once (a second Ensure keeps
// its count), counts the packets of a rule that names it, cannot be
// deleted while the rule holds it, and is gone after.
func TestPrivilegedCounter(t *testing.T) {
	l := dptest.NewLab(t, "nfacct")
	const name = "kproxy-test"
	l.In(l.Node, func() {
		if err := nfacct.Supported(); err != nil {
			t.Fatal(err)
		}
		if _, err := nfacct.Packets(name); !errors.Is(err, syscall.ENOENT) {
			t.Fatalf("Packets of a missing counter: %v, want ENOENT", err)
		}
		if err := nfacct.Ensure(name); err != nil {
			t.Fatal(err)
		}
	})
	dptest.Run(t, "ip", "netns", "exec", l.Node, "iptables-nft", "-w", "-A", "INPUT", "-p", "udp", "--dport", "9", "-m", "nfacct", "--nfacct-name", name)
	l.In(l.Pod, func() {
		// Unconnected, so that the node's port unreachable fails no write.
		c, err := net.ListenPacket("udp4", "198.18.64.10:0")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		to := &net.UDPAddr{IP: net.ParseIP("198.18.64.1"), Port: 9}
		for range 3 {
			if _, err := c.WriteTo([]byte("x"), to); err != nil {
				t.Fatal(err)
			}
		}
	})
	l.In(l.Node, func() {
		if err := nfacct.Ensure(name); err != nil {
			t.Fatal(err)
		}
		if n, err := nfacct.Packets(name); err != nil || n != 3 {
			t.Errorf("Packets = %d, %v; want 3 (three datagrams)", n, err)
		}
		if err := nfacct.Delete(name); !errors.Is(err, nfacct.ErrInUse) {
			t.Errorf("Delete of a counter a rule uses: %v, want ErrInUse", err)
		}
	})
	dptest.Run(t, "ip", "netns", "exec", l.Node, "iptables-nft", "-w", "-F", "INPUT")
	l.In(l.Node, func() {
		for range 2 { // the second finds nothing, which is not an error
			if err := nfacct.Delete(name); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := nfacct.Packets(name); !errors.Is(err, syscall.ENOENT) {
			t.Errorf("Packets after Delete: %v, want ENOENT", err)
		}
	})
}
