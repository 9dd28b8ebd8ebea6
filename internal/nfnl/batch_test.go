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
	b := NewBatch(unix.NFPROTO_IPV4, pool)
	const msgs = 5000
	name := strings.Repeat("x", 400)
	for i := range msgs {
		m := b.Msg(unix.NFT_MSG_NEWCHAIN, unix.NLM_F_CREATE, "add chain")
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
	b.release()
	if len(pool.free) != chunks {
		t.Errorf("pool got %d chunks back, want %d", len(pool.free), chunks)
	}
	if c := NewBatch(unix.NFPROTO_IPV4, pool); len(pool.free) != chunks-1 || cap(c.buf) != ChunkCap {
		t.Errorf("a new batch did not take a pooled chunk")
	}
}

func TestErrorNamesTheMessage(t *testing.T) {
	e := &Error{Errno: unix.ENOENT, What: "add rule to nat/KUBE-SVC-X", Msg: "chain not found"}
	if got := e.Error(); got != "add rule to nat/KUBE-SVC-X: no such file or directory (chain not found)" {
		t.Errorf("got %q", got)
	}
}
