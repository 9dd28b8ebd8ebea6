package iptables

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/dataplane/dptest"
	"github.com/kproxy/kproxy/internal/model"
)

// TestPrivilegedWriterOnThisMachine: with this machine's iptables-nft and
// kernel (the kernel asked over netlink for every xtables module), the
// netlink writer is chosen when the version is a proven one, and then
// writes; iptables-restore otherwise, naming the version.
func TestPrivilegedWriterOnThisMachine(t *testing.T) {
	l := dptest.NewLab(t, labPrefix)
	ex := NetnsExec{Namespace: l.Node}
	p, _ := New(labConfig(), WithExec(ex), WithSysctl(ExecSysctl{Exec: ex}), WithBackend(BackendNFT))
	ctx := context.Background()
	snap := dptest.Snapshot(dptest.Svc("ns", "web", "198.19.0.10", 80, dptest.WithEPs(dptest.EP("198.18.64.10", 8080, true))))
	if err := p.Sync(ctx, snap, dataplane.SyncRequest{Full: true}); err != nil {
		t.Fatal(err)
	}
	v, err := iptablesVersion(ctx, ex, BackendNFT.cmd(model.IPv4, ""))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("iptables-nft %s: writer %s %s", v, p.Writer(), p.writerWhy)
	if slices.Contains(ProvenVersions, v) {
		if p.Writer() != WriterNetlink || p.writes.netlink.Load() == 0 || p.writes.restore.Load() != 0 {
			t.Fatalf("proven %s: writer %s (%s), %d netlink writes, %d restores", v, p.Writer(), p.writerWhy, p.writes.netlink.Load(), p.writes.restore.Load())
		}
		return
	}
	if p.Writer() != WriterRestore || !strings.Contains(p.writerWhy, v) || p.writes.netlink.Load() != 0 {
		t.Fatalf("unproven %s: writer %s (%s)", v, p.Writer(), p.writerWhy)
	}
}
