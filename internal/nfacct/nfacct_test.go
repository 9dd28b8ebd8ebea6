package nfacct

import (
	"encoding/binary"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/internal/nfnl"
)

func TestMessageRejectsBadNames(t *testing.T) {
	for _, name := range []string{"", strings.Repeat("n", MaxNameLen+1)} {
		if _, err := message(msgGet, 0, name); err == nil {
			t.Errorf("name of %d bytes accepted", len(name))
		}
	}
	msg, err := message(msgGet, 0, strings.Repeat("n", MaxNameLen))
	if err != nil {
		t.Fatal(err)
	}
	if typ := binary.NativeEndian.Uint16(msg[4:]); typ != subsysAcct<<8|msgGet {
		t.Errorf("message type %#x, want %#x", typ, subsysAcct<<8|msgGet)
	}
}

func TestPacketsOf(t *testing.T) {
	var attrs []byte
	attrs = nfnl.AppendAttrStr(attrs, attrName, "c")
	attrs = nfnl.AppendAttr(attrs, attrPackets, binary.BigEndian.AppendUint64(nil, 1<<40+3))
	attrs = nfnl.AppendAttr(attrs, 3, binary.BigEndian.AppendUint64(nil, 99)) // bytes
	if n, err := packetsOf(attrs); err != nil || n != 1<<40+3 {
		t.Errorf("packetsOf = %d, %v; want %d", n, err, uint64(1<<40+3))
	}
	if _, err := packetsOf(nfnl.AppendAttrStr(nil, attrName, "c")); err == nil {
		t.Error("a reply without NFACCT_PKTS read as a count")
	}
}
