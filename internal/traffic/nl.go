package traffic

import (
	"encoding/binary"

	"golang.org/x/sys/unix"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/nfnl"
)

// The table's rules, written as nft would print them (ip6: ip6 daddr):
//
//	chain prerouting { type filter hook prerouting priority dstnat + 10; jump count }
//	chain output { type filter hook output priority dstnat + 10; jump count }
//	chain count {
//		ct status & dnat == 0 return
//		ct status & confirmed == 0 jump count-new
//		counter name ct original ip daddr . meta l4proto . ct original proto-dst map @frontends return
//		counter name meta l4proto . ct original proto-dst map @nodeports
//	}
//	chain count-new { the same two lookups in frontends-new and nodeports-new }
//
// Every packet of the node passes prerouting or output once; after the
// NAT hooks (dstnat) a connection kproxy proxied carries the dnat status
// from its first packet on, and the original tuple names the frontend in
// both directions. A connection is new while its conntrack entry is not
// yet confirmed: that is its first packet only (a UDP client's second
// datagram before any reply is "ct state new" too, but confirmed). The
// chains end without a verdict: the table never changes one.

const (
	chainCount    = "count"
	chainCountNew = "count-new"
	// priority is dstnat + 10: after kproxy's (and kube-proxy's) DNAT.
	priority int32 = -90
	// Conntrack status bits (IPS_*), in host order as ct status loads them.
	ipsConfirmed = 1 << 3
	ipsDstNAT    = 1 << 5
	// Registers: a 16-byte one for the status, 4-byte ones for the key.
	regStatus = unix.NFT_REG_1
	regKey    = unix.NFT_REG32_00
	// nft's type numbers, for nft to print the maps' keys.
	typeIPv4Addr    = 7
	typeIPv6Addr    = 8
	typeInetProto   = 12
	typeInetService = 13
	nfAccept        = 1 // NF_ACCEPT
	ctDirOriginal   = 0 // IP_CT_DIR_ORIGINAL
)

// nfFamily is the netlink family of a model family.
func nfFamily(f model.Family) byte {
	if f == model.IPv6 {
		return unix.NFPROTO_IPV6
	}
	return unix.NFPROTO_IPV4
}

// writer encodes ops into a batch of one family.
type writer struct {
	*nfnl.Batch
	fam model.Family
}

func be32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

func be64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

// write appends the messages of ops: a reset first, then element
// deletions, counter deletions, counter additions and element additions,
// each group in the order of ops (plan puts every deletion before every
// addition; an element needs its counter, a counter goes after its
// elements). Elements of one map and kind share messages.
func (w writer) write(ops []op) {
	var delElems, addElems []op
	for _, o := range ops {
		switch o.kind {
		case opReset:
			w.reset()
		case opDelElem:
			delElems = append(delElems, o)
		case opAddElem:
			addElems = append(addElems, o)
		}
	}
	w.elementsByMap(delElems)
	for _, kind := range []opKind{opDelCounter, opAddCounter} {
		for _, o := range ops {
			if o.kind == kind {
				w.counter(o.counter, kind == opAddCounter)
				w.counter(o.counter+newSuffix, kind == opAddCounter)
			}
		}
	}
	w.elementsByMap(addElems)
}

// elementsByMap writes element ops of one kind, frontends then NodePorts.
func (w writer) elementsByMap(ops []op) {
	var fe, np []op
	for _, o := range ops {
		if o.key.addr.IsValid() {
			fe = append(fe, o)
		} else {
			np = append(np, o)
		}
	}
	w.elements(fe)
	w.elements(np)
}

// deleteTable appends: add the table (so that deleting it cannot fail),
// delete it.
func (w writer) deleteTable() {
	w.table(unix.NFT_MSG_NEWTABLE)
	w.table(unix.NFT_MSG_DELTABLE)
}

func (w writer) table(typ uint16) {
	m := w.Msg(typ, unix.NLM_F_CREATE)
	w.AttrStr(unix.NFTA_TABLE_NAME, Table)
	w.Finish(m)
}

// reset replaces the table with an empty one: maps, chains, rules.
func (w writer) reset() {
	w.deleteTable()
	w.table(unix.NFT_MSG_NEWTABLE)
	for i, name := range []string{mapFrontends, mapFrontendsNew, mapNodePorts, mapNodePortsNew} {
		w.set(name, uint32(i+1))
	}
	w.chain(chainCount, nil)
	w.chain(chainCountNew, nil)
	w.chain("prerouting", &hook{unix.NF_INET_PRE_ROUTING})
	w.chain("output", &hook{unix.NF_INET_LOCAL_OUT})
	for _, c := range []string{"prerouting", "output"} {
		w.rule(c, func() { w.verdict(unix.NFT_JUMP, chainCount) })
	}
	w.rule(chainCount, func() {
		w.statusBit(ipsDstNAT, unix.NFT_CMP_EQ)
		w.verdict(unix.NFT_RETURN, "")
	})
	w.rule(chainCount, func() {
		w.statusBit(ipsConfirmed, unix.NFT_CMP_EQ)
		w.verdict(unix.NFT_JUMP, chainCountNew)
	})
	for _, c := range []struct{ chain, fe, np string }{
		{chainCount, mapFrontends, mapNodePorts},
		{chainCountNew, mapFrontendsNew, mapNodePortsNew},
	} {
		w.rule(c.chain, func() {
			w.loadKey(true)
			w.objref(c.fe)
			w.verdict(unix.NFT_RETURN, "")
		})
		w.rule(c.chain, func() {
			w.loadKey(false)
			w.objref(c.np)
		})
	}
}

type hook struct{ num uint32 }

func (w writer) chain(name string, h *hook) {
	m := w.Msg(unix.NFT_MSG_NEWCHAIN, unix.NLM_F_CREATE)
	w.AttrStr(unix.NFTA_CHAIN_TABLE, Table)
	w.AttrStr(unix.NFTA_CHAIN_NAME, name)
	if h != nil {
		n := w.Nest(unix.NFTA_CHAIN_HOOK)
		w.AttrBE32(unix.NFTA_HOOK_HOOKNUM, h.num)
		p := priority
		w.Attr(unix.NFTA_HOOK_PRIORITY, be32(uint32(p)))
		w.End(n)
		w.AttrBE32(unix.NFTA_CHAIN_POLICY, nfAccept)
		w.AttrStr(unix.NFTA_CHAIN_TYPE, "filter")
	}
	w.Finish(m)
}

// set adds an object map from a frontend or NodePort key to a counter.
func (w writer) set(name string, id uint32) {
	addrLen, addrType := uint32(4), uint32(typeIPv4Addr)
	if w.fam == model.IPv6 {
		addrLen, addrType = 16, typeIPv6Addr
	}
	keyLen, keyType := uint32(8), uint32(typeInetProto<<6|typeInetService)
	if name == mapFrontends || name == mapFrontendsNew {
		keyLen, keyType = addrLen+8, addrType<<12|keyType
	}
	m := w.Msg(unix.NFT_MSG_NEWSET, unix.NLM_F_CREATE)
	w.AttrStr(unix.NFTA_SET_TABLE, Table)
	w.AttrStr(unix.NFTA_SET_NAME, name)
	w.AttrBE32(unix.NFTA_SET_FLAGS, unix.NFT_SET_OBJECT)
	w.AttrBE32(unix.NFTA_SET_KEY_TYPE, keyType)
	w.AttrBE32(unix.NFTA_SET_KEY_LEN, keyLen)
	w.AttrBE32(unix.NFTA_SET_ID, id)
	w.AttrBE32(unix.NFTA_SET_OBJ_TYPE, unix.NFT_OBJECT_COUNTER)
	w.Finish(m)
}

func (w writer) counter(name string, add bool) {
	typ := uint16(unix.NFT_MSG_DELOBJ)
	if add {
		typ = unix.NFT_MSG_NEWOBJ
	}
	m := w.Msg(typ, unix.NLM_F_CREATE)
	w.AttrStr(unix.NFTA_OBJ_TABLE, Table)
	w.AttrStr(unix.NFTA_OBJ_NAME, name)
	w.AttrBE32(unix.NFTA_OBJ_TYPE, unix.NFT_OBJECT_COUNTER)
	if add {
		n := w.Nest(unix.NFTA_OBJ_DATA)
		w.Attr(unix.NFTA_COUNTER_BYTES, be64(0))
		w.Attr(unix.NFTA_COUNTER_PACKETS, be64(0))
		w.End(n)
	}
	w.Finish(m)
}

// maxElemBytes bounds one message's element list: a nested attribute's
// length is 16 bits.
const maxElemBytes = 48 << 10

// elements writes element ops of one map and kind, twice: into the map
// and into its -new twin, in messages of at most maxElemBytes of elements.
func (w writer) elements(ops []op) {
	if len(ops) == 0 {
		return
	}
	typ := uint16(unix.NFT_MSG_NEWSETELEM)
	if ops[0].kind == opDelElem {
		typ = unix.NFT_MSG_DELSETELEM
	}
	for _, suffix := range []string{"", "-new"} {
		for rest := ops; len(rest) > 0; {
			m := w.Msg(typ, unix.NLM_F_CREATE)
			w.AttrStr(unix.NFTA_SET_ELEM_LIST_TABLE, Table)
			w.AttrStr(unix.NFTA_SET_ELEM_LIST_SET, ops[0].key.mapName()+suffix)
			list := w.Nest(unix.NFTA_SET_ELEM_LIST_ELEMENTS)
			for len(rest) > 0 && w.Off()-list < maxElemBytes {
				o := rest[0]
				rest = rest[1:]
				e := w.Nest(unix.NFTA_LIST_ELEM)
				w.Value(unix.NFTA_SET_ELEM_KEY, o.key.bytes())
				if typ == unix.NFT_MSG_NEWSETELEM {
					name := o.counter
					if suffix != "" {
						name += newSuffix
					}
					w.AttrStr(unix.NFTA_SET_ELEM_OBJREF, name)
				}
				w.End(e)
			}
			w.End(list)
			w.Finish(m)
		}
	}
}

// rule appends a rule to chain whose expressions body writes.
func (w writer) rule(chain string, body func()) {
	m := w.Msg(unix.NFT_MSG_NEWRULE, unix.NLM_F_CREATE|unix.NLM_F_APPEND)
	w.AttrStr(unix.NFTA_RULE_TABLE, Table)
	w.AttrStr(unix.NFTA_RULE_CHAIN, chain)
	n := w.Nest(unix.NFTA_RULE_EXPRESSIONS)
	body()
	w.End(n)
	w.Finish(m)
}

// expr appends one expression whose attributes data writes.
func (w writer) expr(name string, data func()) {
	e := w.Nest(unix.NFTA_LIST_ELEM)
	w.AttrStr(unix.NFTA_EXPR_NAME, name)
	d := w.Nest(unix.NFTA_EXPR_DATA)
	data()
	w.End(d)
	w.End(e)
}

// statusBit matches ct status & bit against 0 with op (EQ: bit clear).
func (w writer) statusBit(bit uint32, op uint32) {
	w.ct(unix.NFT_CT_STATUS, regStatus, false)
	w.expr("bitwise", func() {
		w.AttrBE32(unix.NFTA_BITWISE_SREG, regStatus)
		w.AttrBE32(unix.NFTA_BITWISE_DREG, regStatus)
		w.AttrBE32(unix.NFTA_BITWISE_LEN, 4)
		w.Value(unix.NFTA_BITWISE_MASK, binary.NativeEndian.AppendUint32(nil, bit))
		w.Value(unix.NFTA_BITWISE_XOR, make([]byte, 4))
	})
	w.expr("cmp", func() {
		w.AttrBE32(unix.NFTA_CMP_SREG, regStatus)
		w.AttrBE32(unix.NFTA_CMP_OP, op)
		w.Value(unix.NFTA_CMP_DATA, make([]byte, 4))
	})
}

// ct loads a conntrack key into reg (of the original direction when
// original).
func (w writer) ct(k uint32, reg uint32, original bool) {
	w.expr("ct", func() {
		w.AttrBE32(unix.NFTA_CT_DREG, reg)
		w.AttrBE32(unix.NFTA_CT_KEY, k)
		if original {
			w.Attr(unix.NFTA_CT_DIRECTION, []byte{ctDirOriginal})
		}
	})
}

// loadKey loads [ct original daddr .] meta l4proto . ct original
// proto-dst into the key registers.
func (w writer) loadKey(withAddr bool) {
	reg := uint32(regKey)
	if withAddr {
		w.ct(unix.NFT_CT_DST, reg, true)
		reg++
		if w.fam == model.IPv6 {
			reg += 3
		}
	}
	w.expr("meta", func() {
		w.AttrBE32(unix.NFTA_META_KEY, unix.NFT_META_L4PROTO)
		w.AttrBE32(unix.NFTA_META_DREG, reg)
	})
	w.ct(unix.NFT_CT_PROTO_DST, reg+1, true)
}

// objref counts the packet in the counter map name points the key at.
func (w writer) objref(name string) {
	w.expr("objref", func() {
		w.AttrBE32(unix.NFTA_OBJREF_SET_SREG, regKey)
		w.AttrStr(unix.NFTA_OBJREF_SET_NAME, name)
	})
}

func (w writer) verdict(code int32, chain string) {
	w.expr("immediate", func() { w.Verdict(code, chain) })
}
