package nftables

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// rule is one rule as render builds it: its statements, in order. Each
// statement prints itself in nft's syntax (String: dry runs, golden files,
// the digests in chain names, explain's reports) and encodes itself as the
// netlink expressions nft generates for that text (exprs); the tracer
// evaluates statements and nldecode reads a kernel rule back into them. No
// rule is ever parsed from text.
type rule []stmt

// stmt is one match or statement of a rule.
type stmt interface {
	appendText(b []byte) []byte
	// appendExprs appends the statement's expressions; registers start at
	// 1 (NFT_REG_1, whose first 32-bit part is NFT_REG32_00).
	appendExprs(out []expr.Any) []expr.Any
}

// String returns the rule in nft's syntax.
func (r rule) String() string { return string(r.appendText(nil)) }

func (r rule) appendText(b []byte) []byte {
	for i, s := range r {
		if i > 0 {
			b = append(b, ' ')
		}
		b = s.appendText(b)
	}
	return b
}

// kernelRules returns the rules the kernel holds for r: r itself, except a
// firewall rule `ip saddr != { A, B } drop`, which is written as
// `ip saddr A return`, …, `drop`: equivalent as it is the last rule of its
// chain, and it needs no anonymous interval set.
func (r rule) kernelRules() []rule {
	if !r.expands() {
		return []rule{r}
	}
	a := r[0].(allowOnly)
	out := make([]rule, 0, len(a.allowed)+1)
	for _, p := range a.allowed {
		out = append(out, rule{addrCmp{sel: a.sel, p: p}, verdict{kind: expr.VerdictReturn}})
	}
	return append(out, rule{verdict{kind: expr.VerdictDrop}})
}

// expands reports whether the rule is more than one kernel rule.
func (r rule) expands() bool {
	if len(r) != 1 {
		return false
	}
	_, ok := r[0].(allowOnly)
	return ok
}

// appendExprs appends the encoding of a rule that kernelRules returned.
func (r rule) appendExprs(out []expr.Any) []expr.Any {
	for _, s := range r {
		out = s.appendExprs(out)
	}
	return out
}

// selector is a packet field a rule loads.
type selector uint8

const (
	selNone selector = iota // a constant (keyPart.mark)
	selSaddr4
	selDaddr4
	selSaddr6
	selDaddr6
	selL4proto
	selDport
)

var selectorText = [...]string{selSaddr4: "ip saddr", selDaddr4: "ip daddr", selSaddr6: "ip6 saddr",
	selDaddr6: "ip6 daddr", selL4proto: "meta l4proto", selDport: "th dport"}

func (s selector) String() string { return selectorText[s] }

// load returns the expression loading the field into reg, and its size.
func (s selector) load(reg uint32) (expr.Any, uint32) {
	switch s {
	case selSaddr4:
		return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4}, 4
	case selDaddr4:
		return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4}, 4
	case selSaddr6:
		return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: 8, Len: 16}, 16
	case selDaddr6:
		return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: 24, Len: 16}, 16
	case selL4proto:
		return &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg}, 1
	case selDport:
		return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}, 2
	}
	panic(fmt.Sprintf("nftables: no load for selector %d", s))
}

// addrSelectors returns a family's source and destination address fields.
func addrSelectors(v6 bool) (saddr, daddr selector) {
	if v6 {
		return selSaddr6, selDaddr6
	}
	return selSaddr4, selDaddr4
}

// keyPart is one field of a concatenated key: a packet field, or (sel
// selNone) a 32-bit constant of a mark-typed field.
type keyPart struct {
	sel  selector
	mark uint32
}

// key is a concatenation of fields, loaded into consecutive registers.
type key []keyPart

func (k key) appendText(b []byte) []byte {
	for i, p := range k {
		if i > 0 {
			b = append(b, fieldSep...)
		}
		if p.sel == selNone {
			b = fmt.Appendf(b, "0x%08x", p.mark)
		} else {
			b = append(b, p.sel.String()...)
		}
	}
	return b
}

func (k key) appendExprs(out []expr.Any) []expr.Any {
	reg := uint32(reg32First)
	for _, p := range k {
		if p.sel == selNone {
			out = append(out, &expr.Immediate{Register: reg, Data: native32(p.mark)})
			reg++
			continue
		}
		load, size := p.sel.load(reg)
		out = append(out, load)
		reg += (size + 3) / 4
	}
	return out
}

// regs are 32-bit register numbers: concatenations fill consecutive ones.
const reg32First = unix.NFT_REG32_00

func cmpReg(op expr.CmpOp, data []byte) *expr.Cmp { return &expr.Cmp{Op: op, Register: 1, Data: data} }

func native32(v uint32) []byte { return binaryutil.NativeEndian.PutUint32(v) }

// bitsNonZero is `SELECTOR & mask != 0` on a register already loaded.
func bitsNonZero(out []expr.Any, mask uint32) []expr.Any {
	return append(out,
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: native32(mask), Xor: native32(0)},
		cmpReg(expr.CmpOpNeq, native32(0)))
}

// ctMatch is `ct state new`, or with dnat `ct status dnat`.
type ctMatch struct{ dnat bool }

func (c ctMatch) appendText(b []byte) []byte {
	if c.dnat {
		return append(b, "ct status dnat"...)
	}
	return append(b, "ct state new"...)
}

func (c ctMatch) appendExprs(out []expr.Any) []expr.Any {
	if c.dnat {
		return bitsNonZero(append(out, &expr.Ct{Key: expr.CtKeySTATUS, Register: 1}), 0x20)
	}
	return bitsNonZero(append(out, &expr.Ct{Key: expr.CtKeySTATE, Register: 1}), 8)
}

// verdict is drop, accept, return, or a jump or goto to chain.
type verdict struct {
	kind  expr.VerdictKind
	chain string
}

func jump(chain string) verdict  { return verdict{kind: expr.VerdictJump, chain: chain} }
func goTo(chain string) verdict  { return verdict{kind: expr.VerdictGoto, chain: chain} }
func (v verdict) word() string   { return verdictWords[v.kind] }
func (v verdict) isChain() bool  { return v.kind == expr.VerdictJump || v.kind == expr.VerdictGoto }
func (v verdict) String() string { return string(v.appendText(nil)) }
func (v verdict) appendExprs(out []expr.Any) []expr.Any {
	return append(out, &expr.Verdict{Kind: v.kind, Chain: v.chain})
}

var verdictWords = map[expr.VerdictKind]string{expr.VerdictDrop: "drop", expr.VerdictAccept: "accept",
	expr.VerdictReturn: "return", expr.VerdictJump: "jump", expr.VerdictGoto: "goto"}

func (v verdict) appendText(b []byte) []byte {
	b = append(b, v.word()...)
	if v.isChain() {
		b = append(append(b, ' '), v.chain...)
	}
	return b
}

// reject is `reject with tcp reset`, or (tcpReset false) `reject`: the
// family's ICMP port unreachable.
type reject struct{ tcpReset, v6 bool }

func (r reject) appendText(b []byte) []byte {
	if r.tcpReset {
		return append(b, "reject with tcp reset"...)
	}
	return append(b, "reject"...)
}

func (r reject) appendExprs(out []expr.Any) []expr.Any {
	if r.tcpReset {
		return append(out, &expr.Reject{Type: unix.NFT_REJECT_TCP_RST})
	}
	code := uint8(icmpPortUnreach)
	if r.v6 {
		code = icmp6PortUnreach
	}
	return append(out, &expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: code})
}

// masquerade is `masquerade fully-random`.
type masquerade struct{}

func (masquerade) appendText(b []byte) []byte { return append(b, "masquerade fully-random"...) }
func (masquerade) appendExprs(out []expr.Any) []expr.Any {
	return append(out, &expr.Masq{FullyRandom: true})
}

// fibLocal is `fib saddr type local` (saddr) or `fib daddr type local`.
type fibLocal struct{ saddr bool }

func (f fibLocal) appendText(b []byte) []byte {
	if f.saddr {
		return append(b, "fib saddr type local"...)
	}
	return append(b, "fib daddr type local"...)
}

func (f fibLocal) appendExprs(out []expr.Any) []expr.Any {
	return append(out, &expr.Fib{Register: 1, FlagSADDR: f.saddr, FlagDADDR: !f.saddr, ResultADDRTYPE: true},
		cmpReg(expr.CmpOpEq, native32(unix.RTN_LOCAL)))
}

// numgenZero is `numgen random mod M 0`: true with probability 1/M; with
// inc, `numgen inc mod M 0`: true every M-th time the rule is evaluated
// (the rule's own counter).
type numgenZero struct {
	mod uint32
	inc bool
}

func (n numgenZero) appendText(b []byte) []byte {
	kind := "numgen random mod "
	if n.inc {
		kind = "numgen inc mod "
	}
	return append(strconv.AppendUint(append(b, kind...), uint64(n.mod), 10), " 0"...)
}

func (n numgenZero) appendExprs(out []expr.Any) []expr.Any {
	typ := uint32(unix.NFT_NG_RANDOM)
	if n.inc {
		typ = unix.NFT_NG_INCREMENTAL
	}
	return append(out, &expr.Numgen{Register: 1, Modulus: n.mod, Type: typ}, cmpReg(expr.CmpOpEq, make([]byte, 4)))
}

// markSet is `mark set mark or V`, or with xor `mark set mark xor V`.
type markSet struct {
	xor bool
	v   uint32
}

func (m markSet) appendText(b []byte) []byte {
	op := "or"
	if m.xor {
		op = "xor"
	}
	return fmt.Appendf(b, "mark set mark %s 0x%08x", op, m.v)
}

func (m markSet) appendExprs(out []expr.Any) []expr.Any {
	mask := ^m.v
	if m.xor {
		mask = ^uint32(0)
	}
	return append(out, &expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: native32(mask), Xor: native32(m.v)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1})
}

// markTest is `mark and M != 0`.
type markTest struct{ mask uint32 }

func (m markTest) appendText(b []byte) []byte { return fmt.Appendf(b, "mark and 0x%08x != 0", m.mask) }
func (m markTest) appendExprs(out []expr.Any) []expr.Any {
	return bitsNonZero(append(out, &expr.Meta{Key: expr.MetaKeyMARK, Register: 1}), m.mask)
}

// setUpdate is `update @set { KEY timeout Ns }`: add the key to a dynamic set
// or refresh it (no timeout when zero). keyLoaded says the lookup just
// before it in the rule left the same key in the registers, so the update
// reads them instead of loading the key again.
type setUpdate struct {
	set       string
	key       key
	timeout   time.Duration
	keyLoaded bool
}

func (u setUpdate) appendText(b []byte) []byte {
	b = u.key.appendText(append(append(append(b, "update @"...), u.set...), " { "...))
	if u.timeout > 0 {
		b = append(strconv.AppendInt(append(b, " timeout "...), int64(u.timeout/time.Second), 10), 's')
	}
	return append(b, " }"...)
}

func (u setUpdate) appendExprs(out []expr.Any) []expr.Any {
	if !u.keyLoaded {
		out = u.key.appendExprs(out)
	}
	return append(out, &expr.Dynset{SrcRegKey: reg32First, SetName: u.set, Operation: unix.NFT_DYNSET_OP_UPDATE, Timeout: u.timeout})
}

// dnatTo is `dnat to ADDR:PORT`.
type dnatTo struct{ to netip.AddrPort }

func (d dnatTo) appendText(b []byte) []byte { return d.to.AppendTo(append(b, "dnat to "...)) }

func (d dnatTo) appendExprs(out []expr.Any) []expr.Any {
	return append(out,
		&expr.Immediate{Register: 1, Data: d.to.Addr().AsSlice()},
		&expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(d.to.Port())},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: uint32(nfproto(d.to.Addr().Is6())), RegAddrMin: 1, RegProtoMin: 2, Specified: true})
}

// nfproto is a family as netlink messages and NAT expressions name it.
func nfproto(v6 bool) byte {
	if v6 {
		return unix.NFPROTO_IPV6
	}
	return unix.NFPROTO_IPV4
}

// dnatMap is `dnat ip to GEN mod M offset B map @set`: the endpoint
// (address . port) of the range the generated number falls in. GEN is
// `numgen random` (gen genRandom), `numgen inc` (genInc: a counter of the
// rule's own, so consecutive connections take consecutive keys) or `jhash
// ip saddr … seed S` (genHash: the client address's bucket).
type dnatMap struct {
	v6          bool
	gen         genKind
	mod, offset uint32
	seed        uint32 // genHash only; never 0 (the kernel would pick one at random)
	set         string
}

// genKind is how a dnatMap makes its number.
type genKind uint8

const (
	genRandom genKind = iota
	genInc
	genHash
)

func (d dnatMap) appendText(b []byte) []byte {
	ipX := "ip"
	if d.v6 {
		ipX = "ip6"
	}
	return d.appendGenText(fmt.Appendf(b, "dnat %s to ", ipX))
}

// appendGenText prints the generator and the map: `GEN mod M offset B map
// @set`.
func (d dnatMap) appendGenText(b []byte) []byte {
	ipX := "ip"
	if d.v6 {
		ipX = "ip6"
	}
	switch d.gen {
	case genInc:
		b = append(b, "numgen inc"...)
	case genHash:
		b = fmt.Appendf(b, "jhash %s saddr", ipX)
	default:
		b = append(b, "numgen random"...)
	}
	b = fmt.Appendf(b, " mod %d", d.mod)
	if d.gen == genHash {
		b = fmt.Appendf(b, " seed 0x%x", d.seed)
	}
	return fmt.Appendf(b, " offset %d map @%s", d.offset, d.set)
}

// protoReg is where the map's data puts the port: after the address.
func (d dnatMap) protoReg() uint32 {
	if d.v6 {
		return unix.NFT_REG32_04
	}
	return unix.NFT_REG32_01
}

func (d dnatMap) appendExprs(out []expr.Any) []expr.Any {
	return append(d.appendGenExprs(out),
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: uint32(nfproto(d.v6)), RegAddrMin: 1, RegProtoMin: d.protoReg()})
}

// appendGenExprs makes the number and looks it up: the endpoint's address
// in register 1, its port in protoReg.
func (d dnatMap) appendGenExprs(out []expr.Any) []expr.Any {
	switch d.gen {
	case genHash:
		saddr, _ := addrSelectors(d.v6)
		load, size := saddr.load(1)
		out = append(out, load, &expr.Hash{SourceRegister: 1, DestRegister: 1, Length: size,
			Modulus: d.mod, Seed: d.seed, Offset: d.offset, Type: expr.HashTypeJenkins})
	case genInc:
		out = append(out, &expr.Numgen{Register: 1, Modulus: d.mod, Type: unix.NFT_NG_INCREMENTAL, Offset: d.offset})
	default:
		out = append(out, &expr.Numgen{Register: 1, Modulus: d.mod, Type: unix.NFT_NG_RANDOM, Offset: d.offset})
	}
	return append(out,
		// The map's keys are ranges, compared as big-endian bytes.
		&expr.Byteorder{SourceRegister: 1, DestRegister: 1, Op: expr.ByteorderHton, Len: 4, Size: 4},
		&expr.Lookup{SourceRegister: 1, DestRegister: 1, IsDestRegSet: true, SetName: d.set})
}

// mapIs is `GEN … map @set == ADDR . PORT`: true when the client's number
// falls in a range of the map whose endpoint is to. Only for jhash
// generators (the same number in every rule of a chain); with session
// affinity, source-hash needs a rule per endpoint, each recording the
// client before its DNAT.
type mapIs struct {
	m  dnatMap
	to netip.AddrPort
}

func (s mapIs) appendText(b []byte) []byte {
	b = s.m.appendGenText(b)
	return fmt.Appendf(b, " == %s . %d", s.to.Addr(), s.to.Port())
}

func (s mapIs) appendExprs(out []expr.Any) []expr.Any {
	out = s.m.appendGenExprs(out)
	port := binaryutil.BigEndian.PutUint16(s.to.Port())
	return append(out, cmpReg(expr.CmpOpEq, s.to.Addr().AsSlice()),
		&expr.Cmp{Op: expr.CmpOpEq, Register: s.m.protoReg(), Data: port})
}

// iifname is `iifname [!=] "NAME"`; a name ending in * matches a prefix.
type iifname struct {
	neg  bool
	name string
}

func (i iifname) appendText(b []byte) []byte {
	b = append(b, "iifname "...)
	if i.neg {
		b = append(b, "!= "...)
	}
	return strconv.AppendQuote(b, i.name)
}

func (i iifname) appendExprs(out []expr.Any) []expr.Any {
	op := expr.CmpOpEq
	if i.neg {
		op = expr.CmpOpNeq
	}
	var data []byte
	if p, ok := strings.CutSuffix(i.name, "*"); ok {
		data = []byte(p)
	} else {
		data = make([]byte, unix.IFNAMSIZ)
		copy(data, i.name)
	}
	return append(out, &expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1}, cmpReg(op, data))
}

// lookup is `KEY @set`, or with vmap `KEY vmap @map`.
type lookup struct {
	key  key
	set  string
	vmap bool
}

func (l lookup) appendText(b []byte) []byte {
	b = append(l.key.appendText(b), ' ')
	if l.vmap {
		b = append(b, "vmap "...)
	}
	return append(append(b, '@'), l.set...)
}

func (l lookup) appendExprs(out []expr.Any) []expr.Any {
	lk := &expr.Lookup{SourceRegister: reg32First, SetName: l.set}
	if l.vmap {
		lk.DestRegister, lk.IsDestRegSet = unix.NFT_REG_VERDICT, true
	}
	return append(l.key.appendExprs(out), lk)
}

// addrCmp is `ip saddr [!=] PREFIX` (an address alone when the prefix is
// one address: what the kernel compares then is the address).
type addrCmp struct {
	sel selector
	neg bool
	p   netip.Prefix
}

func appendPrefix(b []byte, p netip.Prefix) []byte {
	if p.IsSingleIP() {
		return p.Addr().AppendTo(b)
	}
	return p.AppendTo(b)
}

func (a addrCmp) appendText(b []byte) []byte {
	b = append(append(b, a.sel.String()...), ' ')
	if a.neg {
		b = append(b, "!= "...)
	}
	return appendPrefix(b, a.p)
}

func (a addrCmp) appendExprs(out []expr.Any) []expr.Any {
	op := expr.CmpOpEq
	if a.neg {
		op = expr.CmpOpNeq
	}
	p := a.p.Masked()
	load, size := a.sel.load(1)
	out = append(out, load)
	if !p.IsSingleIP() {
		out = append(out, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: size, Mask: prefixMask(p), Xor: make([]byte, size)})
	}
	return append(out, cmpReg(op, p.Addr().AsSlice()))
}

func prefixMask(p netip.Prefix) []byte {
	b := make([]byte, p.Addr().BitLen()/8)
	for i := 0; i < p.Bits(); i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	return b
}

// protoCmp is `meta l4proto [!=] PROTO`.
type protoCmp struct {
	neg   bool
	proto string // tcp, udp or sctp
}

func (p protoCmp) appendText(b []byte) []byte {
	b = append(b, "meta l4proto "...)
	if p.neg {
		b = append(b, "!= "...)
	}
	return append(b, p.proto...)
}

func (p protoCmp) appendExprs(out []expr.Any) []expr.Any {
	op := expr.CmpOpEq
	if p.neg {
		op = expr.CmpOpNeq
	}
	return append(out, &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, cmpReg(op, []byte{protoNumbers[p.proto]}))
}

// allowOnly is `ip saddr != { A, B } drop`, a rule of its own (see
// kernelRules for how the kernel holds it).
type allowOnly struct {
	sel     selector
	allowed []netip.Prefix
}

func (a allowOnly) appendText(b []byte) []byte {
	b = append(append(b, a.sel.String()...), " != { "...)
	for i, p := range a.allowed {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = appendPrefix(b, p)
	}
	return append(b, " } drop"...)
}

// appendExprs is never called: kernelRules expands the rule first.
func (a allowOnly) appendExprs(out []expr.Any) []expr.Any {
	panic("nftables: allowOnly encoded without kernelRules")
}

// foreign stands for a kernel rule (or its rest) that render does not
// write, as nldecode found it; the tracer fails when it reaches one.
type foreign struct{ what string }

func (f foreign) appendText(b []byte) []byte { return append(append(b, "foreign-rule "...), f.what...) }
func (f foreign) appendExprs(out []expr.Any) []expr.Any {
	panic("nftables: a foreign rule is never written")
}
