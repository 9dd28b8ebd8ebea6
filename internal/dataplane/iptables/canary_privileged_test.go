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
