package iptables

import (
	"context"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/dataplane/dptest"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/trace"
)

func isNodeAddr(a netip.Addr) bool {
	return a.IsLoopback() || a == dptest.NodeIP || a == dptest.NodeIP6
}

// TestPrivilegedVerifyMatrix writes each snapshot of the policy matrix to
// the kernel (each backend) and traces every case through the rules
// iptables-save reads back: the kernel's outcome equals the matrix's
// expectation and the render's, with nothing different on the path.
func TestPrivilegedVerifyMatrix(t *testing.T) {
	for _, b := range []Backend{BackendNFT, BackendLegacy} {
		t.Run(string(b), func(t *testing.T) {
			l := dptest.NewLab(t, labPrefix)
			ex := NetnsExec{Namespace: l.Node}
			p, _ := New(labConfig(), WithExec(ex), WithSysctl(ExecSysctl{Exec: ex}), WithBackend(b))
			ctx := context.Background()
			dptest.RunMatrix(t, func(snap *model.Snapshot) func(dptest.Packet) dptest.Result {
				if err := p.Sync(ctx, snap, dataplane.SyncRequest{Full: true}); err != nil {
					t.Fatal(err)
				}
				return func(pkt dptest.Packet) dptest.Result {
					v, err := p.Verify(ctx, snap, pkt, isNodeAddr)
					if err != nil {
						t.Fatal(err)
					}
					if !v.Agree() {
						t.Errorf("kernel %v (%v), model %v, notes %q", v.Kernel, v.KernelErr, v.Model, v.Notes)
					}
					return v.Kernel
				}
			}, wantIPTables)
		})
	}
}

// TestPrivilegedVerifyFindsHandEdits: a Service's rule deleted by hand and
// the jump into kproxy's rules deleted by hand are reported and change the
// kernel's outcome.
func TestPrivilegedVerifyFindsHandEdits(t *testing.T) {
	l := dptest.NewLab(t, labPrefix)
	ex := NetnsExec{Namespace: l.Node}
	p, _ := New(labConfig(), WithExec(ex), WithSysctl(ExecSysctl{Exec: ex}), WithBackend(BackendNFT))
	ctx := context.Background()
	snap := dptest.Snapshot(dptest.Svc("ns", "web", "198.19.0.10", 80, dptest.WithEPs(dptest.EP("198.18.64.10", 8080, true), dptest.EP("198.18.65.10", 8080, false))))
	if err := p.Sync(ctx, snap, dataplane.SyncRequest{Full: true}); err != nil {
		t.Fatal(err)
	}
	pkt := trace.Packet{Src: netip.MustParseAddr("198.18.200.5"), Dst: netip.MustParseAddr("198.19.0.10"), DPort: 80, Proto: "tcp", Iif: "eth0"}
	verify := func() trace.Verification {
		t.Helper()
		v, err := p.Verify(ctx, snap, pkt, isNodeAddr)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if v := verify(); !v.Agree() || len(v.Model.DNAT) != 2 {
		t.Fatalf("intact rules: kernel %v (%v), model %v, notes %q", v.Kernel, v.KernelErr, v.Model, v.Notes)
	}
	// The first endpoint's rule of the Service chain, deleted by hand.
	svc, num := "", 0
	out, _ := ex.Run(ctx, nil, "iptables-nft-save", "-t", "nat")
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "-A KUBE-SVC-") {
			svc = strings.Fields(line)[1]
			if num++; strings.Contains(line, "KUBE-SEP-") {
				break
			}
		}
	}
	if _, err := ex.Run(ctx, nil, "iptables-nft", "-t", "nat", "-D", svc, strconv.Itoa(num)); err != nil {
		t.Fatal(err)
	}
	v := verify()
	if len(v.Kernel.DNAT) != 1 || !slices.ContainsFunc(v.Notes, func(n string) bool {
		return strings.Contains(n, "nat/"+svc+": the kernel has 2 rules, kproxy writes 3")
	}) {
		t.Errorf("deleted endpoint rule: kernel %v (%v), model %v, notes %q", v.Kernel, v.KernelErr, v.Model, v.Notes)
	}
	if err := p.Sync(ctx, snap, dataplane.SyncRequest{Full: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := ex.Run(ctx, nil, "iptables-nft", "-t", "nat", "-D", "PREROUTING", "-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES"); err != nil {
		t.Fatal(err)
	}
	v = verify()
	if len(v.Kernel.DNAT) != 0 || !slices.ContainsFunc(v.Notes, func(n string) bool { return strings.Contains(n, "nat/PREROUTING lacks kproxy's jump to KUBE-SERVICES") }) {
		t.Errorf("deleted jump: kernel %v (%v), model %v, notes %q", v.Kernel, v.KernelErr, v.Model, v.Notes)
	}
}

// TestPrivilegedVerifyFreshProcess: `kproxy verify` runs in a process of
// its own, which has synced nothing: it renders the nfacct counting rules
// the kernel's rules have (a NodePort's localhost rule among them), so a
// NodePort's chains agree.
func TestPrivilegedVerifyFreshProcess(t *testing.T) {
	l := dptest.NewLab(t, labPrefix)
	ex := NetnsExec{Namespace: l.Node}
	opts := []Option{WithExec(ex), WithSysctl(ExecSysctl{Exec: ex}), WithBackend(BackendNFT)}
	p, _ := New(labConfig(), opts...)
	ctx := context.Background()
	snap := dptest.Snapshot(dptest.Svc("ns", "np", "198.19.0.10", 80, dptest.WithNodePort(30080), dptest.WithEPs(dptest.EP("198.18.64.10", 8080, true))))
	if err := p.Sync(ctx, snap, dataplane.SyncRequest{Full: true}); err != nil {
		t.Fatal(err)
	}
	fresh, _ := New(labConfig(), opts...)
	for _, dst := range []string{"127.0.0.1", dptest.NodeIP.String()} {
		pkt := trace.Packet{Src: netip.MustParseAddr("127.0.0.1"), Dst: netip.MustParseAddr(dst), Proto: "tcp", DPort: 30080, FromHost: true}
		if dst != "127.0.0.1" {
			pkt.Src = dptest.NodeIP
		}
		v, err := fresh.Verify(ctx, snap, pkt, isNodeAddr)
		if err != nil {
			t.Fatal(err)
		}
		if !v.Agree() || len(v.Notes) > 0 {
			t.Errorf("%s:30080: kernel %v (%v), model %v, notes %q", dst, v.Kernel, v.KernelErr, v.Model, v.Notes)
		}
	}
}
