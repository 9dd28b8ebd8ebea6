// Package nfnl writes nf_tables netlink transactions: a batch of messages
// (tables, chains, rules) that the kernel applies atomically, sent on one
// socket with one acknowledgement. It knows the wire format (netlink and
// nfgenmsg headers, attributes, nesting), not what the messages mean; the
// dataplanes encode their own objects with it.
//
// Both dataplanes write their transactions with Batch; Dump and Message
// serve their reads.
package nfnl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

const (
	subsysNFTables = 10
	nlmsgHdrLen    = 16
	nfgenHdrLen    = 4
)

// Batch is one transaction being written. Every message names its table
// itself, so one batch may span tables of one family.
//
// The batch grows by chunks of about ChunkBytes, sealed at message
// boundaries and sent together with one sendmsg: a large batch (tens of
// MB at 10k Services) is never copied to grow, and a Pool hands the chunks
// of a sent batch to the next one, as fresh pages are expensive.
type Batch struct {
	chunks [][]byte
	buf    []byte
	pool   *Pool
	fam    byte
	seq    uint32
	// last is the offset of the last message header in chunk lastChunk
	// (len(chunks): in buf), for the ack flag.
	last      int
	lastChunk int
	hasMsg    bool
	closed    bool // Close ran; ackSeq is the acknowledged message
	ackSeq    uint32
}

const (
	// ChunkBytes is the size at which a finished message seals a chunk.
	ChunkBytes = 1 << 20
	// ChunkCap is every chunk's capacity: room for the message that
	// crosses ChunkBytes (no message is near 64 KiB).
	ChunkCap = ChunkBytes + 64<<10
)

// Pool keeps the chunks of sent batches for later batches. Its zero value
// is ready; a nil *Pool allocates every chunk.
type Pool struct {
	mu   sync.Mutex
	free [][]byte
}

// Get returns an empty chunk of capacity ChunkCap.
func (p *Pool) Get() []byte {
	if p != nil {
		p.mu.Lock()
		defer p.mu.Unlock()
		if n := len(p.free); n > 0 {
			c := p.free[n-1]
			p.free = p.free[:n-1]
			return c[:0]
		}
	}
	return make([]byte, 0, ChunkCap)
}

// Len is the number of chunks the pool holds.
func (p *Pool) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.free)
}

// Put takes back chunks (others than ChunkCap-sized ones are dropped).
func (p *Pool) Put(chunks [][]byte) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range chunks {
		if cap(c) == ChunkCap {
			p.free = append(p.free, c)
		}
	}
}

// NewBatch starts a batch for family fam (unix.NFPROTO_IPV4 or
// unix.NFPROTO_IPV6) whose chunks come from pool. Without a pool, sizeHint
// (the bytes expected) sizes the first chunk, so that a small batch does
// not take a whole one.
func NewBatch(fam byte, pool *Pool, sizeHint int) *Batch {
	var buf []byte
	if pool == nil && sizeHint < ChunkCap {
		buf = make([]byte, 0, max(sizeHint, 256))
	} else {
		buf = pool.Get()
	}
	b := &Batch{buf: buf, pool: pool, fam: fam, seq: 1}
	b.header(unix.NFNL_MSG_BATCH_BEGIN, unix.NLM_F_REQUEST, unix.AF_UNSPEC)
	binary.BigEndian.PutUint16(b.buf[len(b.buf)-2:], subsysNFTables)
	b.Finish(0)
	return b
}

// Len is the number of bytes written so far.
func (b *Batch) Len() int {
	n := len(b.buf)
	for _, c := range b.chunks {
		n += len(c)
	}
	return n
}

// Empty reports whether the batch holds no message.
func (b *Batch) Empty() bool { return !b.hasMsg }

// Fam is the batch's family.
func (b *Batch) Fam() byte { return b.fam }

// Off is the offset of the next byte in the chunk being written: what Msg
// and Nest return are offsets of the same kind (a chunk is sealed only when
// a message is finished).
func (b *Batch) Off() int { return len(b.buf) }

// Tail returns the bytes written in the current chunk since offset off.
func (b *Batch) Tail(off int) []byte { return b.buf[off:] }

func (b *Batch) header(typ uint16, flags uint16, fam byte) int {
	start := len(b.buf)
	b.buf = AppendHeader(b.buf, typ, flags, b.seq, fam)
	b.seq++
	return start
}

// AppendHeader appends a netlink header (length 0, to be filled in when the
// message is complete) and an nfgenmsg header of family fam.
func AppendHeader(buf []byte, typ, flags uint16, seq uint32, fam byte) []byte {
	buf = binary.NativeEndian.AppendUint32(buf, 0)
	buf = binary.NativeEndian.AppendUint16(buf, typ)
	buf = binary.NativeEndian.AppendUint16(buf, flags)
	buf = binary.NativeEndian.AppendUint32(buf, seq)
	buf = binary.NativeEndian.AppendUint32(buf, 0)
	return append(buf, fam, 0, 0, 0)
}

// Msg starts an nf_tables message of type typ (unix.NFT_MSG_*). Append
// its attributes, then call Finish with the returned offset. Error reports
// name a message from its bytes (type, then its string attributes after
// the first, the table: "add rule to nat KUBE-SVC-…"), so the batch keeps
// no description per message.
func (b *Batch) Msg(typ uint16, flags uint16) int {
	start := b.header(subsysNFTables<<8|typ, unix.NLM_F_REQUEST|flags, b.fam)
	b.last, b.lastChunk, b.hasMsg = start, len(b.chunks), true
	return start
}

// requestSeq numbers every request made with Message.
const requestSeq = 1

// Message returns one nf_tables request of type typ outside a batch (a
// dump or a query), its attributes written by attrs (may be nil).
func Message(typ, flags uint16, fam byte, attrs func(b *Batch)) []byte {
	return SubsysMessage(subsysNFTables, typ, flags, fam, attrs)
}

// SubsysMessage is Message for the nfnetlink subsystem subsys (e.g.
// unix.NFNL_SUBSYS_CTNETLINK, conntrack).
func SubsysMessage(subsys byte, typ, flags uint16, fam byte, attrs func(b *Batch)) []byte {
	b := &Batch{buf: make([]byte, 0, 256), fam: fam, seq: requestSeq}
	start := b.header(uint16(subsys)<<8|typ, unix.NLM_F_REQUEST|flags, fam)
	if attrs != nil {
		attrs(b)
	}
	b.Finish(start)
	return b.buf
}

// Finish writes the length of the message started at start.
func (b *Batch) Finish(start int) {
	binary.NativeEndian.PutUint32(b.buf[start:], uint32(len(b.buf)-start))
	if len(b.buf) >= ChunkBytes {
		b.chunks = append(b.chunks, b.buf)
		b.buf = b.pool.Get()
	}
}

// Attr appends one attribute, padded to 4 bytes.
func (b *Batch) Attr(typ uint16, data []byte) { b.buf = AppendAttr(b.buf, typ, data) }

// AttrBE32 appends a big-endian 32-bit attribute.
func (b *Batch) AttrBE32(typ uint16, v uint32) { b.buf = AppendAttrBE32(b.buf, typ, v) }

// AttrStr appends a NUL-terminated string attribute.
func (b *Batch) AttrStr(typ uint16, s string) { b.buf = AppendAttrStr(b.buf, typ, s) }

// AppendAttr appends one attribute to buf, padded to 4 bytes.
func AppendAttr(buf []byte, typ uint16, data []byte) []byte {
	buf = binary.NativeEndian.AppendUint16(buf, uint16(4+len(data)))
	buf = binary.NativeEndian.AppendUint16(buf, typ)
	return pad(append(buf, data...))
}

// AppendAttrBE32 appends a big-endian 32-bit attribute to buf.
func AppendAttrBE32(buf []byte, typ uint16, v uint32) []byte {
	buf = binary.NativeEndian.AppendUint16(buf, 8)
	buf = binary.NativeEndian.AppendUint16(buf, typ)
	return binary.BigEndian.AppendUint32(buf, v)
}

// AppendAttrStr appends a NUL-terminated string attribute to buf.
func AppendAttrStr(buf []byte, typ uint16, s string) []byte {
	buf = binary.NativeEndian.AppendUint16(buf, uint16(4+len(s)+1))
	buf = binary.NativeEndian.AppendUint16(buf, typ)
	buf = append(buf, s...)
	return pad(append(buf, 0))
}

func pad(buf []byte) []byte {
	for len(buf)%4 != 0 {
		buf = append(buf, 0)
	}
	return buf
}

// AttrZero appends an attribute of n zero bytes whose first bytes are
// data: the fixed-size C structs of xtables matches and targets.
func (b *Batch) AttrZero(typ uint16, n int, data func(p []byte)) {
	b.buf = binary.NativeEndian.AppendUint16(b.buf, uint16(4+n))
	b.buf = binary.NativeEndian.AppendUint16(b.buf, typ)
	start := len(b.buf)
	b.buf = append(b.buf, make([]byte, n)...)
	if data != nil {
		data(b.buf[start : start+n])
	}
	b.buf = pad(b.buf)
}

// Value appends a nested attribute typ holding NFTA_DATA_VALUE data.
func (b *Batch) Value(typ uint16, data []byte) {
	n := b.Nest(typ)
	b.Attr(unix.NFTA_DATA_VALUE, data)
	b.End(n)
}

// Nest opens a nested attribute; close it with End.
func (b *Batch) Nest(typ uint16) int {
	var start int
	b.buf, start = AppendNest(b.buf, typ)
	return start
}

// End closes the nested attribute opened at start.
func (b *Batch) End(start int) { EndNest(b.buf, start) }

// Verdict writes an immediate expression's destination (the verdict
// register) and data: verdict code, and chain for a jump or goto.
func (b *Batch) Verdict(code int32, chain string) {
	b.AttrBE32(unix.NFTA_IMMEDIATE_DREG, unix.NFT_REG_VERDICT)
	d := b.Nest(unix.NFTA_IMMEDIATE_DATA)
	v := b.Nest(unix.NFTA_DATA_VERDICT)
	b.AttrBE32(unix.NFTA_VERDICT_CODE, uint32(code))
	if chain != "" {
		b.AttrStr(unix.NFTA_VERDICT_CHAIN, chain)
	}
	b.End(v)
	b.End(d)
}

// AppendNest opens a nested attribute in buf at the returned offset;
// close it with EndNest.
func AppendNest(buf []byte, typ uint16) ([]byte, int) {
	start := len(buf)
	buf = append(buf, 0, 0, 0, 0)
	binary.NativeEndian.PutUint16(buf[start+2:], typ|unix.NLA_F_NESTED)
	return buf, start
}

// EndNest writes the length of the nested attribute opened at start.
func EndNest(buf []byte, start int) {
	binary.NativeEndian.PutUint16(buf[start:], uint16(len(buf)-start))
}

// Error is the kernel's rejection of one message of a batch.
type Error struct {
	Errno syscall.Errno
	What  string // the message's description
	Msg   string // the kernel's extended ack message, if any
}

func (e *Error) Error() string {
	s := fmt.Sprintf("%s: %v", e.What, e.Errno)
	if e.Msg != "" {
		s += " (" + e.Msg + ")"
	}
	return s
}

func (e *Error) Unwrap() error { return e.Errno }

// Send closes the batch, sends it on a kept socket of the calling thread's
// network namespace (WithSocket; a new one only when none is idle) and waits for the kernel's verdict: nil, or the
// errors of the messages it rejected (then nothing of the batch applied).
// The batch cannot be used afterwards: its chunks go back to its pool.
func (b *Batch) Send() error { return b.SendFrom(nil) }

// SendFrom is Send, showing opened (when set) the socket first: a
// monitor can then tell its own process's changes by the socket's port.
func (b *Batch) SendFrom(opened func(fd int)) error {
	parts, ackSeq, empty := b.Close()
	if empty {
		return nil
	}
	defer b.Release()
	return Transmit(parts, ackSeq, b.describe, opened)
}

// Close ends the batch (the last message asks for the acknowledgement,
// whose sequence number is ackSeq) and returns its parts, in order; empty
// when it holds no message. Nothing can be added afterwards.
func (b *Batch) Close() (parts [][]byte, ackSeq uint32, empty bool) {
	if !b.hasMsg {
		return nil, 0, true
	}
	if b.closed {
		return b.chunks, b.ackSeq, false
	}
	last := b.buf
	if b.lastChunk < len(b.chunks) {
		last = b.chunks[b.lastChunk]
	}
	flags := binary.NativeEndian.Uint16(last[b.last+6:])
	binary.NativeEndian.PutUint16(last[b.last+6:], flags|unix.NLM_F_ACK)
	ackSeq = binary.NativeEndian.Uint32(last[b.last+8:])
	end := b.header(unix.NFNL_MSG_BATCH_END, unix.NLM_F_REQUEST, unix.AF_UNSPEC)
	binary.BigEndian.PutUint16(b.buf[len(b.buf)-2:], subsysNFTables)
	binary.NativeEndian.PutUint32(b.buf[end:], uint32(len(b.buf)-end))
	b.chunks = append(b.chunks, b.buf)
	b.buf = nil
	b.closed, b.ackSeq = true, ackSeq
	return b.chunks, ackSeq, false
}

// Transmit sends the parts of a closed batch (ackSeq: the sequence number
// of its message that asks for the acknowledgement) in one sendmsg on a
// socket of the calling thread's network namespace (WithSocket), and
// waits for the kernel's verdict; opened, when set, sees the socket first.
func Transmit(parts [][]byte, ackSeq uint32, describe func(seq uint32) string, opened func(fd int)) error {
	size := 0
	for _, p := range parts {
		size += len(p)
	}
	return WithSocket(func(fd int) error {
		if err := setSendBuffer(fd, size); err != nil {
			return err
		}
		if opened != nil {
			opened(fd)
		}
		if _, err := unix.SendmsgBuffers(fd, parts, nil, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}, 0); err != nil {
			return fmt.Errorf("sending netlink batch of %d bytes: %w", size, err)
		}
		return ReadAck(fd, ackSeq, describe)
	})
}

// OpenSocket opens a netfilter netlink socket able to take a batch of size
// bytes in one message (the kernel takes a batch only whole), with
// extended acks and a 30 s receive timeout. Most callers want WithSocket.
func OpenSocket(size int) (int, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return -1, fmt.Errorf("opening netfilter netlink socket: %w", err)
	}
	opts := []struct{ level, opt, val int }{
		{unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, max(size+64<<10, 256<<10)},
		{unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 4 << 20},
		{unix.SOL_NETLINK, unix.NETLINK_CAP_ACK, 1},
		{unix.SOL_NETLINK, unix.NETLINK_EXT_ACK, 1},
	}
	for _, o := range opts {
		if err := unix.SetsockoptInt(fd, o.level, o.opt, o.val); err != nil && o.opt == unix.SO_SNDBUFFORCE {
			unix.Close(fd)
			return -1, fmt.Errorf("sizing netlink send buffer to %d bytes: %w", o.val, err)
		}
	}
	tv := unix.Timeval{Sec: 30}
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("binding netlink socket: %w", err)
	}
	return fd, nil
}

// Release gives the batch's chunks back to its pool (Send does it); the
// batch is unusable afterwards.
func (b *Batch) Release() {
	if b.buf != nil {
		b.chunks = append(b.chunks, b.buf)
	}
	b.pool.Put(b.chunks)
	b.chunks, b.buf = nil, nil
}

// describe names the message with sequence number seq, found in the
// batch's bytes.
func (b *Batch) describe(seq uint32) string {
	if seq <= 1 {
		return "netlink batch" // the batch-begin message: the whole batch
	}
	parts := b.chunks
	if b.buf != nil {
		parts = append(parts[:len(parts):len(parts)], b.buf)
	}
	// Sequence numbers rise through the parts, and a part starts with a
	// whole message: scan only the part that holds seq (a rejected full
	// sync may report thousands of messages of a 150 MB batch).
	i := sort.Search(len(parts), func(i int) bool {
		return len(parts[i]) >= nlmsgHdrLen && binary.NativeEndian.Uint32(parts[i][8:]) > seq
	}) - 1
	if i < 0 {
		return "netlink batch"
	}
	var found []byte
	if eachMsg(parts[i], func(m []byte) bool {
		if binary.NativeEndian.Uint32(m[8:]) == seq {
			found = m
			return true
		}
		return false
	}) {
		return describeMsg(found)
	}
	return "netlink batch"
}

// msgNames are the message types batches send, for error reports.
var msgNames = map[uint16]string{
	unix.NFT_MSG_NEWTABLE: "add table", unix.NFT_MSG_DELTABLE: "delete table",
	unix.NFT_MSG_NEWCHAIN: "add chain", unix.NFT_MSG_DELCHAIN: "delete chain",
	unix.NFT_MSG_NEWRULE: "add rule to", unix.NFT_MSG_DELRULE: "flush chain",
	unix.NFT_MSG_NEWSET: "add set", unix.NFT_MSG_DELSET: "delete set",
	unix.NFT_MSG_NEWSETELEM: "add elements to", unix.NFT_MSG_DELSETELEM: "delete elements of",
}

// describeMsg names a message by its type and its leading string
// attributes (table first, then the object: chain, set or table name).
func describeMsg(m []byte) string {
	if len(m) < nlmsgHdrLen+nfgenHdrLen {
		return "netlink batch"
	}
	typ := binary.NativeEndian.Uint16(m[4:]) & 0xff
	what := msgNames[typ]
	if what == "" {
		what = fmt.Sprintf("message type %d", typ)
	}
	var names []string
	EachAttr(m[nlmsgHdrLen+nfgenHdrLen:], func(_ uint16, data []byte) {
		if len(names) < 2 && len(data) > 1 && data[len(data)-1] == 0 && printable(data[:len(data)-1]) {
			names = append(names, string(data[:len(data)-1]))
		}
	})
	if len(names) > 0 {
		what += " " + strings.Join(names, "/")
	}
	return what
}

func printable(b []byte) bool {
	for _, c := range b {
		if c < 0x20 || c > 0x7e {
			return false
		}
	}
	return true
}

// ReadAck reads a batch's replies from fd until the acknowledgement of
// message ackSeq; every error reply before it is a message the kernel
// rejected (and with it the batch), named by describe.
func ReadAck(fd int, ackSeq uint32, describe func(seq uint32) string) error {
	rb := make([]byte, 32<<10)
	var errs []error
	for range 1 << 20 {
		n, _, err := unix.Recvfrom(fd, rb, 0)
		if err != nil {
			return errors.Join(append(errs, fmt.Errorf("reading netlink replies: %w", err))...)
		}
		done := eachMsg(rb[:n], func(m []byte) bool {
			errno, ok := msgErrno(m)
			if binary.NativeEndian.Uint16(m[4:]) != unix.NLMSG_ERROR || !ok {
				return false
			}
			seq := binary.NativeEndian.Uint32(m[8:])
			if errno != 0 {
				errs = append(errs, &Error{Errno: errno, What: describe(seq), Msg: extAckMsg(m)})
			}
			// An error about the batch-begin message (sequence 1) is the
			// kernel refusing the whole batch: no further reply comes.
			return seq == ackSeq || seq == 1 && errno != 0
		})
		if done {
			return errors.Join(errs...)
		}
	}
	return errors.New("no acknowledgement of the netlink batch")
}

// eachMsg calls fn for every whole netlink message in buf until fn
// returns true, and reports whether it did.
func eachMsg(buf []byte, fn func(m []byte) bool) bool {
	for len(buf) >= nlmsgHdrLen {
		l := int(binary.NativeEndian.Uint32(buf))
		if l < nlmsgHdrLen || l > len(buf) {
			return false
		}
		if fn(buf[:l]) {
			return true
		}
		buf = buf[min((l+3)&^3, len(buf)):]
	}
	return false
}

// extAckMsg returns NLMSGERR_ATTR_MSG of an error reply sent with
// NETLINK_CAP_ACK (no copy of the request), or "".
func extAckMsg(m []byte) string {
	off := nlmsgHdrLen + 4 + nlmsgHdrLen
	for off+4 <= len(m) {
		l := int(binary.NativeEndian.Uint16(m[off:]))
		typ := binary.NativeEndian.Uint16(m[off+2:])
		if l < 4 || off+l > len(m) {
			break
		}
		if typ == unix.NLMSGERR_ATTR_MSG {
			s := m[off+4 : off+l]
			for len(s) > 0 && s[len(s)-1] == 0 {
				s = s[:len(s)-1]
			}
			return string(s)
		}
		off += (l + 3) &^ 3
	}
	return ""
}
