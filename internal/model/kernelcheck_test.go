package model_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/dataplane/dptest"
	"github.com/kproxy/kproxy/internal/dataplane/iptables"
	"github.com/kproxy/kproxy/internal/dataplane/nftables"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/nfnl"
)

// FuzzKernelAccepts builds random Services, slices and Nodes (FuzzBuild's
// generator) and has the kernel check what each dataplane makes of the
// snapshot (both families, two configurations), in a network namespace of
// its own: nftables mode syncs it there over netlink (the kernel validates
// the transaction kproxy sends) and `nft -c -f` checks its --dry-run text;
// iptables mode's restore input goes through `iptables-restore --test`
// and `ip6tables-restore --test`. Whatever the API holds, kproxy never
// writes what the kernel refuses. Needs root.
//
// nft 1.0 cannot parse a constant inside a concatenation (it has no type
// there), which the ClientIP-affinity rules use (`ip saddr . 0xID
// @affinity`): their --dry-run text is not `nft -f` input, so `nft -c`
// checks only snapshots without affinity; the netlink sync checks all.
//
// Run: go test -fuzz=FuzzKernelAccepts -fuzztime=30s ./internal/model
func FuzzKernelAccepts(f *testing.F) {
	r := rand.New(rand.NewPCG(3, 5))
	for range 10 {
		f.Add(model.RandomBytes(r, 2000))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkKernelAccepts(t, data)
	})
}

// TestKernelAccepts runs the fuzz property on seeded random inputs, so
// that a plain `go test` (as root) covers it.
func TestKernelAccepts(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 17))
	for range 20 {
		checkKernelAccepts(t, model.RandomBytes(r, 2000))
	}
}

func checkKernelAccepts(t *testing.T, data []byte) {
	dptest.RequireRoot(t)
	snap, _ := model.Build(model.RandomInput(data))
	masqAll := dptest.Config()
	masqAll.MasqueradeAll = true
	masqAll.NodePortAddresses = []string{"198.18.0.0/16", "fd00::/8"}
	for _, cfg := range []dataplane.Config{dptest.Config(), masqAll} {
		cfg.Families = []model.Family{model.IPv4, model.IPv6}
		p, err := nftables.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		var nft bytes.Buffer
		if err := p.Render(&nft, snap); err != nil {
			t.Fatal(err)
		}
		syncInNamespace(t, cfg, snap)
		if !hasAffinity(snap) {
			kernelCheck(t, nft.String(), "nft", "-c", "-f", "-")
		}
		for _, fam := range cfg.Families {
			text := iptables.RestoreText(iptables.Render(iptables.Params{Config: cfg}, snap.Family(fam), snap.Node))
			tool := "iptables-restore"
			if fam == model.IPv6 {
				tool = "ip6tables-restore"
			}
			kernelCheck(t, text, tool, "--test", "--noflush")
		}
	}
}

// kernelCheck feeds text to argv in a new network namespace.
func kernelCheck(t *testing.T, text string, argv ...string) {
	t.Helper()
	cmd := exec.Command("unshare", append([]string{"--net"}, argv...)...)
	cmd.Stdin = strings.NewReader(text)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s refuses the rendering: %v\n%s\n--- input:\n%s", argv[0], err, out, text)
	}
}

// syncInNamespace syncs snap with an nftables Proxier in a namespace made
// for it (deleted at the end of the test).
func syncInNamespace(t *testing.T, cfg dataplane.Config, snap *model.Snapshot) {
	t.Helper()
	ns := fmt.Sprintf("kpxfuzz-%d-%d", os.Getpid(), nsSeq.Add(1))
	dptest.Run(t, "ip", "netns", "add", ns)
	defer func() { _ = exec.Command("ip", "netns", "del", ns).Run() }()
	defer nfnl.CloseIdle() // kept sockets would hold the namespace alive
	p, err := nftables.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dptest.InNamespace(t, ns, func() {
		err = p.Sync(context.Background(), snap, dataplane.SyncRequest{Full: true})
	})
	if err != nil {
		t.Fatalf("the kernel refuses the nftables sync: %v", err)
	}
}

var nsSeq atomic.Int64

func hasAffinity(snap *model.Snapshot) bool {
	for _, fs := range []*model.FamilySnapshot{snap.V4, snap.V6} {
		for _, p := range fs.Ports {
			if p.AffinityTimeout > 0 {
				return true
			}
		}
	}
	return false
}
