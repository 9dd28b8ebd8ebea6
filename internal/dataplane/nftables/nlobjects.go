package nftables

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"

	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"
)

// This file encodes nftables objects (table, chains, rules, sets, elements)
// as messages of an nlBatch. Expressions are marshalled by
// github.com/google/nftables/expr; everything else is written here.

const createFlags = unix.NLM_F_CREATE

// Constants golang.org/x/sys/unix lacks.
const (
	nftaTableUserdata = 6 // NFTA_TABLE_USERDATA
	udataTableComment = 0 // NFTNL_UDATA_TABLE_COMMENT
	nfAccept          = 1 // NF_ACCEPT
	icmpPortUnreach   = 3 // ICMP_PORT_UNREACH
	icmp6PortUnreach  = 4 // ICMPV6_PORT_UNREACH
)

func (b *nlBatch) addTable(comment string) {
	m := b.Msg(unix.NFT_MSG_NEWTABLE, createFlags)
	b.AttrStr(unix.NFTA_TABLE_NAME, b.table)
	b.Attr(unix.NFTA_TABLE_FLAGS, be32(0))
	if comment != "" {
		b.Attr(nftaTableUserdata, userdata.AppendString(nil, udataTableComment, comment))
	}
	b.Finish(m)
}

// delTable deletes the table with everything in it: with an addTable
// before it (so that it exists) and one after it, a batch replaces the
// table atomically.
func (b *nlBatch) delTable() {
	m := b.Msg(unix.NFT_MSG_DELTABLE, 0)
	b.AttrStr(unix.NFTA_TABLE_NAME, b.table)
	b.Finish(m)
}

var hookNums = map[knftables.BaseChainHook]uint32{
	knftables.PreroutingHook:  unix.NF_INET_PRE_ROUTING,
	knftables.InputHook:       unix.NF_INET_LOCAL_IN,
	knftables.ForwardHook:     unix.NF_INET_FORWARD,
	knftables.OutputHook:      unix.NF_INET_LOCAL_OUT,
	knftables.PostroutingHook: unix.NF_INET_POST_ROUTING,
}

// priorities are the named priorities render uses, with offsets.
var priorities = map[knftables.BaseChainPriority]int32{
	knftables.DNATPriority + "-10": -110,
	knftables.DNATPriority:         -100,
	knftables.FilterPriority:       0,
	knftables.SNATPriority:         100,
}

// addChain adds a chain (a base chain when c.Hook is set).
func (b *nlBatch) addChain(c *knftables.Chain) error {
	m := b.Msg(unix.NFT_MSG_NEWCHAIN, createFlags)
	b.AttrStr(unix.NFTA_CHAIN_TABLE, b.table)
	b.AttrStr(unix.NFTA_CHAIN_NAME, c.Name)
	if c.Hook != nil {
		hook, ok1 := hookNums[*c.Hook]
		prio, ok2 := priorities[*c.Priority]
		if !ok1 || !ok2 || c.Type == nil {
			return fmt.Errorf("base chain %s: unsupported hook or priority", c.Name)
		}
		h := b.Nest(unix.NFTA_CHAIN_HOOK)
		b.Attr(unix.NFTA_HOOK_HOOKNUM, be32(hook))
		b.Attr(unix.NFTA_HOOK_PRIORITY, be32(uint32(prio)))
		b.End(h)
		b.Attr(unix.NFTA_CHAIN_POLICY, be32(nfAccept))
		b.AttrStr(unix.NFTA_CHAIN_TYPE, string(*c.Type))
	}
	b.Finish(m)
	return nil
}

func (b *nlBatch) delChain(name string) {
	m := b.Msg(unix.NFT_MSG_DELCHAIN, 0)
	b.AttrStr(unix.NFTA_CHAIN_TABLE, b.table)
	b.AttrStr(unix.NFTA_CHAIN_NAME, name)
	b.Finish(m)
}

// flushChain deletes every rule of a chain.
func (b *nlBatch) flushChain(name string) {
	m := b.Msg(unix.NFT_MSG_DELRULE, 0)
	b.AttrStr(unix.NFTA_RULE_TABLE, b.table)
	b.AttrStr(unix.NFTA_RULE_CHAIN, name)
	b.Finish(m)
}

// addRule appends a rule made of exprs to a chain.
func (b *nlBatch) addRule(chain string, r rule, exprs []expr.Any) error {
	m := b.Msg(unix.NFT_MSG_NEWRULE, createFlags|unix.NLM_F_APPEND)
	b.AttrStr(unix.NFTA_RULE_TABLE, b.table)
	b.AttrStr(unix.NFTA_RULE_CHAIN, chain)
	l := b.Nest(unix.NFTA_RULE_EXPRESSIONS)
	for _, e := range exprs {
		if err := b.appendExpr(e); err != nil {
			return fmt.Errorf("rule %q: %w", r, err)
		}
	}
	b.End(l)
	b.Finish(m)
	return nil
}

// nft's data type numbers and sizes of the field types render uses.
var fieldTypes = map[string]struct{ id, size uint32 }{
	"verdict":      {1, 0},
	"numgen":       {4, 4}, // integer, host byte order
	"ipv4_addr":    {7, 4},
	"ipv6_addr":    {8, 16},
	"inet_proto":   {12, 1},
	"inet_service": {13, 2},
	"mark":         {19, 4}, // host byte order
}

// typeOf returns nft's type number (concatenations take 6 bits per field)
// and the key length of fields.
func typeOf(fields []string) (id, size uint32, err error) {
	for _, f := range fields {
		t, ok := fieldTypes[f]
		if !ok {
			return 0, 0, fmt.Errorf("unsupported set field type %q", f)
		}
		id = id<<6 | t.id
		if len(fields) > 1 {
			size += (t.size + 3) &^ 3
		} else {
			size = t.size
		}
	}
	return id, size, nil
}

// addSet creates a set or map.
func (b *nlBatch) addSet(s *set) error {
	keyF, dataF := s.fields()
	keyType, keyLen, err := typeOf(keyF)
	if err != nil {
		return err
	}
	var flags uint32
	for _, f := range s.Flags {
		flags |= map[knftables.SetFlag]uint32{knftables.IntervalFlag: unix.NFT_SET_INTERVAL,
			knftables.TimeoutFlag: unix.NFT_SET_TIMEOUT, knftables.DynamicFlag: unix.NFT_SET_EVAL}[f]
	}
	if s.IsMap {
		flags |= unix.NFT_SET_MAP
	}
	b.setID++
	m := b.Msg(unix.NFT_MSG_NEWSET, createFlags)
	b.AttrStr(unix.NFTA_SET_TABLE, b.table)
	b.AttrStr(unix.NFTA_SET_NAME, s.Name)
	b.Attr(unix.NFTA_SET_FLAGS, be32(flags))
	b.Attr(unix.NFTA_SET_KEY_TYPE, be32(keyType))
	b.Attr(unix.NFTA_SET_KEY_LEN, be32(keyLen))
	if s.IsMap {
		dataType, dataLen, err := typeOf(dataF)
		if err != nil {
			return err
		}
		if dataF[0] == "verdict" {
			dataType = unix.NFT_DATA_VERDICT
		}
		b.Attr(unix.NFTA_SET_DATA_TYPE, be32(dataType))
		b.Attr(unix.NFTA_SET_DATA_LEN, be32(dataLen))
	}
	if s.Timeout > 0 {
		b.Attr(unix.NFTA_SET_TIMEOUT, be64(uint64(s.Timeout.Milliseconds())))
	}
	if s.Size > 0 {
		d := b.Nest(unix.NFTA_SET_DESC)
		b.Attr(unix.NFTA_SET_DESC_SIZE, be32(uint32(min(s.Size, 1<<32-1))))
		b.End(d)
	}
	b.Attr(unix.NFTA_SET_ID, be32(b.setID))
	b.Attr(unix.NFTA_SET_USERDATA, setUserdata(s))
	b.Finish(m)
	return nil
}

// setUserdata is what nft reads back to print a set: byte orders, comment.
func setUserdata(s *set) []byte {
	const hostOrder, bigEndian = 1, 2
	var ud []byte
	if typeOf, ok := endpointsTypeof(s.TypeOf); ok {
		ud = typeOf
	} else {
		ud = userdata.AppendUint32(nil, userdata.NFTNL_UDATA_SET_KEYBYTEORDER, bigEndian)
		if s.IsMap {
			ud = userdata.AppendUint32(ud, userdata.NFTNL_UDATA_SET_DATABYTEORDER, bigEndian)
		}
	}
	if s.Comment != "" {
		ud = userdata.AppendString(ud, userdata.NFTNL_UDATA_SET_COMMENT, s.Comment)
	}
	return ud
}

func (b *nlBatch) delSet(name string) {
	m := b.Msg(unix.NFT_MSG_DELSET, 0)
	b.AttrStr(unix.NFTA_SET_TABLE, b.table)
	b.AttrStr(unix.NFTA_SET_NAME, name)
	b.Finish(m)
}

// flushSet deletes every element of a set.
func (b *nlBatch) flushSet(name string) {
	m := b.Msg(unix.NFT_MSG_DELSETELEM, 0)
	b.AttrStr(unix.NFTA_SET_ELEM_LIST_TABLE, b.table)
	b.AttrStr(unix.NFTA_SET_ELEM_LIST_SET, name)
	b.Finish(m)
}

// nlElem is one encoded element: key, and data or verdict for maps.
type nlElem struct {
	key, data   []byte
	verdict     *expr.Verdict
	intervalEnd bool
}

// elemWriter appends elements of one set to a batch, starting a new
// message when the element list nears the attribute size limit.
type elemWriter struct {
	b         *nlBatch
	set       string
	del       bool
	msg, list int // open message and list; -1 when none
}

func (b *nlBatch) elements(set string, del bool) *elemWriter {
	return &elemWriter{b: b, set: set, del: del, msg: -1}
}

func (w *elemWriter) add(e nlElem) {
	b := w.b
	if w.msg >= 0 && b.Off()-w.list > maxListBytes {
		w.close()
	}
	if w.msg < 0 {
		typ, flags := uint16(unix.NFT_MSG_NEWSETELEM), uint16(createFlags)
		if w.del {
			typ, flags = unix.NFT_MSG_DELSETELEM, 0
		}
		w.msg = b.Msg(typ, flags)
		b.AttrStr(unix.NFTA_SET_ELEM_LIST_TABLE, b.table)
		b.AttrStr(unix.NFTA_SET_ELEM_LIST_SET, w.set)
		w.list = b.Nest(unix.NFTA_SET_ELEM_LIST_ELEMENTS)
	}
	el := b.Nest(unix.NFTA_LIST_ELEM)
	if e.intervalEnd {
		b.Attr(unix.NFTA_SET_ELEM_FLAGS, be32(unix.NFT_SET_ELEM_INTERVAL_END))
	}
	k := b.Nest(unix.NFTA_SET_ELEM_KEY)
	b.Attr(unix.NFTA_DATA_VALUE, e.key)
	b.End(k)
	switch {
	case e.verdict != nil:
		d := b.Nest(unix.NFTA_SET_ELEM_DATA)
		v := b.Nest(unix.NFTA_DATA_VERDICT)
		b.Attr(unix.NFTA_VERDICT_CODE, be32(uint32(e.verdict.Kind)))
		if e.verdict.Chain != "" {
			b.AttrStr(unix.NFTA_VERDICT_CHAIN, e.verdict.Chain)
		}
		b.End(v)
		b.End(d)
	case e.data != nil:
		d := b.Nest(unix.NFTA_SET_ELEM_DATA)
		b.Attr(unix.NFTA_DATA_VALUE, e.data)
		b.End(d)
	}
	b.End(el)
}

// close ends the open message, if any.
func (w *elemWriter) close() {
	if w.msg >= 0 {
		w.b.End(w.list)
		w.b.Finish(w.msg)
		w.msg = -1
	}
}

// udTLV appends one userdata TLV (type and length bytes, then the value).
func udTLV(b []byte, typ byte, parts ...[]byte) []byte {
	var v []byte
	for _, p := range parts {
		v = append(v, p...)
	}
	return append(append(b, typ, byte(len(v))), v...)
}

func udU32(typ byte, v uint32) []byte {
	return udTLV(nil, typ, binary.NativeEndian.AppendUint32(nil, v))
}

// Payload descriptions as nft numbers them in typeof userdata: protocol
// header and field index.
var typeofPayload = map[string][2]uint32{
	"ip daddr": {0x0c, 12}, "ip6 daddr": {0x0d, 9},
	"tcp dport": {8, 2}, "udp dport": {6, 2}, "sctp dport": {0x0a, 2},
}

// endpointsTypeof encodes, as nft does, the userdata of the endpoints
// maps' `typeof numgen random mod 1 : IPX daddr . PROTO dport`, so that nft
// lists them as the CLI created them.
func endpointsTypeof(typeOf string) ([]byte, bool) {
	data, ok := strings.CutPrefix(typeOf, "numgen random mod 1 : ")
	fields := strings.Split(data, " . ")
	if !ok || len(fields) != 2 {
		return nil, false
	}
	const exprNumgen, exprPayload, exprConcat = 0x17, 7, 0x0d
	var sub []byte
	for i, f := range fields {
		pd, ok := typeofPayload[f]
		if !ok {
			return nil, false
		}
		sub = udTLV(sub, byte(i), udU32(0, exprPayload), udTLV(nil, 1, udU32(0, pd[0]), udU32(1, pd[1])))
	}
	ud := append(udU32(byte(userdata.NFTNL_UDATA_SET_KEYBYTEORDER), 1), udU32(byte(userdata.NFTNL_UDATA_SET_DATABYTEORDER), 0)...)
	ud = udTLV(ud, byte(userdata.NFTNL_UDATA_SET_KEY_TYPEOF), udU32(0, exprNumgen), udTLV(nil, 1, udU32(0, 1), udU32(1, 1), udU32(2, 0)))
	ud = udTLV(ud, byte(userdata.NFTNL_UDATA_SET_DATA_TYPEOF), udU32(0, exprConcat), udTLV(nil, 1, sub))
	return append(ud, udU32(byte(userdata.NFTNL_UDATA_SET_DATA_INTERVAL), 0)...), true
}

// intervalElems encodes a prefix of an interval set as nft does: the
// first address, and the address after the last one flagged as the end
// (absent when the prefix reaches the top of the address space).
func intervalElems(p netip.Prefix) []nlElem {
	p = p.Masked()
	first := p.Addr().AsSlice()
	last := make([]byte, len(first))
	copy(last, first)
	host := p.Addr().BitLen() - p.Bits()
	for i := len(last) - 1; i >= 0 && host > 0; i-- {
		bitsHere := min(host, 8)
		last[i] |= byte(1<<bitsHere - 1)
		host -= bitsHere
	}
	out := []nlElem{{key: first}}
	if end, ok := intervalEnd(last); ok {
		out = append(out, end)
	}
	return out
}

// intervalEnd turns last, an interval's last key (big endian), into the
// element nft sends after it: the next key, flagged as the end. last is
// incremented in place. There is none (false) when last is the top of the
// key space.
func intervalEnd(last []byte) (nlElem, bool) {
	for i := len(last) - 1; i >= 0; i-- { // last+1, with carry
		last[i]++
		if last[i] != 0 {
			return nlElem{key: last, intervalEnd: true}, true
		}
	}
	return nlElem{}, false
}
