package iptables

import (
	"fmt"
	"net/netip"
	"strconv"

	"golang.org/x/sys/unix"
)

// rule is one iptables rule as typed values: render builds it once, the
// restore text is printed from it (appendText) and the nf_tables
// expressions are encoded from it (netlink.go). args keeps the order its
// arguments are printed in, which is upstream kube-proxy's and varies
// between rule forms ("-m comment … -m tcp -p tcp -d A --dport P",
// "-d A ! -s B -m comment …"); the encoder orders them the way
// iptables-nft does instead. A rule is comparable: syncs compare rules
// with ==.
type rule struct {
	args   [maxArgs]argKind // in print order, up to the first argEnd
	inv    uint16           // bit 1<<kind: the argument is negated ("!")
	proto  uint8            // -p: unix.IPPROTO_TCP, _UDP or _SCTP
	dport  portSpan         // --dport of the protocol's match (argPortMatch)
	iface  string           // -i: a name, or "name+" for a prefix
	src    addr             // -s
	dst    addr             // -d
	cmt    string           // -m comment --comment
	states uint16           // -m conntrack --ctstate: ctState bits
	// -m addrtype --src-type / --dst-type: addrType bits (0: not given)
	srcType, dstType uint16
	mark, markMask   uint32 // -m mark --mark mark/markMask
	oneIn            uint32 // -m statistic --mode random --probability 1/oneIn, or with nth:
	nth              bool   // -m statistic --mode nth --every oneIn --packet 0
	recent           recentMatch
	acct             string // -m nfacct --nfacct-name acct
	target           target
}

// maxArgs bounds a rule's arguments (the target aside); render's longest
// rules have five.
const maxArgs = 8

// argKind is one argument of a rule, as printed.
type argKind uint8

const (
	argEnd       argKind = iota
	argIn                // [!] -i iface
	argProto             // [!] -p proto
	argSrc               // [!] -s src
	argDst               // [!] -d dst
	argComment           // -m comment --comment cmt
	argPortMatch         // -m tcp -p tcp: the protocol and its match, which holds dport
	argDport             // [!] --dport dport (an option of argPortMatch's match)
	argCtstate           // -m conntrack [!] --ctstate states
	argAddrType          // -m addrtype [!] --src-type srcType / --dst-type dstType
	argMark              // -m mark [!] --mark mark/markMask
	argStatistic         // -m statistic --mode random --probability 1/oneIn
	argRecent            // -m recent --name … (recent)
	argNFAcct            // -m nfacct --nfacct-name acct: counts, always matches
)

// addr is the address of -s or -d in one of three spellings.
type addr struct {
	ip   netip.Addr
	bits uint8
	form addrForm
}

type addrForm uint8

const (
	addrPrefix  addrForm = iota // ip/bits
	addrBare                    // ip alone (every bit)
	addrLowBits                 // the address's last byte under the mask bits: ip's last byte (dispatch.go)
)

// prefixAddr is a prefix as given (printed as given, masked when encoded).
func prefixAddr(p netip.Prefix) addr { return addr{ip: p.Addr(), bits: uint8(p.Bits())} }

// bareAddr is one address, printed without a length.
func bareAddr(a netip.Addr) addr { return addr{ip: a, bits: uint8(a.BitLen()), form: addrBare} }

// lowBitsAddr matches addresses of the family whose last byte under mask
// is v.
func lowBitsAddr(v6 bool, v, mask uint8) addr {
	ip := netip.AddrFrom4([4]byte{0, 0, 0, v})
	if v6 {
		ip = netip.AddrFrom16([16]byte{15: v})
	}
	return addr{ip: ip, bits: mask, form: addrLowBits}
}

// portSpan is a destination port or range (hi == lo: one port).
type portSpan struct{ lo, hi uint16 }

// ctState bits, the kernel's XT_CONNTRACK_STATE values.
const (
	ctInvalid     uint16 = 1 << 0
	ctEstablished uint16 = 1 << 1
	ctRelated     uint16 = 1 << 2
	ctNew         uint16 = 1 << 3
	ctDNAT        uint16 = 1 << 7
)

// ctStateNames in the order iptables prints them.
var ctStateNames = []struct {
	bit  uint16
	name string
}{{ctInvalid, "INVALID"}, {ctNew, "NEW"}, {ctRelated, "RELATED"}, {ctEstablished, "ESTABLISHED"}, {ctDNAT, "DNAT"}}

// addrLocal is addrtype's LOCAL (XT_ADDRTYPE_LOCAL).
const addrLocal uint16 = 1 << 2

// recentMatch is -m recent: its table name and what it does with it.
type recentMatch struct {
	name    string
	seconds uint32
	ops     uint8 // recentSet | recentRcheck | recentReap
}

// recentMatch ops, the kernel's XT_RECENT values.
const (
	recentRcheck uint8 = 1
	recentSet    uint8 = 2
	recentReap   uint8 = 32
)

// target is what a matching rule does; the zero target is none (the rule
// only counts, like KUBE-FW's last rule).
type target struct {
	chain string         // jump, goto
	to    netip.AddrPort // DNAT
	mark  uint32         // MARK
	kind  targetKind
}

type targetKind uint8

const (
	targetNone targetKind = iota
	targetAccept
	targetDrop
	targetReturn
	targetJump           // -j chain
	targetGoto           // -g chain
	targetDNAT           // -j DNAT --to-destination to
	targetMarkOr         // -j MARK --or-mark mark
	targetMarkXor        // -j MARK --xor-mark mark
	targetMasquerade     // -j MASQUERADE --random-fully
	targetReject         // -j REJECT (ICMP port unreachable)
	targetRejectTCPReset // -j REJECT --reject-with tcp-reset
)

func (r *rule) negated(k argKind) bool { return r.inv&(1<<k) != 0 }

// builder adds a rule's arguments in print order: render writes
// rb().comment(c).portMatch(p).dst(a).dport(80).jump(chain).
type builder struct {
	r   rule
	n   int
	neg bool
}

func rb() *builder { return &builder{} }

func (b *builder) push(k argKind) *builder {
	b.r.args[b.n] = k
	b.n++
	if b.neg {
		b.r.inv |= 1 << k
		b.neg = false
	}
	return b
}

// not negates the next argument.
func (b *builder) not() *builder { b.neg = true; return b }

func (b *builder) in(iface string) *builder  { b.r.iface = iface; return b.push(argIn) }
func (b *builder) proto(p uint8) *builder    { b.r.proto = p; return b.push(argProto) }
func (b *builder) src(a addr) *builder       { b.r.src = a; return b.push(argSrc) }
func (b *builder) dst(a addr) *builder       { b.r.dst = a; return b.push(argDst) }
func (b *builder) comment(c string) *builder { b.r.cmt = c; return b.push(argComment) }
func (b *builder) ctstate(s uint16) *builder { b.r.states = s; return b.push(argCtstate) }
func (b *builder) srcType(t uint16) *builder { b.r.srcType = t; return b.addrType() }
func (b *builder) dstType(t uint16) *builder { b.r.dstType = t; return b.addrType() }
func (b *builder) oneIn(n int) *builder      { b.r.oneIn = uint32(n); return b.push(argStatistic) }
func (b *builder) everyNth(n int) *builder {
	b.r.oneIn, b.r.nth = uint32(n), true
	return b.push(argStatistic)
}
func (b *builder) recent(m recentMatch) *builder { b.r.recent = m; return b.push(argRecent) }

// nfacct counts the rule's packets into the named nfacct counter.
func (b *builder) nfacct(name string) *builder { b.r.acct = name; return b.push(argNFAcct) }

// addrType adds the addrtype match once, for either or both types.
func (b *builder) addrType() *builder {
	for _, k := range b.r.args[:b.n] {
		if k == argAddrType {
			return b
		}
	}
	return b.push(argAddrType)
}

// portMatch is "-m p -p p": the protocol, and its match for dport.
func (b *builder) portMatch(p uint8) *builder { b.r.proto = p; return b.push(argPortMatch) }

func (b *builder) dport(lo, hi uint16) *builder {
	b.r.dport = portSpan{lo, hi}
	return b.push(argDport)
}

func (b *builder) markMatch(mark, mask uint32) *builder {
	b.r.mark, b.r.markMask = mark, mask
	return b.push(argMark)
}

// local adds the local-traffic match m (see localMatch); nothing when m
// is zero.
func (b *builder) local(m localMatch) *builder {
	switch {
	case m.iface != "":
		return b.in(m.iface)
	case m.cidr.IsValid():
		return b.src(prefixAddr(m.cidr))
	}
	b.neg = false
	return b
}

// The targets end the rule.
func (b *builder) to(t target) rule      { b.r.target = t; return b.r }
func (b *builder) none() rule            { return b.r }
func (b *builder) accept() rule          { return b.to(target{kind: targetAccept}) }
func (b *builder) drop() rule            { return b.to(target{kind: targetDrop}) }
func (b *builder) ret() rule             { return b.to(target{kind: targetReturn}) }
func (b *builder) jump(c string) rule    { return b.to(target{kind: targetJump, chain: c}) }
func (b *builder) goTo(c string) rule    { return b.to(target{kind: targetGoto, chain: c}) }
func (b *builder) masquerade() rule      { return b.to(target{kind: targetMasquerade}) }
func (b *builder) markOr(m uint32) rule  { return b.to(target{kind: targetMarkOr, mark: m}) }
func (b *builder) markXor(m uint32) rule { return b.to(target{kind: targetMarkXor, mark: m}) }
func (b *builder) dnat(to netip.AddrPort) rule {
	return b.to(target{kind: targetDNAT, to: to})
}

// protoName is the name of protocol number p.
func protoName(p uint8) string {
	switch p {
	case unix.IPPROTO_TCP:
		return "tcp"
	case unix.IPPROTO_UDP:
		return "udp"
	case unix.IPPROTO_SCTP:
		return "sctp"
	}
	return strconv.Itoa(int(p))
}

// String is the rule as iptables-restore reads it after "-A <chain> ".
func (r rule) String() string { return string(r.appendText(nil)) }

// appendText appends the rule's restore text to b.
func (r *rule) appendText(b []byte) []byte {
	start := len(b)
	sep := func() {
		if len(b) > start {
			b = append(b, ' ')
		}
	}
	for _, k := range r.args {
		if k == argEnd {
			break
		}
		sep()
		neg := r.negated(k)
		if neg && k <= argDst {
			b = append(b, "! "...)
		}
		b = r.appendArg(b, k, neg)
	}
	if r.target.kind != targetNone {
		sep()
		b = r.target.appendText(b)
	}
	return b
}

func (r *rule) appendArg(b []byte, k argKind, neg bool) []byte {
	not := func(b []byte) []byte {
		if neg {
			return append(b, "! "...)
		}
		return b
	}
	switch k {
	case argIn:
		return append(append(b, "-i "...), r.iface...)
	case argProto:
		return append(append(b, "-p "...), protoName(r.proto)...)
	case argSrc:
		return r.src.appendText(append(b, "-s "...))
	case argDst:
		return r.dst.appendText(append(b, "-d "...))
	case argComment:
		return appendComment(append(b, "-m comment --comment "...), r.cmt)
	case argPortMatch:
		p := protoName(r.proto)
		return append(append(append(append(b, "-m "...), p...), " -p "...), p...)
	case argDport:
		b = strconv.AppendUint(append(not(b), "--dport "...), uint64(r.dport.lo), 10)
		if r.dport.hi != r.dport.lo {
			b = strconv.AppendUint(append(b, ':'), uint64(r.dport.hi), 10)
		}
		return b
	case argCtstate:
		return appendStates(append(not(append(b, "-m conntrack "...)), "--ctstate "...), r.states)
	case argAddrType:
		b = append(b, "-m addrtype"...)
		if r.srcType != 0 {
			b = append(append(not(append(b, ' ')), "--src-type "...), addrTypeName(r.srcType)...)
		}
		if r.dstType != 0 {
			b = append(append(not(append(b, ' ')), "--dst-type "...), addrTypeName(r.dstType)...)
		}
		return b
	case argMark:
		return fmt.Appendf(not(append(b, "-m mark "...)), "--mark %#08x/%#08x", r.mark, r.markMask)
	case argStatistic:
		if r.nth {
			return fmt.Appendf(b, "-m statistic --mode nth --every %d --packet 0", r.oneIn)
		}
		return append(append(b, "-m statistic --mode random --probability "...), probability(int(r.oneIn))...)
	case argRecent:
		return r.recent.appendText(b)
	case argNFAcct:
		return append(append(b, "-m nfacct --nfacct-name "...), r.acct...)
	}
	panic(fmt.Sprintf("iptables: argument kind %d", k))
}

// appendComment quotes text when it has blanks, as iptables-save does.
func appendComment(b []byte, text string) []byte {
	for i := 0; i < len(text); i++ {
		if text[i] == ' ' || text[i] == '\t' {
			return append(append(append(b, '"'), text...), '"')
		}
	}
	return append(b, text...)
}

func appendStates(b []byte, states uint16) []byte {
	first := true
	for _, s := range ctStateNames {
		if states&s.bit != 0 {
			if !first {
				b = append(b, ',')
			}
			b, first = append(b, s.name...), false
		}
	}
	return b
}

func addrTypeName(t uint16) string {
	if t == addrLocal {
		return "LOCAL"
	}
	return strconv.Itoa(int(t))
}

func (a addr) appendText(b []byte) []byte {
	switch a.form {
	case addrBare:
		return a.ip.AppendTo(b)
	case addrLowBits:
		v := a.ip.As16()[15]
		if a.ip.Is6() {
			return fmt.Appendf(b, "::%x/::%x", v, a.bits)
		}
		return fmt.Appendf(b, "0.0.0.%d/0.0.0.%d", v, a.bits)
	}
	return strconv.AppendUint(append(a.ip.AppendTo(b), '/'), uint64(a.bits), 10)
}

func (m *recentMatch) appendText(b []byte) []byte {
	b = append(append(b, "-m recent --name "...), m.name...)
	if m.ops&recentSet != 0 {
		b = append(b, " --set"...)
	}
	if m.ops&recentRcheck != 0 {
		b = append(b, " --rcheck"...)
	}
	if m.seconds != 0 {
		b = strconv.AppendUint(append(b, " --seconds "...), uint64(m.seconds), 10)
	}
	if m.ops&recentReap != 0 {
		b = append(b, " --reap"...)
	}
	return b
}

// name is the target's name after -j or -g: a chain, or a verdict or
// target extension such as ACCEPT or DNAT; "" for none.
func (t *target) name() string {
	switch t.kind {
	case targetJump, targetGoto:
		return t.chain
	case targetNone:
		return ""
	}
	return targetNames[t.kind]
}

var targetNames = [...]string{targetAccept: "ACCEPT", targetDrop: "DROP", targetReturn: "RETURN", targetDNAT: "DNAT",
	targetMarkOr: "MARK", targetMarkXor: "MARK", targetMasquerade: "MASQUERADE", targetReject: "REJECT", targetRejectTCPReset: "REJECT"}

func (t *target) appendText(b []byte) []byte {
	switch t.kind {
	case targetAccept:
		return append(b, "-j ACCEPT"...)
	case targetDrop:
		return append(b, "-j DROP"...)
	case targetReturn:
		return append(b, "-j RETURN"...)
	case targetJump:
		return append(append(b, "-j "...), t.chain...)
	case targetGoto:
		return append(append(b, "-g "...), t.chain...)
	case targetDNAT:
		return t.to.AppendTo(append(b, "-j DNAT --to-destination "...))
	case targetMarkOr:
		return fmt.Appendf(b, "-j MARK --or-mark %#08x", t.mark)
	case targetMarkXor:
		return fmt.Appendf(b, "-j MARK --xor-mark %#08x", t.mark)
	case targetMasquerade:
		return append(b, "-j MASQUERADE --random-fully"...)
	case targetReject:
		return append(b, "-j REJECT"...)
	case targetRejectTCPReset:
		return append(b, "-j REJECT --reject-with tcp-reset"...)
	}
	panic(fmt.Sprintf("iptables: target kind %d", t.kind))
}

// ipProto is the number of protocol tcp, udp or sctp.
func ipProto(name string) uint8 {
	switch name {
	case "tcp":
		return unix.IPPROTO_TCP
	case "udp":
		return unix.IPPROTO_UDP
	}
	return unix.IPPROTO_SCTP
}

// textSize estimates the length of the rule's text (a hint for buffers).
func (r *rule) textSize() int {
	return 60 + len(r.cmt) + len(r.iface) + len(r.target.chain) + len(r.recent.name)
}
