package nftables

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	gnftables "github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// This file translates the rule text render produces into netlink
// expressions equivalent to what nft generates for the same text. It knows
// exactly render's vocabulary; anything else is errNoNetlink.

// regs are 32-bit register numbers: concatenations fill consecutive ones.
const reg32First = unix.NFT_REG32_00

// ruleExprs translates one rule. A firewall rule `ip saddr != { A, B } drop`
// becomes several kernel rules (`ip saddr A return`, ..., `drop`), which
// is equivalent as it is the last rule of its chain and needs no
// anonymous interval set.
func (n *netlinkReader) ruleExprs(rule string) ([][]expr.Any, error) {
	if head, list, ok := n.allowList(rule); ok {
		var out [][]expr.Any
		for _, item := range list {
			exprs, err := n.oneRule(head + " " + item + " return")
			if err != nil {
				return nil, err
			}
			out = append(out, exprs)
		}
		return append(out, []expr.Any{&expr.Verdict{Kind: expr.VerdictDrop}}), nil
	}
	exprs, err := n.oneRule(rule)
	if err != nil {
		return nil, err
	}
	return [][]expr.Any{exprs}, nil
}

// allowList splits `ip saddr != { A, B } drop` into "ip saddr" and [A B].
func (n *netlinkReader) allowList(rule string) (string, []string, bool) {
	head, rest, ok := strings.Cut(rule, " != { ")
	list, ok2 := strings.CutSuffix(rest, " } drop")
	if !ok || !ok2 || (head != "ip saddr" && head != "ip6 saddr") {
		return "", nil, false
	}
	return head, strings.Split(list, ", "), true
}

func (n *netlinkReader) oneRule(rule string) ([]expr.Any, error) {
	toks := strings.Fields(rule)
	var out []expr.Any
	for len(toks) > 0 {
		exprs, used, err := n.stmt(toks)
		if err != nil {
			return nil, err
		}
		out = append(out, exprs...)
		toks = toks[used:]
	}
	return out, nil
}

func cmpReg(op expr.CmpOp, data []byte) *expr.Cmp { return &expr.Cmp{Op: op, Register: 1, Data: data} }

func native32(v uint32) []byte { return binaryutil.NativeEndian.PutUint32(v) }

// bitsNonZero is `SELECTOR & mask != 0` on a register already loaded.
func bitsNonZero(mask uint32) []expr.Any {
	return []expr.Any{
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: native32(mask), Xor: native32(0)},
		cmpReg(expr.CmpOpNeq, native32(0)),
	}
}

func (n *netlinkReader) stmt(t []string) ([]expr.Any, int, error) {
	at := func(i int) string {
		if i < len(t) {
			return t[i]
		}
		return ""
	}
	switch {
	case at(0) == "ct" && at(1) == "state" && at(2) == "new":
		return append([]expr.Any{&expr.Ct{Key: expr.CtKeySTATE, Register: 1}}, bitsNonZero(8)...), 3, nil
	case at(0) == "ct" && at(1) == "status" && at(2) == "dnat":
		return append([]expr.Any{&expr.Ct{Key: expr.CtKeySTATUS, Register: 1}}, bitsNonZero(0x20)...), 3, nil
	case (at(0) == "jump" || at(0) == "goto") && at(1) != "":
		kind := expr.VerdictJump
		if at(0) == "goto" {
			kind = expr.VerdictGoto
		}
		return []expr.Any{&expr.Verdict{Kind: kind, Chain: at(1)}}, 2, nil
	case at(0) == "drop" || at(0) == "return" || at(0) == "accept":
		kind := map[string]expr.VerdictKind{"drop": expr.VerdictDrop, "return": expr.VerdictReturn, "accept": expr.VerdictAccept}[at(0)]
		return []expr.Any{&expr.Verdict{Kind: kind}}, 1, nil
	case at(0) == "reject" && at(1) == "with" && at(2) == "tcp" && at(3) == "reset":
		return []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_TCP_RST}}, 4, nil
	case at(0) == "reject":
		code := uint8(icmpPortUnreach)
		if n.v6() {
			code = icmp6PortUnreach
		}
		return []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: code}}, 1, nil
	case at(0) == "masquerade" && at(1) == "fully-random":
		return []expr.Any{&expr.Masq{FullyRandom: true}}, 2, nil
	case at(0) == "fib" && (at(1) == "saddr" || at(1) == "daddr") && at(2) == "type" && at(3) == "local":
		return []expr.Any{&expr.Fib{Register: 1, FlagSADDR: at(1) == "saddr", FlagDADDR: at(1) == "daddr", ResultADDRTYPE: true},
			cmpReg(expr.CmpOpEq, native32(unix.RTN_LOCAL))}, 4, nil
	case at(0) == "numgen" && at(1) == "random" && at(2) == "mod" && at(4) == "0":
		m, err := strconv.ParseUint(at(3), 10, 32)
		if err != nil {
			return nil, 0, errNoNetlink
		}
		return []expr.Any{&expr.Numgen{Register: 1, Modulus: uint32(m), Type: unix.NFT_NG_RANDOM},
			cmpReg(expr.CmpOpEq, make([]byte, 4))}, 5, nil
	case at(0) == "mark":
		return markStmt(t)
	case at(0) == "update" && strings.HasPrefix(at(1), "@") && at(2) == "{":
		return n.update(t)
	case at(0) == "dnat" && at(1) == "to":
		return n.dnat(at(2))
	case at(0) == "dnat" && at(2) == "to" && at(3) == "numgen" && at(5) == "mod" && at(7) == "offset" && at(9) == "map":
		return n.mappedDNAT(at(6), at(8), at(10))
	case at(0) == "iifname":
		return iifname(t)
	}
	return n.selectorStmt(t)
}

func (n *netlinkReader) v6() bool { return n.table.Family == gnftables.TableFamilyIPv6 }

// nfproto is the reader's family as netlink messages and NAT expressions
// name it.
func (n *netlinkReader) nfproto() byte {
	if n.v6() {
		return unix.NFPROTO_IPV6
	}
	return unix.NFPROTO_IPV4
}

// update is `update @set { KEY [timeout Ns] }` (KEY as in selectorStmt):
// add or refresh the client in the affinity set.
func (n *netlinkReader) update(t []string) ([]expr.Any, int, error) {
	end := slices.Index(t, "}")
	if end < 0 {
		return nil, 0, errNoNetlink
	}
	body := t[3:end]
	var timeout time.Duration
	if k := len(body); k >= 2 && body[k-2] == "timeout" {
		d, err := time.ParseDuration(body[k-1])
		if err != nil || d <= 0 {
			return nil, 0, errNoNetlink
		}
		timeout, body = d, body[:k-2]
	}
	loads, used, ok := n.key(body)
	if !ok || used != len(body) {
		return nil, 0, errNoNetlink
	}
	return append(loads, &expr.Dynset{SrcRegKey: reg32First, SetName: t[1][1:], Operation: unix.NFT_DYNSET_OP_UPDATE, Timeout: timeout}), end + 1, nil
}

// key loads `SEL [. SEL|0xCONST]...` into consecutive registers from the
// first; a hex constant takes one 32-bit register (a mark-typed field).
func (n *netlinkReader) key(t []string) ([]expr.Any, int, bool) {
	var loads []expr.Any
	reg, i := uint32(reg32First), 0
	for {
		if i >= len(t) {
			return nil, 0, false
		}
		if c, ok := strings.CutPrefix(t[i], "0x"); ok && i > 0 {
			v, err := strconv.ParseUint(c, 16, 32)
			if err != nil {
				return nil, 0, false
			}
			loads = append(loads, &expr.Immediate{Register: reg, Data: native32(uint32(v))})
			reg++
			i++
		} else {
			if i+1 >= len(t) {
				return nil, 0, false
			}
			load, size, ok := n.selector(t[i]+" "+t[i+1], reg)
			if !ok {
				return nil, 0, false
			}
			loads = append(loads, load)
			reg += (size + 3) / 4
			i += 2
		}
		if i >= len(t) || t[i] != "." {
			return loads, i, true
		}
		i++
	}
}

// selector returns the load of `ip daddr`, `meta l4proto`, ... into reg
// and the value's size.
func (n *netlinkReader) selector(sel string, reg uint32) (expr.Any, uint32, bool) {
	addrLen, saddrOff, daddrOff := uint32(4), uint32(12), uint32(16)
	if n.v6() {
		addrLen, saddrOff, daddrOff = 16, 8, 24
	}
	ipX := "ip"
	if n.v6() {
		ipX = "ip6"
	}
	switch sel {
	case ipX + " saddr":
		return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: saddrOff, Len: addrLen}, addrLen, true
	case ipX + " daddr":
		return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: daddrOff, Len: addrLen}, addrLen, true
	case "meta l4proto":
		return &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg}, 1, true
	case "th dport":
		return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}, 2, true
	}
	return nil, 0, false
}

// selectorStmt handles `SEL [. SEL]...` followed by `@set`, `vmap @map`,
// or (one selector) `[!=] value`.
func (n *netlinkReader) selectorStmt(t []string) ([]expr.Any, int, error) {
	loads, i, ok := n.key(t)
	if !ok {
		return nil, 0, errNoNetlink
	}
	rest := t[i:]
	switch {
	case len(rest) > 0 && strings.HasPrefix(rest[0], "@"):
		return append(loads, &expr.Lookup{SourceRegister: reg32First, SetName: rest[0][1:]}), i + 1, nil
	case len(rest) > 1 && rest[0] == "vmap" && strings.HasPrefix(rest[1], "@"):
		return append(loads, &expr.Lookup{SourceRegister: reg32First, SetName: rest[1][1:],
			DestRegister: unix.NFT_REG_VERDICT, IsDestRegSet: true}), i + 2, nil
	case len(loads) == 1:
		return n.compare(t[:2], rest, i)
	}
	return nil, 0, errNoNetlink
}

// compare handles `SEL [!=] value` for a protocol or an address/prefix.
func (n *netlinkReader) compare(sel, rest []string, used int) ([]expr.Any, int, error) {
	op := expr.CmpOpEq
	if len(rest) > 0 && rest[0] == "!=" {
		op, rest, used = expr.CmpOpNeq, rest[1:], used+1
	}
	if len(rest) == 0 {
		return nil, 0, errNoNetlink
	}
	if sel[0] == "meta" {
		p, ok := protoNumbers[rest[0]]
		if !ok {
			return nil, 0, errNoNetlink
		}
		return []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, cmpReg(op, []byte{p})}, used + 1, nil
	}
	exprs, err := n.addrMatch(sel[0]+" "+sel[1], op, rest[0])
	return exprs, used + 1, err
}

// addrMatch compares an address selector with an address or prefix.
func (n *netlinkReader) addrMatch(sel string, op expr.CmpOp, value string) ([]expr.Any, error) {
	p, err := netip.ParsePrefix(value)
	if err != nil {
		a, err2 := netip.ParseAddr(value)
		if err2 != nil {
			return nil, errNoNetlink
		}
		p = netip.PrefixFrom(a, a.BitLen())
	}
	p = p.Masked()
	if p.Addr().Is6() != n.v6() {
		return nil, errNoNetlink
	}
	load, size, _ := n.selector(sel, 1)
	out := []expr.Any{load}
	if p.Bits() < p.Addr().BitLen() {
		out = append(out, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: size,
			Mask: prefixMask(p), Xor: make([]byte, size)})
	}
	return append(out, cmpReg(op, p.Addr().AsSlice())), nil
}

// markStmt handles `mark set mark or|xor V` and `mark and M != 0`.
func markStmt(t []string) ([]expr.Any, int, error) {
	at := func(i int) string {
		if i < len(t) {
			return t[i]
		}
		return ""
	}
	load := &expr.Meta{Key: expr.MetaKeyMARK, Register: 1}
	switch {
	case at(1) == "set" && at(2) == "mark" && (at(3) == "or" || at(3) == "xor"):
		v, err := strconv.ParseUint(at(4), 0, 32)
		if err != nil {
			return nil, 0, errNoNetlink
		}
		mask := ^uint32(v)
		if at(3) == "xor" {
			mask = ^uint32(0)
		}
		return []expr.Any{load,
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: native32(mask), Xor: native32(uint32(v))},
			&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1},
		}, 5, nil
	case at(1) == "and" && at(3) == "!=" && at(4) == "0":
		v, err := strconv.ParseUint(at(2), 0, 32)
		if err != nil {
			return nil, 0, errNoNetlink
		}
		return append([]expr.Any{load}, bitsNonZero(uint32(v))...), 5, nil
	}
	return nil, 0, errNoNetlink
}

func (n *netlinkReader) dnat(target string) ([]expr.Any, int, error) {
	ap, err := netip.ParseAddrPort(target)
	if err != nil {
		return nil, 0, errNoNetlink
	}
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: ap.Addr().AsSlice()},
		&expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(ap.Port())},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: uint32(n.nfproto()), RegAddrMin: 1, RegProtoMin: 2, Specified: true},
	}, 3, nil
}

// mappedDNAT is `dnat ip to numgen random mod M offset B map @endpoint-ranges-…`:
// the map's data (address . port) fills a register pair.
func (n *netlinkReader) mappedDNAT(mod, offset, setRef string) ([]expr.Any, int, error) {
	m, err1 := strconv.ParseUint(mod, 10, 32)
	b, err2 := strconv.ParseUint(offset, 10, 32)
	if err1 != nil || err2 != nil || !strings.HasPrefix(setRef, "@") {
		return nil, 0, errNoNetlink
	}
	fam, protoReg := uint32(unix.NFPROTO_IPV4), uint32(unix.NFT_REG32_01)
	if n.v6() {
		fam, protoReg = unix.NFPROTO_IPV6, unix.NFT_REG32_04
	}
	return []expr.Any{
		&expr.Numgen{Register: 1, Modulus: uint32(m), Type: unix.NFT_NG_RANDOM, Offset: uint32(b)},
		// The map's keys are ranges, compared as big-endian bytes.
		&expr.Byteorder{SourceRegister: 1, DestRegister: 1, Op: expr.ByteorderHton, Len: 4, Size: 4},
		&expr.Lookup{SourceRegister: 1, DestRegister: 1, IsDestRegSet: true, SetName: setRef[1:]},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: fam, RegAddrMin: 1, RegProtoMin: protoReg},
	}, 11, nil
}

// iifname handles `iifname [!=] "name"` and the prefix form "name*".
func iifname(t []string) ([]expr.Any, int, error) {
	op, i := expr.CmpOpEq, 1
	if len(t) > 1 && t[1] == "!=" {
		op, i = expr.CmpOpNeq, 2
	}
	if len(t) <= i {
		return nil, 0, errNoNetlink
	}
	name := strings.Trim(t[i], `"`)
	var data []byte
	if p, ok := strings.CutSuffix(name, "*"); ok {
		data = []byte(p)
	} else {
		if len(name) >= unix.IFNAMSIZ {
			return nil, 0, errNoNetlink
		}
		data = make([]byte, unix.IFNAMSIZ)
		copy(data, name)
	}
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1}, cmpReg(op, data)}, i + 1, nil
}

func prefixMask(p netip.Prefix) []byte {
	b := make([]byte, p.Addr().BitLen()/8)
	for i := 0; i < p.Bits(); i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	return b
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
