package nfnl

import (
	"encoding/binary"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// A batch larger than a chunk is sealed only at message boundaries, and
// its chunks read back as the same stream of whole messages.
func TestBatchChunksAtMessageBoundaries(t *testing.T) {
	pool := &Pool{}
	b := NewBatch(unix.NFPROTO_IPV4, pool, 0)
	const msgs = 5000
	name := strings.Repeat("x", 400)
	for i := range msgs {
		m := b.Msg(unix.NFT_MSG_NEWCHAIN, unix.NLM_F_CREATE)
		b.AttrStr(unix.NFTA_CHAIN_TABLE, "nat")
		n := b.Nest(unix.NFTA_CHAIN_HOOK)
		b.AttrBE32(unix.NFTA_HOOK_HOOKNUM, uint32(i))
		b.End(n)
		b.AttrStr(unix.NFTA_CHAIN_NAME, name)
		b.Finish(m)
	}
	if len(b.chunks) < 2 {
		t.Fatalf("%d bytes in %d sealed chunks; the test needs several", b.Len(), len(b.chunks))
	}
	total := 0
	seen := 0
	for _, c := range append(b.chunks, b.buf) {
		total += len(c)
		for off := 0; off < len(c); {
			l := int(binary.NativeEndian.Uint32(c[off:]))
			if l < nlmsgHdrLen || off+l > len(c) {
				t.Fatalf("a message at offset %d of a chunk is cut (length %d, chunk %d)", off, l, len(c))
			}
			seen++
			off += (l + 3) &^ 3
		}
	}
	if seen != msgs+1 || total != b.Len() {
		t.Fatalf("read %d messages in %d bytes, want %d in %d", seen, total, msgs+1, b.Len())
	}
	if b.lastChunk != len(b.chunks) && b.lastChunk != len(b.chunks)-1 {
		t.Errorf("last message recorded in chunk %d of %d", b.lastChunk, len(b.chunks))
	}
	chunks := len(b.chunks) + 1
	b.Release()
	if len(pool.free) != chunks {
		t.Errorf("pool got %d chunks back, want %d", len(pool.free), chunks)
	}
	if c := NewBatch(unix.NFPROTO_IPV4, pool, 0); len(pool.free) != chunks-1 || cap(c.buf) != ChunkCap {
		t.Errorf("a new batch did not take a pooled chunk")
	}
}

func TestErrorNamesTheMessage(t *testing.T) {
	e := &Error{Errno: unix.ENOENT, What: "add rule to nat/KUBE-SVC-X", Msg: "chain not found"}
	if got := e.Error(); got != "add rule to nat/KUBE-SVC-X: no such file or directory (chain not found)" {
		t.Errorf("got %q", got)
	}
}

// A rejected message is named from the batch's bytes, in whichever chunk
// it sits.
func TestDescribeFindsTheMessage(t *testing.T) {
	b := NewBatch(unix.NFPROTO_IPV4, &Pool{}, 0)
	m := b.Msg(unix.NFT_MSG_NEWTABLE, unix.NLM_F_CREATE)
	b.AttrStr(unix.NFTA_TABLE_NAME, "nat")
	b.Finish(m)
	long := strings.Repeat("y", 400)
	for range 5000 { // several chunks
		m := b.Msg(unix.NFT_MSG_NEWCHAIN, unix.NLM_F_CREATE)
		b.AttrStr(unix.NFTA_CHAIN_TABLE, "nat")
		b.AttrStr(unix.NFTA_CHAIN_NAME, long)
		b.Finish(m)
	}
	m = b.Msg(unix.NFT_MSG_NEWRULE, unix.NLM_F_CREATE|unix.NLM_F_APPEND)
	b.AttrStr(unix.NFTA_RULE_TABLE, "nat")
	b.AttrStr(unix.NFTA_RULE_CHAIN, "KUBE-SVC-X")
	n := b.Nest(unix.NFTA_RULE_EXPRESSIONS)
	b.AttrStr(unix.NFTA_LIST_ELEM, "counter")
	b.End(n)
	b.Finish(m)
	parts, ackSeq, empty := b.Close()
	if empty || len(parts) < 3 {
		t.Fatalf("%d parts, empty %v; the test needs several chunks", len(parts), empty)
	}
	for seq, want := range map[uint32]string{
		2:          "add table nat",
		3:          "add chain nat/" + long,
		ackSeq:     "add rule to nat/KUBE-SVC-X",
		ackSeq + 5: "netlink batch",
	} {
		if got := b.describe(seq); got != want {
			t.Errorf("message %d: got %q, want %q", seq, got, want)
		}
	}
	b.Release()
}
