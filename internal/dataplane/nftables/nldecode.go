package nftables

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// This file reads a kernel rule's expressions back into render's rule
// text: the inverse of nlrules.go, for `kproxy explain --verify`, which
// traces packets through the rules the kernel holds rather than the rules
// kproxy meant to write. A rule outside render's vocabulary (written by
// hand, or by another program) is an error naming what was not understood;
// the caller reports it as a difference.
//
// The firewall rule `ip saddr != { A, B } drop` comes back as the kernel
// rules it was written as: `ip saddr A return`, ..., `drop`.

// chainRules reads the rules of a chain over netlink and decodes each:
// its text, or an error saying what in it render does not write. found is
// false when the chain does not exist.
func (n *netlinkReader) chainRules(chain string) (texts []string, errs []error, found bool, err error) {
	err = n.dump(unix.NFT_MSG_GETRULE, func(b *nlBatch) {
		b.AttrStr(unix.NFTA_RULE_TABLE, b.table)
		b.AttrStr(unix.NFTA_RULE_CHAIN, chain)
	}, func(attrs []byte) error {
		exprs, derr := n.ruleExprsOf(attr(attrs, unix.NFTA_RULE_EXPRESSIONS))
		text := ""
		if derr == nil {
			text, derr = n.decodeRule(exprs)
		}
		texts, errs = append(texts, text), append(errs, derr)
		return nil
	}, func() { texts, errs = nil, nil })
	if isNotFound(err) {
		return nil, nil, false, nil
	}
	return texts, errs, err == nil, err
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

// decodeRule returns the text of one kernel rule.
func (n *netlinkReader) decodeRule(exprs []expr.Any) (string, error) {
	var words []string
	for len(exprs) > 0 {
		text, used := n.decodeStmt(exprs)
		if used == 0 {
			return "", fmt.Errorf("expression %s not understood after %q", exprName(exprs[0]), strings.Join(words, " "))
		}
		words = append(words, text)
		exprs = exprs[used:]
	}
	return strings.Join(words, " "), nil
}

// decodeStmt decodes the statement at the start of e; used is 0 when it
// is none that render emits.
func (n *netlinkReader) decodeStmt(e []expr.Any) (text string, used int) {
	switch x := e[0].(type) {
	case *expr.Ct:
		if x.Register == 1 && !x.SourceRegister && len(e) >= 3 {
			mask, ok := bitsNonZeroMask(e[1], e[2])
			switch {
			case ok && x.Key == expr.CtKeySTATE && mask == 8:
				return "ct state new", 3
			case ok && x.Key == expr.CtKeySTATUS && mask == 0x20:
				return "ct status dnat", 3
			}
		}
	case *expr.Verdict:
		return verdictText(x)
	case *expr.Reject:
		switch {
		case x.Type == unix.NFT_REJECT_TCP_RST:
			return "reject with tcp reset", 1
		case x.Type == unix.NFT_REJECT_ICMP_UNREACH && x.Code == n.portUnreach():
			return "reject", 1
		}
	case *expr.Masq:
		if x.FullyRandom && !x.Random && !x.Persistent && !x.ToPorts {
			return "masquerade fully-random", 1
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
		if t, ok := n.decodeDNAT(e); ok {
			return t, 3
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

func verdictText(v *expr.Verdict) (string, int) {
	switch v.Kind {
	case expr.VerdictJump, expr.VerdictGoto:
		if v.Chain == "" {
			return "", 0
		}
		verb := "jump"
		if v.Kind == expr.VerdictGoto {
			verb = "goto"
		}
		return verb + " " + v.Chain, 1
	case expr.VerdictDrop:
		return "drop", 1
	case expr.VerdictReturn:
		return "return", 1
	case expr.VerdictAccept:
		return "accept", 1
	}
	return "", 0
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

func decodeFib(f *expr.Fib, e []expr.Any) (string, int) {
	if len(e) < 2 || f.Register != 1 || !f.ResultADDRTYPE || f.FlagSADDR == f.FlagDADDR || f.FlagIIF || f.FlagOIF || f.FlagMARK {
		return "", 0
	}
	cmp, ok := e[1].(*expr.Cmp)
	if !ok || cmp.Register != 1 || cmp.Op != expr.CmpOpEq || !bytes.Equal(cmp.Data, native32(unix.RTN_LOCAL)) {
		return "", 0
	}
	if f.FlagSADDR {
		return "fib saddr type local", 2
	}
	return "fib daddr type local", 2
}

// decodeNumgen recognises `numgen random mod M 0` and the mapped DNAT
// `dnat ip to numgen random mod M offset B map @S`.
func (n *netlinkReader) decodeNumgen(g *expr.Numgen, e []expr.Any) (string, int) {
	if g.Type != unix.NFT_NG_RANDOM || g.Register != 1 || len(e) < 2 {
		return "", 0
	}
	if cmp, ok := e[1].(*expr.Cmp); ok {
		if g.Offset != 0 || cmp.Register != 1 || cmp.Op != expr.CmpOpEq || len(cmp.Data) != 4 || !isZero(cmp.Data) {
			return "", 0
		}
		return fmt.Sprintf("numgen random mod %d 0", g.Modulus), 2
	}
	if len(e) < 4 {
		return "", 0
	}
	bo, ok1 := e[1].(*expr.Byteorder)
	lk, ok2 := e[2].(*expr.Lookup)
	nat, ok3 := e[3].(*expr.NAT)
	fam, protoReg, ipX := uint32(unix.NFPROTO_IPV4), uint32(unix.NFT_REG32_01), "ip"
	if n.v6() {
		fam, protoReg, ipX = unix.NFPROTO_IPV6, unix.NFT_REG32_04, "ip6"
	}
	if !ok1 || !ok2 || !ok3 || bo.SourceRegister != 1 || bo.DestRegister != 1 || bo.Op != expr.ByteorderHton || bo.Len != 4 || bo.Size != 4 ||
		lk.SourceRegister != 1 || lk.DestRegister != 1 || !lk.IsDestRegSet || lk.Invert || lk.SetName == "" ||
		nat.Type != expr.NATTypeDestNAT || nat.Family != fam || !natRegs(nat, 1, protoReg) {
		return "", 0
	}
	return fmt.Sprintf("dnat %s to numgen random mod %d offset %d map @%s", ipX, g.Modulus, g.Offset, lk.SetName), 4
}

// decodeMark recognises `mark set mark or|xor V` and `mark and M != 0`.
func decodeMark(e []expr.Any) (string, int) {
	if len(e) < 3 {
		return "", 0
	}
	if m, ok := bitsNonZeroMask(e[1], e[2]); ok {
		return fmt.Sprintf("mark and 0x%08x != 0", m), 3
	}
	bw, ok1 := e[1].(*expr.Bitwise)
	set, ok2 := e[2].(*expr.Meta)
	if !ok1 || !ok2 || bw.SourceRegister != 1 || bw.DestRegister != 1 || bw.Len != 4 || len(bw.Mask) != 4 || len(bw.Xor) != 4 ||
		set.Key != expr.MetaKeyMARK || !set.SourceRegister || set.Register != 1 {
		return "", 0
	}
	mask, xor := binaryutil.NativeEndian.Uint32(bw.Mask), binaryutil.NativeEndian.Uint32(bw.Xor)
	switch {
	case mask == ^uint32(0):
		return fmt.Sprintf("mark set mark xor 0x%08x", xor), 3
	case mask == ^xor:
		return fmt.Sprintf("mark set mark or 0x%08x", xor), 3
	}
	return "", 0
}

func decodeIifname(c expr.Any) (string, int) {
	cmp, ok := c.(*expr.Cmp)
	if !ok || cmp.Register != 1 || (cmp.Op != expr.CmpOpEq && cmp.Op != expr.CmpOpNeq) || len(cmp.Data) == 0 {
		return "", 0
	}
	op := ""
	if cmp.Op == expr.CmpOpNeq {
		op = "!= "
	}
	if len(cmp.Data) == unix.IFNAMSIZ {
		name, _, _ := bytes.Cut(cmp.Data, []byte{0})
		return fmt.Sprintf("iifname %s%q", op, name), 2
	}
	return fmt.Sprintf("iifname %s%q", op, string(cmp.Data)+"*"), 2
}

// natRegs checks where a NAT takes its address and port: the kernel
// reports the maximum registers as the minimum ones when none were given.
func natRegs(nat *expr.NAT, addr, port uint32) bool {
	same := func(max, min uint32) bool { return max == 0 || reg(max) == reg(min) }
	return reg(nat.RegAddrMin) == reg(addr) && reg(nat.RegProtoMin) == reg(port) &&
		same(nat.RegAddrMax, nat.RegAddrMin) && same(nat.RegProtoMax, nat.RegProtoMin)
}

// decodeDNAT recognises `dnat to ADDR:PORT`.
func (n *netlinkReader) decodeDNAT(e []expr.Any) (string, bool) {
	if len(e) < 3 {
		return "", false
	}
	addr, ok1 := e[0].(*expr.Immediate)
	port, ok2 := e[1].(*expr.Immediate)
	nat, ok3 := e[2].(*expr.NAT)
	if !ok1 || !ok2 || !ok3 || reg(addr.Register) != reg(1) || reg(port.Register) != reg(2) || len(port.Data) != 2 ||
		nat.Type != expr.NATTypeDestNAT || nat.Family != uint32(n.nfproto()) || !natRegs(nat, 1, 2) {
		return "", false
	}
	a, ok := netip.AddrFromSlice(addr.Data)
	if !ok || a.Is6() != n.v6() {
		return "", false
	}
	return "dnat to " + netip.AddrPortFrom(a, binary.BigEndian.Uint16(port.Data)).String(), true
}

// decodeSelector recognises a concatenation of loads followed by a set
// lookup, a verdict map lookup or an `update @set { ... }`, and a single
// load on register 1 compared with a value.
func (n *netlinkReader) decodeSelector(e []expr.Any) (string, int) {
	// Register 1 is also where a concatenation starts (NFT_REG32_00).
	if name, size, ok := n.selectorName(e[0], 1); ok && len(e) >= 2 {
		if text, used := n.decodeCompare(name, size, e[1:]); used > 0 {
			return text, used
		}
	}
	var key []string
	next, i := uint32(reg32First), 0
	for ; i < len(e); i++ {
		if imm, ok := e[i].(*expr.Immediate); ok && i > 0 && reg(imm.Register) == reg(next) && len(imm.Data) == 4 {
			key = append(key, fmt.Sprintf("0x%08x", binaryutil.NativeEndian.Uint32(imm.Data)))
			next++
			continue
		}
		name, size, ok := n.selectorName(e[i], next)
		if !ok {
			break
		}
		key = append(key, name)
		next += (size + 3) / 4
	}
	if len(key) == 0 || i == len(e) {
		return "", 0
	}
	k := strings.Join(key, " . ")
	switch x := e[i].(type) {
	case *expr.Lookup:
		if reg(x.SourceRegister) != reg(reg32First) || x.Invert || x.SetName == "" {
			return "", 0
		}
		if !x.IsDestRegSet {
			return k + " @" + x.SetName, i + 1
		}
		if x.DestRegister == unix.NFT_REG_VERDICT {
			return k + " vmap @" + x.SetName, i + 1
		}
	case *expr.Dynset:
		if reg(x.SrcRegKey) != reg(reg32First) || x.Operation != unix.NFT_DYNSET_OP_UPDATE || x.SetName == "" || x.SrcRegData != 0 {
			return "", 0
		}
		body := k
		if x.Timeout > 0 {
			body += " timeout " + strconv.FormatInt(int64(x.Timeout.Seconds()), 10) + "s"
		}
		return "update @" + x.SetName + " { " + body + " }", i + 1
	}
	return "", 0
}

// selectorName names the load of a packet field into reg.
func (n *netlinkReader) selectorName(e expr.Any, r uint32) (string, uint32, bool) {
	for _, sel := range n.selectors() {
		want, size, _ := n.selector(sel, r)
		if sameLoad(e, want) {
			return sel, size, true
		}
	}
	return "", 0, false
}

func (n *netlinkReader) selectors() []string {
	if n.v6() {
		return []string{"ip6 saddr", "ip6 daddr", "meta l4proto", "th dport"}
	}
	return []string{"ip saddr", "ip daddr", "meta l4proto", "th dport"}
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
func (n *netlinkReader) decodeCompare(sel string, size uint32, e []expr.Any) (string, int) {
	var mask []byte
	used := 1 // the load
	if bw, ok := e[0].(*expr.Bitwise); ok {
		if bw.SourceRegister != 1 || bw.DestRegister != 1 || bw.Len != size || !isZero(bw.Xor) || len(e) < 2 {
			return "", 0
		}
		mask, e, used = bw.Mask, e[1:], used+1
	}
	cmp, ok := e[0].(*expr.Cmp)
	if !ok || cmp.Register != 1 || (cmp.Op != expr.CmpOpEq && cmp.Op != expr.CmpOpNeq) || uint32(len(cmp.Data)) != size {
		return "", 0
	}
	used++
	op := sel + " "
	if cmp.Op == expr.CmpOpNeq {
		op += "!= "
	}
	if sel == "meta l4proto" {
		for name, p := range protoNumbers {
			if mask == nil && cmp.Data[0] == p {
				return op + name, used
			}
		}
		return "", 0
	}
	if sel == "th dport" {
		return "", 0
	}
	a, ok := netip.AddrFromSlice(cmp.Data)
	if !ok {
		return "", 0
	}
	if mask == nil {
		return op + a.String(), used
	}
	p := netip.PrefixFrom(a, maskBits(mask))
	if p.Bits() < 0 || !bytes.Equal(prefixMask(p), mask) {
		return "", 0
	}
	return op + p.String(), used
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
