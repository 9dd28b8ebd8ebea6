package nfnl_test

import (
	"errors"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kproxy/kproxy/internal/dataplane/dptest"
	"github.com/kproxy/kproxy/internal/nfnl"
)

// TestPrivilegedSocketReuse: a namespace's socket is reused by later
// calls there and by no other namespace's, a reply left unread does not
// reach the next user, and CloseIdle drops the kept sockets.
func TestPrivilegedSocketReuse(t *testing.T) {
	l := dptest.NewLab(t, "nfnl")
	used := func(ns string) int {
		fd := -1
		l.In(ns, func() {
			if err := nfnl.WithSocket(func(f int) error { fd = f; return nil }); err != nil {
				t.Fatal(err)
			}
		})
		return fd
	}
	first := used(l.Node)
	if again := used(l.Node); again != first {
		t.Errorf("the node's second call used socket %d, want the kept %d", again, first)
	}
	if other := used(l.Pod); other == first {
		t.Errorf("the pod namespace got the node's socket %d", other)
	}
	l.In(l.Node, func() {
		b := nfnl.NewBatch(unix.NFPROTO_IPV4, nil, 0)
		m := b.Msg(unix.NFT_MSG_NEWTABLE, unix.NLM_F_CREATE)
		b.AttrStr(unix.NFTA_TABLE_NAME, "nfnltest")
		b.Finish(m)
		m = b.Msg(unix.NFT_MSG_NEWCHAIN, unix.NLM_F_CREATE)
		b.AttrStr(unix.NFTA_CHAIN_TABLE, "nfnltest")
		b.AttrStr(unix.NFTA_CHAIN_NAME, "c1")
		b.Finish(m)
		if err := b.Send(); err != nil {
			t.Fatal(err)
		}
		getChain := func(chain string) func(b *nfnl.Batch) {
			return func(b *nfnl.Batch) {
				b.AttrStr(unix.NFTA_CHAIN_TABLE, "nfnltest")
				b.AttrStr(unix.NFTA_CHAIN_NAME, chain)
			}
		}
		// Leave an error reply (ENOENT, same sequence number as every
		// request) unread on the kept socket: the next user must not
		// take it for its own.
		err := nfnl.WithSocket(func(fd int) error {
			return unix.Sendto(fd, nfnl.Message(unix.NFT_MSG_GETCHAIN, 0, unix.NFPROTO_IPV4, getChain("c2")), 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
		})
		if err != nil {
			t.Fatal(err)
		}
		if attrs, err := nfnl.Get(unix.NFPROTO_IPV4, unix.NFT_MSG_GETCHAIN, getChain("c1")); err != nil || !strings.Contains(string(attrs), "c1\x00") {
			t.Errorf("get chain c1 after an unread reply: %q, %v", attrs, err)
		}
		if _, err := nfnl.Get(unix.NFPROTO_IPV4, unix.NFT_MSG_GETCHAIN, getChain("c2")); !errors.Is(err, unix.ENOENT) {
			t.Errorf("get a missing chain: %v, want ENOENT", err)
		}
		names, err := nfnl.ChainNames(unix.NFPROTO_IPV4, "nfnltest")
		if err != nil || len(names) != 1 || names[0] != "c1" {
			t.Errorf("chains %q, %v; want [c1]", names, err)
		}
		if names, err := nfnl.ChainNames(unix.NFPROTO_IPV4, "missing"); err != nil || names != nil {
			t.Errorf("chains of a missing table: %q, %v", names, err)
		}
	})
	if again := used(l.Node); again != first {
		t.Errorf("after a batch and dumps the node used socket %d, want the kept %d", again, first)
	}
	if n := nfnl.IdleSockets(); n == 0 {
		t.Error("no socket kept")
	}
	nfnl.CloseIdle()
	if n := nfnl.IdleSockets(); n != 0 {
		t.Errorf("%d sockets kept after CloseIdle", n)
	}
}
