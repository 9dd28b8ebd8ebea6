package iptables

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/internal/dataplane/dptest"
	"github.com/kproxy/kproxy/internal/model"
)

// TestPrivilegedNetlinkCanary: the netlink canary check sees each table's
// mark (nat: the PREROUTING jump to KUBE-SERVICES; mangle: the canary
// chain) and notices a flush of the table and a missing table.
func TestPrivilegedNetlinkCanary(t *testing.T) {
	l := dptest.NewLab(t, labPrefix)
	check := func(table string) (ok bool) {
		l.In(l.Node, func() { ok = netlinkCanaryOK(model.IPv4, table, canaryMarks[table]) })
		return ok
	}
	if check(tableNAT) || check(tableMangle) {
		t.Fatal("canary reported before any rule exists")
	}
	nat := "*nat\n:KUBE-SERVICES - [0:0]\n" +
		`-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES` + "\nCOMMIT\n"
	mangle := restoreText(&tableWrite{table: tableMangle, chains: []*Chain{canaryChain()}})
	for _, text := range []string{nat, mangle} {
		cmd := exec.Command("ip", "netns", "exec", l.Node, "iptables-nft-restore", "--noflush")
		cmd.Stdin = strings.NewReader(text)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("iptables-nft-restore: %v: %s\n%s", err, out, text)
		}
	}
	if !check(tableNAT) || !check(tableMangle) {
		t.Fatal("canary not seen after restore")
	}
	if check(tableFilter) {
		t.Error("canary reported in a table kproxy never wrote")
	}
	dptest.Run(t, "ip", "netns", "exec", l.Node, "iptables-nft", "-t", "nat", "-F")
	if check(tableNAT) {
		t.Error("flush of nat not noticed")
	}
	dptest.Run(t, "ip", "netns", "exec", l.Node, "iptables-nft", "-t", "mangle", "-X", chainCanary)
	if check(tableMangle) {
		t.Error("deleted mangle canary chain not noticed")
	}
}

// TestPrivilegedHasTables: a fresh namespace has no iptables tables in
// either backend; a chain created by each backend's iptables is seen, in
// its own backend and family only.
func TestPrivilegedHasTables(t *testing.T) {
	l := dptest.NewLab(t, labPrefix)
	has := func(b Backend, fam model.Family) (ok bool) {
		l.In(l.Node, func() { ok = HasTables(b, fam) })
		return ok
	}
	all := func() [4]bool {
		return [4]bool{has(BackendNFT, model.IPv4), has(BackendNFT, model.IPv6), has(BackendLegacy, model.IPv4), has(BackendLegacy, model.IPv6)}
	}
	if got := all(); got != [4]bool{} {
		t.Fatalf("fresh namespace: nft v4/v6, legacy v4/v6 = %v, want none", got)
	}
	dptest.Run(t, "ip", "netns", "exec", l.Node, "iptables-nft", "-t", "nat", "-N", "KPROXY-TEST")
	if got := all(); got != [4]bool{true, false, false, false} {
		t.Errorf("after iptables-nft -t nat -N: %v, want only nft v4", got)
	}
	dptest.Run(t, "ip", "netns", "exec", l.Node, "ip6tables-legacy", "-t", "filter", "-N", "KPROXY-TEST")
	if got := all(); got != [4]bool{true, false, false, true} {
		t.Errorf("after ip6tables-legacy -N: %v, want nft v4 and legacy v6", got)
	}
}
