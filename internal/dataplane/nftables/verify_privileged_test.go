package nftables

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/dataplane/dptest"
	"github.com/kproxy/kproxy/internal/model"
)

func isNodeAddr(a netip.Addr) bool {
	return a.IsLoopback() || a == dptest.NodeIP || a == dptest.NodeIP6
}

// verifyIn runs Verify in the lab's node namespace.
func verifyIn(t *testing.T, n *testNet, cfg dataplane.Config, snap *model.Snapshot, p dptest.Packet) Verification {
	t.Helper()
	var v Verification
	var err error
	n.In(n.Node, func() { v, err = Verify(cfg, DefaultTableName, snap, p, isNodeAddr) })
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestPrivilegedVerifyMatrix writes each snapshot of the policy matrix to
// the kernel and traces every case through the rules read back: the
// kernel's outcome equals the matrix's expectation and the render's, with
// no difference noted on the path.
func TestPrivilegedVerifyMatrix(t *testing.T) {
	n := newTestNet(t)
	cfg := dptest.Config()
	p, _ := New(cfg)
	dptest.RunMatrix(t, func(snap *model.Snapshot) func(dptest.Packet) dptest.Result {
		n.sync(p, snap, dataplane.SyncRequest{Full: true})
		return func(pkt dptest.Packet) dptest.Result {
			v := verifyIn(t, n, cfg, snap, pkt)
			if v.KernelErr != nil || len(v.Notes) > 0 || v.Kernel.String() != v.Model.String() {
				t.Errorf("kernel %v (%v), model %v, notes %q", v.Kernel, v.KernelErr, v.Model, v.Notes)
			}
			return v.Kernel
		}
	}, dptest.MatrixCase.Want)
}

// TestPrivilegedVerifyFindsHandEdits: a rule deleted by hand, an element
// deleted by hand and a rule added by hand are each reported, and change
// the kernel's outcome where they change the packet's path.
func TestPrivilegedVerifyFindsHandEdits(t *testing.T) {
	n := newTestNet(t)
	cfg := dptest.Config()
	cfg.Families = []model.Family{model.IPv4, model.IPv6}
	cfg.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("198.19.0.0/24"), netip.MustParsePrefix("fd00:19::/112")}
	snap := featureSnapshot()
	p, _ := New(cfg)
	n.sync(p, snap, dataplane.SyncRequest{Full: true})
	// An address of the Service range no Service has: dropped, in the
	// interval set read back too.
	unalloc := dptest.Packet{Src: netip.MustParseAddr("198.18.200.5"), Dst: netip.MustParseAddr("198.19.0.200"), DPort: 80, Proto: "tcp", Iif: "eth0"}
	if v := verifyIn(t, n, cfg, snap, unalloc); !v.Agree() || v.Kernel.Verdict != "drop" {
		t.Fatalf("unallocated Service address: kernel %v (%v), model %v, notes %q", v.Kernel, v.KernelErr, v.Model, v.Notes)
	}
	pkt := dptest.Packet{Src: netip.MustParseAddr("198.18.200.5"), Dst: netip.MustParseAddr("198.19.0.10"), DPort: 80, Proto: "tcp", Iif: "eth0"}
	v := verifyIn(t, n, cfg, snap, pkt)
	if !v.Agree() || len(v.Model.DNAT) != 3 {
		t.Fatalf("intact table: kernel %v (%v), model %v, notes %q", v.Kernel, v.KernelErr, v.Model, v.Notes)
	}
	pkt6 := pkt
	pkt6.Src, pkt6.Dst = netip.MustParseAddr("fd00:200::5"), snap.V6.Ports[0].ClusterIP
	if v := verifyIn(t, n, cfg, snap, pkt6); v.KernelErr != nil || len(v.Notes) > 0 || v.Kernel.String() != v.Model.String() {
		t.Fatalf("intact IPv6 table: kernel %v (%v), model %v, notes %q", v.Kernel, v.KernelErr, v.Model, v.Notes)
	}

	nft := func(args ...string) {
		dptest.Run(t, append([]string{"ip", "netns", "exec", n.Node, "nft"}, args...)...)
	}
	// The Service's element of the dispatch map, deleted by hand.
	nft("delete", "element", "ip", DefaultTableName, mapServiceIPs, "{ 198.19.0.10 . tcp . 80 }")
	v = verifyIn(t, n, cfg, snap, pkt)
	if v.Kernel.String() == v.Model.String() || !hasNote(v.Notes, "set "+mapServiceIPs+": the kernel lacks kproxy's element 198.19.0.10 . tcp . 80") {
		t.Errorf("deleted element: kernel %v, model %v, notes %q", v.Kernel, v.Model, v.Notes)
	}
	n.sync(p, snap, dataplane.SyncRequest{Full: true})

	// The jump to the services chain, deleted by hand.
	handle := ruleHandle(t, n, chainNATPrerouting, "jump services")
	nft("delete", "rule", "ip", DefaultTableName, chainNATPrerouting, "handle", handle)
	v = verifyIn(t, n, cfg, snap, pkt)
	if len(v.Kernel.DNAT) != 0 || !hasNote(v.Notes, "chain "+chainNATPrerouting+": the kernel lacks kproxy's rule \"jump services\"") {
		t.Errorf("deleted rule: kernel %v, model %v, notes %q", v.Kernel, v.Model, v.Notes)
	}
	n.sync(p, snap, dataplane.SyncRequest{Full: true})

	// A rule kproxy does not write, added by hand on the packet's path.
	nft("insert", "rule", "ip", DefaultTableName, chainNATPrerouting, "counter")
	v = verifyIn(t, n, cfg, snap, pkt)
	if v.KernelErr == nil || !strings.Contains(v.KernelErr.Error(), "does not write") || !hasNote(v.Notes, "the kernel has a rule kproxy does not write") {
		t.Errorf("added rule: kernel %v (%v), notes %q", v.Kernel, v.KernelErr, v.Notes)
	}
}

func hasNote(notes []string, s string) bool {
	return slices.ContainsFunc(notes, func(n string) bool { return strings.Contains(n, s) })
}

// ruleHandle finds the handle of the rule of chain whose text is text.
func ruleHandle(t *testing.T, n *testNet, chain, text string) string {
	t.Helper()
	out := dptest.Output(t, "ip", "netns", "exec", n.Node, "nft", "-a", "list", "chain", "ip", DefaultTableName, chain)
	for _, line := range strings.Split(out, "\n") {
		if r, h, ok := strings.Cut(strings.TrimSpace(line), " # handle "); ok && r == text {
			return h
		}
	}
	t.Fatalf("no rule %q in %s:\n%s", text, chain, out)
	return ""
}

// TestPrivilegedVerifyAfterHistory: a running kproxy's names depend on
// the order Services came in (a policy chain's block); Verify, which
// renders afresh, still finds the kernel agreeing.
func TestPrivilegedVerifyAfterHistory(t *testing.T) {
	n := newTestNet(t)
	cfg := dptest.Config()
	p, _ := New(cfg)
	// b's policy chain shares a's endpoint-ranges map, after a's block:
	// once a is gone, a fresh render gives b the first block.
	bName := ""
	for i := 0; bName == ""; i++ {
		if name := fmt.Sprintf("b%d", i); shardOf("svc ns/"+name+"/tcp/p", "tcp") == shardOf("svc ns/a/tcp/p", "tcp") {
			bName = name
		}
	}
	a := dptest.Svc("ns", "a", "198.19.0.10", 80, dptest.WithEPs(dptest.EP("198.18.64.10", 8080, true)))
	b := dptest.Svc("ns", bName, "198.19.0.11", 80, dptest.WithEPs(dptest.EP("198.18.64.11", 8080, true), dptest.EP("198.18.65.10", 8080, false)))
	n.sync(p, dptest.Snapshot(a, b), dataplane.SyncRequest{Full: true})
	b2 := dptest.Svc("ns", bName, "198.19.0.11", 80, dptest.WithEPs(dptest.EP("198.18.64.11", 8080, true)))
	snap := dptest.Snapshot(b2)
	n.sync(p, snap, dataplane.SyncRequest{Full: true})
	pkt := dptest.Packet{Src: netip.MustParseAddr("198.18.200.5"), Dst: netip.MustParseAddr("198.19.0.11"), DPort: 80, Proto: "tcp", Iif: "eth0"}
	if v := verifyIn(t, n, cfg, snap, pkt); !v.Agree() || len(v.Kernel.DNAT) != 1 {
		t.Fatalf("kernel %v (%v), model %v, notes %q", v.Kernel, v.KernelErr, v.Model, v.Notes)
	}
}
