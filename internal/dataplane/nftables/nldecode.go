package nftables

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// This file reads a kernel rule's expressions back into render's typed
// rules: the inverse of rule.go's encoding, for `kproxy explain --verify`, which
// traces packets through the rules the kernel holds rather than the rules
// kproxy meant to write. A rule outside render's vocabulary (written by
// hand, or by another program) is an error naming what was not understood;
// the caller reports it as a difference.
//
// The firewall rule `ip saddr != { A, B } drop` comes back as the kernel
// rules it was written as: `ip saddr A return`, ..., `drop`.

// chainRules reads the rules of a chain over netlink and decodes each:
// the rule, or an error saying what in it render does not write. found is
// false when the chain does not exist.
func (n *netlinkReader) chainRules(chain string) (rules []rule, errs []error, found bool, err error) {
	err = n.dump(unix.NFT_MSG_GETRULE, func(b *nlBatch) {
		b.AttrStr(unix.NFTA_RULE_TABLE, b.table)
		b.AttrStr(unix.NFTA_RULE_CHAIN, chain)
	}, func(attrs []byte) error {
		exprs, derr := n.ruleExprsOf(attr(attrs, unix.NFTA_RULE_EXPRESSIONS))
		var r rule
		if derr == nil {
			r, derr = n.decodeRule(exprs)
		}
		rules, errs = append(rules, r), append(errs, derr)
		return nil
	}, func() { rules, errs = nil, nil })
	if isNotFound(err) {
		return nil, nil, false, nil
	}
	return rules, errs, err == nil, err
}

// ruleExprsOf decodes a rule's expression list. google/nftables decodes
// the data of each expression; the list is walked here, as its own walk
// skips expressions it has no type for (byteorder among them).
func (n *netlinkReader) ruleExprsOf(list []byte) ([]expr.Any, error) {
	var out []expr.Any
	var err error
	eachAttr(list, func(_ uint16, elem []byte) {
		if err != nil {
			return
		}
		name := strings.TrimRight(string(attr(elem, unix.NFTA_EXPR_NAME)), "\x00")
		data := attr(elem, unix.NFTA_EXPR_DATA)
		if name == "byteorder" { // google/nftables does not decode it
			out = append(out, decodeByteorder(data))
			return
		}
		e := newExpr(name)
		if e == nil {
			err = fmt.Errorf("expression %s", name)
			return
		}
		if err = expr.Unmarshal(n.nfproto(), data, e); err != nil {
			err = fmt.Errorf("expression %s: %w", name, err)
			return
		}
		if imm, ok := e.(*expr.Immediate); ok && imm.Register == unix.NFT_REG_VERDICT && len(imm.Data) == 0 {
			v := &expr.Verdict{}
			if err = expr.Unmarshal(n.nfproto(), data, v); err != nil {
				return
			}
			e = v
		}
		out = append(out, e)
	})
	return out, err
}

// newExpr returns an empty expression of each kind render writes.
func newExpr(name string) expr.Any {
	switch name {
	case "ct":
		return &expr.Ct{}
	case "bitwise":
		return &expr.Bitwise{}
	case "cmp":
		return &expr.Cmp{}
	case "immediate":
		return &expr.Immediate{}
	case "reject":
		return &expr.Reject{}
	case "masq":
		return &expr.Masq{}
	case "fib":
		return &expr.Fib{}
	case "numgen":
		return &expr.Numgen{}
	case "hash":
		return &expr.Hash{}
	case "meta":
		return &expr.Meta{}
	case "payload":
		return &expr.Payload{}
	case "lookup":
		return &expr.Lookup{}
	case "dynset":
		return &expr.Dynset{}
	case "nat":
		return &expr.NAT{}
	}
	return nil
}

func decodeByteorder(data []byte) *expr.Byteorder {
	b := &expr.Byteorder{}
	eachAttr(data, func(typ uint16, v []byte) {
		if len(v) != 4 {
			return
		}
		x := binary.BigEndian.Uint32(v)
		switch typ {
		case unix.NFTA_BYTEORDER_SREG:
			b.SourceRegister = x
		case unix.NFTA_BYTEORDER_DREG:
			b.DestRegister = x
		case unix.NFTA_BYTEORDER_OP:
			b.Op = expr.ByteorderOp(x)
		case unix.NFTA_BYTEORDER_LEN:
			b.Len = x
		case unix.NFTA_BYTEORDER_SIZE:
			b.Size = x
		}
	})
	return b
}

// reg is a register number as the kernel keeps it (32-bit units): the
// kernel dumps a register that starts a 128-bit one as NFT_REG_1..4 and
// any other as NFT_REG32_xx, whichever way the rule named it.
func reg(r uint32) uint32 {
	if r >= unix.NFT_REG_1 && r <= unix.NFT_REG_4 {
		return r * 4
	}
	if r >= unix.NFT_REG32_00 {
		return r - unix.NFT_REG32_00 + 4
	}
	return r
}

// decodeRule reads one kernel rule.
func (n *netlinkReader) decodeRule(exprs []expr.Any) (rule, error) {
	var r rule
	for len(exprs) > 0 {
		s, used := n.decodeStmt(exprs)
		if used == 0 {
			s, used = reusedKeyUpdate(r, exprs[0])
		}
		if used == 0 {
			return nil, fmt.Errorf("expression %s not understood after %q", exprName(exprs[0]), r)
		}
		r = append(r, s)
		exprs = exprs[used:]
	}
	return r, nil
}

// decodeStmt decodes the statement at the start of e; used is 0 when it
// is none that render emits.
func (n *netlinkReader) decodeStmt(e []expr.Any) (s stmt, used int) {
	switch x := e[0].(type) {
	case *expr.Ct:
		if x.Register == 1 && !x.SourceRegister && len(e) >= 3 {
			mask, ok := bitsNonZeroMask(e[1], e[2])
			switch {
			case ok && x.Key == expr.CtKeySTATE && mask == 8:
				return ctMatch{}, 3
			case ok && x.Key == expr.CtKeySTATUS && mask == 0x20:
				return ctMatch{dnat: true}, 3
			}
		}
	case *expr.Verdict:
		return verdictOf(x)
	case *expr.Reject:
		switch {
		case x.Type == unix.NFT_REJECT_TCP_RST:
			return reject{tcpReset: true}, 1
		case x.Type == unix.NFT_REJECT_ICMP_UNREACH && x.Code == n.portUnreach():
			return reject{v6: n.v6()}, 1
		}
	case *expr.Masq:
		if x.FullyRandom && !x.Random && !x.Persistent && !x.ToPorts {
			return masquerade{}, 1
		}
	case *expr.Fib:
		return decodeFib(x, e)
	case *expr.Numgen:
		return n.decodeNumgen(x, e)
	case *expr.Meta:
		if x.Key == expr.MetaKeyMARK && !x.SourceRegister && x.Register == 1 {
			return decodeMark(e)
		}
		if x.Key == expr.MetaKeyIIFNAME && !x.SourceRegister && x.Register == 1 && len(e) >= 2 {
			return decodeIifname(e[1])
		}
	case *expr.Immediate:
		if d, ok := n.decodeDNAT(e); ok {
			return d, 3
		}
	case *expr.Payload:
		if len(e) >= 2 {
			if _, ok := e[1].(*expr.Hash); ok {
				return n.decodeHash(e)
			}
		}
	}
	return n.decodeSelector(e)
}

func (n *netlinkReader) portUnreach() uint8 {
	if n.v6() {
		return icmp6PortUnreach
	}
	return icmpPortUnreach
}

func verdictOf(v *expr.Verdict) (stmt, int) {
	switch v.Kind {
	case expr.VerdictJump, expr.VerdictGoto:
		if v.Chain == "" {
			return nil, 0
		}
		return verdict{kind: v.Kind, chain: v.Chain}, 1
	case expr.VerdictDrop, expr.VerdictReturn, expr.VerdictAccept:
		return verdict{kind: v.Kind}, 1
	}
	return nil, 0
}

// bitsNonZeroMask recognises `& mask != 0` on register 1 (bitsNonZero).
func bitsNonZeroMask(b, c expr.Any) (uint32, bool) {
	bw, ok1 := b.(*expr.Bitwise)
	cmp, ok2 := c.(*expr.Cmp)
	if !ok1 || !ok2 || bw.SourceRegister != 1 || bw.DestRegister != 1 || bw.Len != 4 ||
		len(bw.Mask) != 4 || !isZero(bw.Xor) || cmp.Register != 1 || cmp.Op != expr.CmpOpNeq || len(cmp.Data) != 4 || !isZero(cmp.Data) {
		return 0, false
	}
	return binaryutil.NativeEndian.Uint32(bw.Mask), true
}

func isZero(b []byte) bool { return len(bytes.Trim(b, "\x00")) == 0 }

func decodeFib(f *expr.Fib, e []expr.Any) (stmt, int) {
	if len(e) < 2 || f.Register != 1 || !f.ResultADDRTYPE || f.FlagSADDR == f.FlagDADDR || f.FlagIIF || f.FlagOIF || f.FlagMARK {
		return nil, 0
	}
	cmp, ok := e[1].(*expr.Cmp)
	if !ok || cmp.Register != 1 || cmp.Op != expr.CmpOpEq || !bytes.Equal(cmp.Data, native32(unix.RTN_LOCAL)) {
		return nil, 0
	}
	return fibLocal{saddr: f.FlagSADDR}, 2
}

// decodeNumgen recognises `numgen random mod M 0` and the mapped DNAT
// `dnat ip to numgen random|inc mod M offset B map @S`.
func (n *netlinkReader) decodeNumgen(g *expr.Numgen, e []expr.Any) (stmt, int) {
	if (g.Type != unix.NFT_NG_RANDOM && g.Type != unix.NFT_NG_INCREMENTAL) || g.Register != 1 || len(e) < 2 {
		return nil, 0
	}
	if cmp, ok := e[1].(*expr.Cmp); ok {
		if g.Offset != 0 || cmp.Register != 1 || cmp.Op != expr.CmpOpEq || len(cmp.Data) != 4 || !isZero(cmp.Data) {
			return nil, 0
		}
		return numgenZero{mod: g.Modulus, inc: g.Type == unix.NFT_NG_INCREMENTAL}, 2
	}
	d := dnatMap{v6: n.v6(), mod: g.Modulus, offset: g.Offset}
	if g.Type == unix.NFT_NG_INCREMENTAL {
		d.gen = genInc
	}
	return n.decodeMappedDNAT(d, e[1:], 1)
}

// decodeHash recognises the mapped DNAT `dnat ip to jhash ip saddr mod M
// seed S offset B map @S`: the load of the source address, then the hash.
func (n *netlinkReader) decodeHash(e []expr.Any) (stmt, int) {
	saddr, _ := addrSelectors(n.v6())
	load, size := saddr.load(1)
	if len(e) < 2 || !sameLoad(e[0], load) {
		return nil, 0
	}
	h, ok := e[1].(*expr.Hash)
	if !ok || h.Type != expr.HashTypeJenkins || h.SourceRegister != 1 || h.DestRegister != 1 || h.Length != size || h.Seed == 0 {
		return nil, 0
	}
	return n.decodeMappedDNAT(dnatMap{v6: n.v6(), gen: genHash, mod: h.Modulus, seed: h.Seed, offset: h.Offset}, e[2:], 2)
}

// decodeMappedDNAT recognises the byteorder conversion, map lookup and NAT
// that follow the generator of d (used expressions long), or instead of
// the NAT the comparison of mapIs.
func (n *netlinkReader) decodeMappedDNAT(d dnatMap, e []expr.Any, used int) (stmt, int) {
	if s, ok := n.decodeMapIs(d, e); ok {
		return s, used + 4
	}
	if len(e) < 3 {
		return nil, 0
	}
	bo, ok1 := e[0].(*expr.Byteorder)
	lk, ok2 := e[1].(*expr.Lookup)
	nat, ok3 := e[2].(*expr.NAT)
	if !ok1 || !ok2 || !ok3 || bo.SourceRegister != 1 || bo.DestRegister != 1 || bo.Op != expr.ByteorderHton || bo.Len != 4 || bo.Size != 4 ||
		lk.SourceRegister != 1 || lk.DestRegister != 1 || !lk.IsDestRegSet || lk.Invert || lk.SetName == "" ||
		nat.Type != expr.NATTypeDestNAT || nat.Family != uint32(n.nfproto()) || !natRegs(nat, 1, d.protoReg()) {
		return nil, 0
	}
	d.set = lk.SetName
	return d, used + 3
}

// decodeMapIs recognises the rest of `jhash … map @S == ADDR . PORT`.
func (n *netlinkReader) decodeMapIs(d dnatMap, e []expr.Any) (stmt, bool) {
	if d.gen != genHash || len(e) < 4 {
		return nil, false
	}
	bo, ok1 := e[0].(*expr.Byteorder)
	lk, ok2 := e[1].(*expr.Lookup)
	ca, ok3 := e[2].(*expr.Cmp)
	cp, ok4 := e[3].(*expr.Cmp)
	if !ok1 || !ok2 || !ok3 || !ok4 || bo.SourceRegister != 1 || bo.DestRegister != 1 || bo.Op != expr.ByteorderHton || bo.Len != 4 || bo.Size != 4 ||
		lk.SourceRegister != 1 || lk.DestRegister != 1 || !lk.IsDestRegSet || lk.Invert || lk.SetName == "" ||
		ca.Register != 1 || ca.Op != expr.CmpOpEq || cp.Register != d.protoReg() || cp.Op != expr.CmpOpEq || len(cp.Data) != 2 {
		return nil, false
	}
	a, ok := netip.AddrFromSlice(ca.Data)
	if !ok || a.Is6() != n.v6() {
		return nil, false
	}
	d.set = lk.SetName
	return mapIs{m: d, to: netip.AddrPortFrom(a, binaryutil.BigEndian.Uint16(cp.Data))}, true
}

// decodeMark recognises `mark set mark or|xor V` and `mark and M != 0`.
func decodeMark(e []expr.Any) (stmt, int) {
	if len(e) < 3 {
		return nil, 0
	}
	if m, ok := bitsNonZeroMask(e[1], e[2]); ok {
		return markTest{mask: m}, 3
	}
	bw, ok1 := e[1].(*expr.Bitwise)
	set, ok2 := e[2].(*expr.Meta)
	if !ok1 || !ok2 || bw.SourceRegister != 1 || bw.DestRegister != 1 || bw.Len != 4 || len(bw.Mask) != 4 || len(bw.Xor) != 4 ||
		set.Key != expr.MetaKeyMARK || !set.SourceRegister || set.Register != 1 {
		return nil, 0
	}
	mask, xor := binaryutil.NativeEndian.Uint32(bw.Mask), binaryutil.NativeEndian.Uint32(bw.Xor)
	switch {
	case mask == ^uint32(0):
		return markSet{xor: true, v: xor}, 3
	case mask == ^xor:
		return markSet{v: xor}, 3
	}
	return nil, 0
}

func decodeIifname(c expr.Any) (stmt, int) {
	cmp, ok := c.(*expr.Cmp)
	if !ok || cmp.Register != 1 || (cmp.Op != expr.CmpOpEq && cmp.Op != expr.CmpOpNeq) || len(cmp.Data) == 0 {
		return nil, 0
	}
	neg := cmp.Op == expr.CmpOpNeq
	if len(cmp.Data) == unix.IFNAMSIZ {
		name, _, _ := bytes.Cut(cmp.Data, []byte{0})
		return iifname{neg: neg, name: string(name)}, 2
	}
	return iifname{neg: neg, name: string(cmp.Data) + "*"}, 2
}

// natRegs checks where a NAT takes its address and port: the kernel
// reports the maximum registers as the minimum ones when none were given.
func natRegs(nat *expr.NAT, addr, port uint32) bool {
	same := func(max, min uint32) bool { return max == 0 || reg(max) == reg(min) }
	return reg(nat.RegAddrMin) == reg(addr) && reg(nat.RegProtoMin) == reg(port) &&
		same(nat.RegAddrMax, nat.RegAddrMin) && same(nat.RegProtoMax, nat.RegProtoMin)
}

// decodeDNAT recognises `dnat to ADDR:PORT`.
func (n *netlinkReader) decodeDNAT(e []expr.Any) (stmt, bool) {
	if len(e) < 3 {
		return nil, false
	}
	addr, ok1 := e[0].(*expr.Immediate)
	port, ok2 := e[1].(*expr.Immediate)
	nat, ok3 := e[2].(*expr.NAT)
	if !ok1 || !ok2 || !ok3 || reg(addr.Register) != reg(1) || reg(port.Register) != reg(2) || len(port.Data) != 2 ||
		nat.Type != expr.NATTypeDestNAT || nat.Family != uint32(n.nfproto()) || !natRegs(nat, 1, 2) {
		return nil, false
	}
	a, ok := netip.AddrFromSlice(addr.Data)
	if !ok || a.Is6() != n.v6() {
		return nil, false
	}
	return dnatTo{to: netip.AddrPortFrom(a, binary.BigEndian.Uint16(port.Data))}, true
}

// reusedKeyUpdate recognises an `update @set` that reads the key the
// rule's lookup just before it left in the registers.
func reusedKeyUpdate(r rule, e expr.Any) (stmt, int) {
	d, ok := e.(*expr.Dynset)
	if !ok || len(r) == 0 || !plainUpdate(d) {
		return nil, 0
	}
	l, ok := r[len(r)-1].(lookup)
	if !ok || l.vmap {
		return nil, 0
	}
	return setUpdate{set: d.SetName, key: l.key, timeout: d.Timeout.Truncate(time.Second), keyLoaded: true}, 1
}

// plainUpdate says d is an `update @set { KEY }` of a set (no data) whose
// key starts at the first register, the only form render writes.
func plainUpdate(d *expr.Dynset) bool {
	return reg(d.SrcRegKey) == reg(reg32First) && d.Operation == unix.NFT_DYNSET_OP_UPDATE && d.SetName != "" && d.SrcRegData == 0
}

// decodeSelector recognises a concatenation of loads followed by a set
// lookup, a verdict map lookup or an `update @set { ... }`, and a single
// load on register 1 compared with a value.
func (n *netlinkReader) decodeSelector(e []expr.Any) (stmt, int) {
	// Register 1 is also where a concatenation starts (NFT_REG32_00).
	if sel, size, ok := n.selectorOf(e[0], 1); ok && len(e) >= 2 {
		if s, used := n.decodeCompare(sel, size, e[1:]); used > 0 {
			return s, used
		}
	}
	var k key
	next, i := uint32(reg32First), 0
	for ; i < len(e); i++ {
		if imm, ok := e[i].(*expr.Immediate); ok && i > 0 && reg(imm.Register) == reg(next) && len(imm.Data) == 4 {
			k = append(k, keyPart{mark: binaryutil.NativeEndian.Uint32(imm.Data)})
			next++
			continue
		}
		sel, size, ok := n.selectorOf(e[i], next)
		if !ok {
			break
		}
		k = append(k, keyPart{sel: sel})
		next += (size + 3) / 4
	}
	if len(k) == 0 || i == len(e) {
		return nil, 0
	}
	switch x := e[i].(type) {
	case *expr.Lookup:
		if reg(x.SourceRegister) != reg(reg32First) || x.Invert || x.SetName == "" {
			return nil, 0
		}
		if !x.IsDestRegSet {
			return lookup{key: k, set: x.SetName}, i + 1
		}
		if x.DestRegister == unix.NFT_REG_VERDICT {
			return lookup{key: k, set: x.SetName, vmap: true}, i + 1
		}
	case *expr.Dynset:
		if !plainUpdate(x) {
			return nil, 0
		}
		return setUpdate{set: x.SetName, key: k, timeout: x.Timeout.Truncate(time.Second)}, i + 1
	}
	return nil, 0
}

// selectorOf names the load of a packet field into reg.
func (n *netlinkReader) selectorOf(e expr.Any, r uint32) (selector, uint32, bool) {
	saddr, daddr := addrSelectors(n.v6())
	for _, sel := range []selector{saddr, daddr, selL4proto, selDport} {
		want, size := sel.load(r)
		if sameLoad(e, want) {
			return sel, size, true
		}
	}
	return selNone, 0, false
}

// sameLoad compares the fields of a load that the kernel reports back.
func sameLoad(got, want expr.Any) bool {
	switch w := want.(type) {
	case *expr.Payload:
		g, ok := got.(*expr.Payload)
		return ok && g.OperationType == expr.PayloadLoad && reg(g.DestRegister) == reg(w.DestRegister) && g.Base == w.Base && g.Offset == w.Offset && g.Len == w.Len
	case *expr.Meta:
		g, ok := got.(*expr.Meta)
		return ok && !g.SourceRegister && g.Key == w.Key && reg(g.Register) == reg(w.Register)
	}
	return false
}

// decodeCompare recognises `SEL [!=] VALUE` after the load of SEL into
// register 1: a protocol name, or an address or prefix.
func (n *netlinkReader) decodeCompare(sel selector, size uint32, e []expr.Any) (stmt, int) {
	var mask []byte
	used := 1 // the load
	if bw, ok := e[0].(*expr.Bitwise); ok {
		if bw.SourceRegister != 1 || bw.DestRegister != 1 || bw.Len != size || !isZero(bw.Xor) || len(e) < 2 {
			return nil, 0
		}
		mask, e, used = bw.Mask, e[1:], used+1
	}
	cmp, ok := e[0].(*expr.Cmp)
	if !ok || cmp.Register != 1 || (cmp.Op != expr.CmpOpEq && cmp.Op != expr.CmpOpNeq) || uint32(len(cmp.Data)) != size {
		return nil, 0
	}
	used++
	neg := cmp.Op == expr.CmpOpNeq
	switch sel {
	case selL4proto:
		for name, p := range protoNumbers {
			if mask == nil && cmp.Data[0] == p {
				return protoCmp{neg: neg, proto: name}, used
			}
		}
		return nil, 0
	case selDport:
		return nil, 0
	}
	a, ok := netip.AddrFromSlice(cmp.Data)
	if !ok {
		return nil, 0
	}
	p := netip.PrefixFrom(a, a.BitLen())
	if mask != nil {
		p = netip.PrefixFrom(a, maskBits(mask))
		if p.Bits() < 0 || !bytes.Equal(prefixMask(p), mask) {
			return nil, 0
		}
	}
	return addrCmp{sel: sel, neg: neg, p: p}, used
}

// maskBits counts the leading ones of a prefix mask.
func maskBits(m []byte) int {
	n := 0
	for _, b := range m {
		for i := 7; i >= 0 && b&(1<<i) != 0; i-- {
			n++
		}
		if b != 0xff {
			break
		}
	}
	return n
}
