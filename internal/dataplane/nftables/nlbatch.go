package nftables

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kproxy/kproxy/internal/nfnl"
)

// nlBatch writes one nfnetlink transaction (batch begin, messages, batch
// end) straight into a byte buffer, the way the nft CLI talks to the kernel
// but without its cache fetch or its parser. The kernel applies a batch
// atomically: every message lands or none does.
//
// Only the last message asks for an acknowledgement; the kernel reports
// errors of any message unasked, so a 100k-message batch costs one reply.
type nlBatch struct {
	// chunks are sealed parts of the batch (whole messages) and buf the
	// part being written: a large batch grows by new chunks, never by
	// copying what is written (at 10k Services the batch has tens of MB).
	chunks [][]byte
	buf    []byte
	fam    byte   // NFPROTO_IPV4 or NFPROTO_IPV6
	table  string // every message is about this table
	seq    uint32
	// setID numbers the sets created in this batch (NFTA_SET_ID).
	setID uint32
	// last is the offset of the last message header in chunk lastChunk
	// (len(chunks): in buf), for the ack flag; hasMsg is false until msg.
	last      int
	lastChunk int
	hasMsg    bool
	// pool, when set, gives the batch its chunks and takes them back
	// (release).
	pool *nfnl.Pool
}

// release gives the batch's chunks back to its pool; the batch is unusable
// afterwards.
func (b *nlBatch) release() {
	if b.pool != nil {
		b.pool.Put(append(b.chunks, b.buf))
	}
	b.chunks, b.buf = nil, nil
}

const (
	nfnlSubsysNFTables = 10
	nlmsgHdrLen        = 16
	nfgenHdrLen        = 4
	// maxListBytes keeps one element list under the 64 KiB attribute limit.
	maxListBytes = 60000
)

// newNLBatch starts a batch; sizeHint is the expected number of bytes.
func newNLBatch(fam byte, table string, sizeHint int) *nlBatch {
	return startNLBatch(&nlBatch{fam: fam, table: table, buf: make([]byte, 0, min(sizeHint, nfnl.ChunkCap))})
}

// newPooledNLBatch starts a batch whose chunks come from pool.
func newPooledNLBatch(fam byte, table string, pool *nfnl.Pool) *nlBatch {
	return startNLBatch(&nlBatch{fam: fam, table: table, buf: pool.Get(), pool: pool})
}

func startNLBatch(b *nlBatch) *nlBatch {
	b.seq = 1
	b.header(unix.NFNL_MSG_BATCH_BEGIN, unix.NLM_F_REQUEST, unix.AF_UNSPEC)
	binary.BigEndian.PutUint16(b.buf[len(b.buf)-2:], nfnlSubsysNFTables)
	b.finish(len(b.buf) - nlmsgHdrLen - nfgenHdrLen)
	return b
}

// header appends a netlink and nfgenmsg header; finish fills in its length.
func (b *nlBatch) header(typ uint16, flags uint16, fam byte) int {
	start := len(b.buf)
	b.buf = nfnl.AppendHeader(b.buf, typ, flags, b.seq, fam)
	b.seq++
	return start
}

func (b *nlBatch) finish(start int) {
	binary.NativeEndian.PutUint32(b.buf[start:], uint32(len(b.buf)-start))
	if len(b.buf) >= nfnl.ChunkBytes {
		b.chunks = append(b.chunks, b.buf)
		b.buf = b.pool.Get()
	}
}

// msg starts an nf_tables message about the table; the caller appends
// attributes (the table attribute comes first) and calls finish.
func (b *nlBatch) msg(typ uint16, flags uint16) int {
	start := b.header(nfnlSubsysNFTables<<8|typ, unix.NLM_F_REQUEST|flags, b.fam)
	b.last, b.lastChunk, b.hasMsg = start, len(b.chunks), true
	return start
}

// msgNames are the message types a batch sends, for error reports.
var msgNames = map[uint16]string{
	unix.NFT_MSG_NEWTABLE: "add table", unix.NFT_MSG_DELTABLE: "delete table",
	unix.NFT_MSG_NEWCHAIN: "add chain", unix.NFT_MSG_DELCHAIN: "delete chain",
	unix.NFT_MSG_NEWRULE: "add rule to chain", unix.NFT_MSG_DELRULE: "flush chain",
	unix.NFT_MSG_NEWSET: "add set", unix.NFT_MSG_DELSET: "delete set",
	unix.NFT_MSG_NEWSETELEM: "add elements to", unix.NFT_MSG_DELSETELEM: "delete elements of",
}

// describe names the message with sequence number seq, found in the
// batch (kept only for error reports, so the batch holds no descriptions).
func (b *nlBatch) describe(seq uint32) string {
	for _, buf := range append(b.chunks[:len(b.chunks):len(b.chunks)], b.buf) {
		for off := 0; off+nlmsgHdrLen+nfgenHdrLen <= len(buf); {
			l := int(binary.NativeEndian.Uint32(buf[off:]))
			if l < nlmsgHdrLen || off+l > len(buf) {
				break
			}
			if binary.NativeEndian.Uint32(buf[off+8:]) == seq {
				return describeMsg(buf[off : off+l])
			}
			off += (l + 3) &^ 3
		}
	}
	return "netlink batch"
}

func describeMsg(m []byte) string {
	typ := binary.NativeEndian.Uint16(m[4:]) & 0xff
	// The object's name is the second attribute of every message.
	var names []string
	eachAttr(m[nlmsgHdrLen+nfgenHdrLen:], func(_ uint16, data []byte) {
		if len(names) < 2 && len(data) > 0 && data[len(data)-1] == 0 {
			names = append(names, string(data[:len(data)-1]))
		}
	})
	return strings.TrimSpace(msgNames[typ] + " " + strings.Join(names[min(1, len(names)):], ""))
}

// attr appends one attribute, padded to 4 bytes.
func (b *nlBatch) attr(typ uint16, data []byte) { b.buf = nfnl.AppendAttr(b.buf, typ, data) }

// attrU32 appends a big-endian 32-bit attribute.
func (b *nlBatch) attrU32(typ uint16, v uint32) { b.buf = nfnl.AppendAttrBE32(b.buf, typ, v) }

// attrStr appends a NUL-terminated string attribute, padded.
func (b *nlBatch) attrStr(typ uint16, s string) { b.buf = nfnl.AppendAttrStr(b.buf, typ, s) }

// value appends a nested NFTA_DATA_VALUE holding data.
func (b *nlBatch) value(typ uint16, data []byte) {
	n := b.nest(typ)
	b.attr(unix.NFTA_DATA_VALUE, data)
	b.end(n)
}

// nest opens a nested attribute; close it with end.
func (b *nlBatch) nest(typ uint16) int {
	var start int
	b.buf, start = nfnl.AppendNest(b.buf, typ)
	return start
}

func (b *nlBatch) end(start int) { nfnl.EndNest(b.buf, start) }

func be32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

func be64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

// bytes closes the batch and returns its parts, the last message asking for
// an acknowledgement; ackSeq is that message's sequence number.
func (b *nlBatch) bytes() (out [][]byte, ackSeq uint32, empty bool) {
	if !b.hasMsg {
		return nil, 0, true
	}
	last := b.buf
	if b.lastChunk < len(b.chunks) {
		last = b.chunks[b.lastChunk]
	}
	flags := binary.NativeEndian.Uint16(last[b.last+6:])
	binary.NativeEndian.PutUint16(last[b.last+6:], flags|unix.NLM_F_ACK)
	ackSeq = binary.NativeEndian.Uint32(last[b.last+8:])
	start := b.header(unix.NFNL_MSG_BATCH_END, unix.NLM_F_REQUEST, unix.AF_UNSPEC)
	binary.BigEndian.PutUint16(b.buf[len(b.buf)-2:], nfnlSubsysNFTables)
	binary.NativeEndian.PutUint32(b.buf[start:], uint32(len(b.buf)-start))
	return append(b.chunks, b.buf), ackSeq, false
}

// send sends the batch on a new socket in the calling thread's network
// namespace and waits for the kernel's verdict. The parts go in one
// sendmsg: the kernel takes a batch only as one message.
func (b *nlBatch) send() error {
	bufs, ackSeq, empty := b.bytes()
	if empty {
		return nil
	}
	return nfnl.Transmit(bufs, ackSeq, b.describe, recordOwnPort)
}

// waitAck reads replies until the acknowledgement of ackSeq; any error
// reply before it means the kernel rejected (and rolled back) the batch.
func (b *nlBatch) waitAck(fd int, ackSeq uint32) error {
	return nfnl.ReadAck(fd, ackSeq, b.describe)
}

// rulesetGeneration returns the kernel's nftables generation number, which
// every committed transaction (of anyone) increments.
func rulesetGeneration() (uint32, error) {
	fd, err := nfnl.OpenSocket(0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	b := &nlBatch{seq: 1}
	start := b.header(nfnlSubsysNFTables<<8|unix.NFT_MSG_GETGEN, unix.NLM_F_REQUEST|unix.NLM_F_ACK, unix.AF_UNSPEC)
	b.finish(start)
	if err := unix.Sendto(fd, b.buf, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, fmt.Errorf("asking for the nftables generation: %w", err)
	}
	rb := make([]byte, 8192)
	n, _, err := unix.Recvfrom(fd, rb, 0)
	if err != nil {
		return 0, fmt.Errorf("reading the nftables generation: %w", err)
	}
	m := rb[:n]
	if len(m) < nlmsgHdrLen+nfgenHdrLen || binary.NativeEndian.Uint16(m[4:]) != nfnlSubsysNFTables<<8|unix.NFT_MSG_NEWGEN {
		return 0, errors.New("unexpected reply to an nftables generation request")
	}
	for off := nlmsgHdrLen + nfgenHdrLen; off+8 <= len(m); {
		l := int(binary.NativeEndian.Uint16(m[off:]))
		if l < 4 {
			break
		}
		if binary.NativeEndian.Uint16(m[off+2:])&^unix.NLA_F_NESTED == unix.NFTA_GEN_ID {
			return binary.BigEndian.Uint32(m[off+4:]), nil
		}
		off += (l + 3) &^ 3
	}
	return 0, errors.New("no generation id in the nftables reply")
}
