package iptables

import (
	"testing"

	"github.com/kproxy/kproxy/internal/dataplane/dptest"
	"github.com/kproxy/kproxy/internal/model"
)

// TestPrivilegedNetlinkCanary: the netlink canary check sees the chain and
// its rule, and notices a flush of the table and a missing table.
func TestPrivilegedNetlinkCanary(t *testing.T) {
	l := dptest.NewLab(t, labPrefix)
	check := func(table string) (ok bool) {
		l.In(l.Node, func() { ok = netlinkCanaryOK(model.IPv4, table) })
		return ok
	}
	if check(tableNAT) {
		t.Fatal("canary reported before any rule exists")
	}
	text := restoreText(&tableWrite{table: tableNAT, chains: []*Chain{canaryChain()}})
	dptest.Run(t, "sh", "-c", "printf '"+text+"' | ip netns exec "+l.Node+" iptables-nft-restore --noflush")
	if !check(tableNAT) {
		t.Fatal("canary not seen after restore")
	}
	dptest.Run(t, "ip", "netns", "exec", l.Node, "iptables-nft", "-t", "nat", "-F")
	if check(tableNAT) {
		t.Error("flush of nat not noticed")
	}
	if check(tableMangle) {
		t.Error("canary reported in a table kproxy never wrote")
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
