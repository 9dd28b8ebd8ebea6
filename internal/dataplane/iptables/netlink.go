package iptables

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/nfacct"
	"github.com/kproxy/kproxy/internal/nfnl"
)

// On the nf_tables backend kproxy writes its restore sections straight to
// the kernel as one nf_tables transaction, in the form iptables-nft (1.8)
// gives the same rules: native expressions for interfaces, protocol,
// addresses, ports and marks, xtables "match"/"target" expressions for the
// rest, a counter before the verdict, and the rule's compat protocol. So
// `iptables-save`, `iptables -L -v` and iptables-nft-restore (upstream's,
// after a migration back) read them as if iptables had written them.
//
// Why: iptables-nft-restore spends ~20 us of CPU per rule parsing and
// building what the kernel then takes in ~13 us, which at 10k Services ×
// 10 endpoints (330k rules) is seconds of user CPU per cold start, and
// every partial sync pays a process start and a cache fetch on top of the
// kernel's own table validation. `KPROXY_SCALE=1 KPROXY_SCALE_BACKENDS=nft
// go test -run 'PrivilegedScale$' -v ./internal/dataplane/iptables/`
// prints a cold start's CPU; figures by commit are in docs/performance.md.
//
// Each rule is encoded from its typed value (rule.go), never from its
// text. Deletions of single rules (which need handles, and come from the
// kernel's iptables-save text) and values the xtables structs cannot hold
// are errNotNetlink, and the caller runs iptables-restore instead.

var errNotNetlink = errors.New("not expressible as a netlink batch")

// encodeSections writes the sections (in restore order) into one batch
// whose chunks come from pool (nil: fresh ones).
func encodeSections(fam model.Family, ws []*tableWrite, pool *nfnl.Pool) (*nfnl.Batch, error) {
	// Netlink takes ~2-3 times the rule text (xtables structs are
	// fixed-size); the hint only sizes an unpooled batch's first chunk.
	b := nfnl.NewBatch(nfproto(fam), pool, 3*sizeOf(ws))
	tables := map[string]bool{}
	e := &encoder{v6: fam == model.IPv6}
	for _, w := range ws {
		if w.empty() {
			continue
		}
		if !tables[w.table] {
			// Create the table if it is missing, as iptables-nft does
			// (no flags: an existing table is left as it is).
			tables[w.table] = true
			m := b.Msg(unix.NFT_MSG_NEWTABLE, unix.NLM_F_CREATE)
			b.AttrStr(unix.NFTA_TABLE_NAME, w.table)
			b.Finish(m)
		}
		if len(w.delRules) > 0 {
			return nil, fmt.Errorf("%w: rule deletions", errNotNetlink)
		}
		chains := w.declared()
		for _, c := range chains {
			declareChain(b, w.table, c.Name)
		}
		for _, name := range w.deletes {
			declareChain(b, w.table, name)
		}
		for _, c := range slices.Concat(chains, w.appends) {
			for i := range c.Rules {
				if err := e.addRule(b, w.table, c.Name, &c.Rules[i], true); err != nil {
					return nil, err
				}
			}
		}
		for i := len(w.inserts) - 1; i >= 0; i-- {
			j := w.inserts[i]
			if err := e.addRule(b, w.table, j.Chain, &j.Rule, false); err != nil {
				return nil, err
			}
		}
		for _, name := range w.deletes {
			m := b.Msg(unix.NFT_MSG_DELCHAIN, 0)
			b.AttrStr(unix.NFTA_CHAIN_TABLE, w.table)
			b.AttrStr(unix.NFTA_CHAIN_NAME, name)
			b.Finish(m)
		}
	}
	return b, nil
}

func nfproto(fam model.Family) byte {
	if fam == model.IPv6 {
		return unix.NFPROTO_IPV6
	}
	return unix.NFPROTO_IPV4
}

// declareChain is iptables-restore's ":NAME - [0:0]": create the chain if
// it is missing, and empty it.
func declareChain(b *nfnl.Batch, table, name string) {
	m := b.Msg(unix.NFT_MSG_NEWCHAIN, unix.NLM_F_CREATE)
	b.AttrStr(unix.NFTA_CHAIN_TABLE, table)
	b.AttrStr(unix.NFTA_CHAIN_NAME, name)
	b.Finish(m)
	m = b.Msg(unix.NFT_MSG_DELRULE, 0)
	b.AttrStr(unix.NFTA_RULE_TABLE, table)
	b.AttrStr(unix.NFTA_RULE_CHAIN, name)
	b.Finish(m)
}

// encoder encodes rules of one family in the order iptables-nft gives
// their expressions: interfaces, protocol, source, destination, then the
// matches in the rule's order, a counter, the target.
type encoder struct {
	v6   bool
	addr [2][16]byte // an address and its mask
}

// addRule appends (or, with appendRule false, inserts at the top) one
// rule.
func (e *encoder) addRule(b *nfnl.Batch, table, chain string, r *rule, appendRule bool) error {
	flags := uint16(unix.NLM_F_CREATE)
	if appendRule {
		flags |= unix.NLM_F_APPEND
	}
	m := b.Msg(unix.NFT_MSG_NEWRULE, flags)
	b.AttrStr(unix.NFTA_RULE_TABLE, table)
	b.AttrStr(unix.NFTA_RULE_CHAIN, chain)
	l := b.Nest(unix.NFTA_RULE_EXPRESSIONS)
	if err := e.encode(b, r, counted(chain, r)); err != nil {
		return fmt.Errorf("rule %q: %w", r.String(), err)
	}
	b.End(l)
	c := b.Nest(unix.NFTA_RULE_COMPAT)
	b.AttrBE32(unix.NFTA_RULE_COMPAT_PROTO, uint32(r.proto))
	var cf uint32
	if r.negated(argProto) {
		cf = unix.NFT_RULE_COMPAT_F_INV
	}
	b.AttrBE32(unix.NFTA_RULE_COMPAT_FLAGS, cf)
	b.End(c)
	b.Finish(m)
	return nil
}

// counted tells whether a rule of chain gets a counter. Two kinds of
// per-endpoint rule do not: the kernel allocates one per CPU for every
// counter, and 100k of them cost ~0.6 s of a cold start at 10k Services ×
// 10 endpoints. The hairpin rule of a KUBE-SEP chain counts what is rarely
// read (a pod reaching itself through its Service); the KUBE-SVC/KUBE-SVL
// rule that picks an endpoint counts what the endpoint's DNAT rule counts
// too. Each endpoint keeps that count, on its DNAT rule.
func counted(chain string, r *rule) bool {
	to := r.target.chain
	return !(strings.HasPrefix(chain, prefixSEP) && to == chainMarkMasq ||
		(strings.HasPrefix(chain, prefixSVC) || strings.HasPrefix(chain, prefixSVL)) && strings.HasPrefix(to, prefixSEP))
}

func (e *encoder) encode(b *nfnl.Batch, r *rule, count bool) error {
	if r.iface != "" {
		ifname(b, unix.NFT_META_IIFNAME, r.iface, r.negated(argIn))
	}
	if r.proto != 0 {
		meta(b, unix.NFT_META_L4PROTO)
		cmp(b, r.negated(argProto), []byte{r.proto})
	}
	srcOff, dstOff := uint32(12), uint32(16)
	if e.v6 {
		srcOff, dstOff = 8, 24
	}
	if err := e.addrMatch(b, srcOff, r.src, r.negated(argSrc)); err != nil {
		return err
	}
	if err := e.addrMatch(b, dstOff, r.dst, r.negated(argDst)); err != nil {
		return err
	}
	for _, k := range r.args {
		if k == argEnd {
			break
		}
		if err := e.encodeMatch(b, r, k); err != nil {
			return err
		}
	}
	if count {
		counter(b)
	}
	return e.encodeTarget(b, &r.target)
}

// addrMatch matches the address at off; nothing for no address, or for
// an all-zero mask, which matches everything (iptables-nft writes nothing
// for it either).
func (e *encoder) addrMatch(b *nfnl.Batch, off uint32, a addr, inv bool) error {
	if !a.ip.IsValid() {
		return nil
	}
	if a.ip.Is6() != e.v6 {
		return fmt.Errorf("%w: address %s in the other family", errNotNetlink, a.ip)
	}
	ip, mask := e.addrBytes(a)
	if allZero(mask) {
		if inv {
			return fmt.Errorf("%w: ! %s matches nothing", errNotNetlink, a.ip)
		}
		return nil
	}
	nlAddr(b, off, ip, mask, inv)
	return nil
}

// addrBytes returns the masked address and the mask of a, kept in e.
func (e *encoder) addrBytes(a addr) (ip, mask []byte) {
	n := a.ip.BitLen() / 8
	ip, mask = e.addr[0][:n], e.addr[1][:n]
	a16 := a.ip.As16()
	copy(ip, a16[16-n:])
	clear(mask)
	if a.form == addrLowBits {
		mask[n-1] = a.bits
	} else {
		for i := 0; i < int(a.bits); i++ {
			mask[i/8] |= 0x80 >> (i % 8)
		}
	}
	for i := range ip {
		ip[i] &= mask[i]
	}
	return ip, mask
}

// expr opens one expression of the rule's list; endExpr closes it.
func expr(b *nfnl.Batch, name string) [2]int {
	el := b.Nest(unix.NFTA_LIST_ELEM)
	b.AttrStr(unix.NFTA_EXPR_NAME, name)
	return [2]int{el, b.Nest(unix.NFTA_EXPR_DATA)}
}

func endExpr(b *nfnl.Batch, e [2]int) {
	b.End(e[1])
	b.End(e[0])
}

func meta(b *nfnl.Batch, key uint32) {
	e := expr(b, "meta")
	b.AttrBE32(unix.NFTA_META_KEY, key)
	b.AttrBE32(unix.NFTA_META_DREG, unix.NFT_REG_1)
	endExpr(b, e)
}

func payload(b *nfnl.Batch, base, off, n uint32) {
	e := expr(b, "payload")
	b.AttrBE32(unix.NFTA_PAYLOAD_DREG, unix.NFT_REG_1)
	b.AttrBE32(unix.NFTA_PAYLOAD_BASE, base)
	b.AttrBE32(unix.NFTA_PAYLOAD_OFFSET, off)
	b.AttrBE32(unix.NFTA_PAYLOAD_LEN, n)
	endExpr(b, e)
}

func cmp(b *nfnl.Batch, inv bool, data []byte) {
	e := expr(b, "cmp")
	b.AttrBE32(unix.NFTA_CMP_SREG, unix.NFT_REG_1)
	op := uint32(unix.NFT_CMP_EQ)
	if inv {
		op = unix.NFT_CMP_NEQ
	}
	b.AttrBE32(unix.NFTA_CMP_OP, op)
	b.Value(unix.NFTA_CMP_DATA, data)
	endExpr(b, e)
}

func bitwise(b *nfnl.Batch, mask []byte) {
	e := expr(b, "bitwise")
	b.AttrBE32(unix.NFTA_BITWISE_SREG, unix.NFT_REG_1)
	b.AttrBE32(unix.NFTA_BITWISE_DREG, unix.NFT_REG_1)
	b.AttrBE32(unix.NFTA_BITWISE_LEN, uint32(len(mask)))
	b.Value(unix.NFTA_BITWISE_MASK, mask)
	b.Value(unix.NFTA_BITWISE_XOR, make([]byte, len(mask)))
	endExpr(b, e)
}

// counter starts at zero: iptables-nft sends zero packets and bytes, the
// kernel's default.
func counter(b *nfnl.Batch) {
	endExpr(b, expr(b, "counter"))
}

// ifname matches an interface name; "name+" matches the prefix.
func ifname(b *nfnl.Batch, key uint32, name string, inv bool) {
	meta(b, key)
	if p, ok := strings.CutSuffix(name, "+"); ok {
		if p != "" {
			cmp(b, inv, []byte(p))
		}
		return
	}
	cmp(b, inv, append([]byte(name), 0))
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// nlAddr loads only the whole-0xff prefix bytes of the mask when the
// rest is zero, and masks with bitwise otherwise (as iptables-nft does).
func nlAddr(b *nfnl.Batch, off uint32, addr, mask []byte, inv bool) {
	full := 0
	for full < len(mask) && mask[full] == 0xff {
		full++
	}
	rest := false
	for _, m := range mask[full:] {
		rest = rest || m != 0
	}
	if rest {
		payload(b, unix.NFT_PAYLOAD_NETWORK_HEADER, off, uint32(len(addr)))
		bitwise(b, mask)
		cmp(b, inv, addr)
		return
	}
	payload(b, unix.NFT_PAYLOAD_NETWORK_HEADER, off, uint32(full))
	cmp(b, inv, addr[:full])
}

// xt appends an xtables match or target expression whose info is size
// bytes filled by fill.
func xt(b *nfnl.Batch, target bool, name string, rev uint32, size int, fill func(p []byte)) {
	kind, nameA, revA, infoA := "match", uint16(unix.NFTA_MATCH_NAME), uint16(unix.NFTA_MATCH_REV), uint16(unix.NFTA_MATCH_INFO)
	if target {
		kind, nameA, revA, infoA = "target", unix.NFTA_TARGET_NAME, unix.NFTA_TARGET_REV, unix.NFTA_TARGET_INFO
	}
	e := expr(b, kind)
	b.AttrStr(nameA, name)
	b.AttrBE32(revA, rev)
	b.AttrZero(infoA, size, fill)
	endExpr(b, e)
}

var ne = binary.NativeEndian

// encodeMatch encodes argument k when it is a match (-m); the others are
// encoded before the matches.
func (e *encoder) encodeMatch(b *nfnl.Batch, r *rule, k argKind) error {
	switch k {
	case argComment:
		if len(r.cmt) > 255 {
			return fmt.Errorf("%w: a comment of %d bytes", errNotNetlink, len(r.cmt))
		}
		xt(b, false, "comment", 0, 256, func(p []byte) { copy(p, r.cmt) })
	case argPortMatch:
		e.portMatch(b, r)
	case argMark:
		meta(b, unix.NFT_META_MARK)
		if r.markMask != math.MaxUint32 {
			bitwise(b, ne.AppendUint32(nil, r.markMask))
		}
		cmp(b, r.negated(argMark), ne.AppendUint32(nil, r.mark))
	case argCtstate:
		xt(b, false, "conntrack", 3, 168, func(p []byte) {
			const flagState = 1 // XT_CONNTRACK_STATE
			ne.PutUint16(p[146:], flagState)
			if r.negated(argCtstate) {
				ne.PutUint16(p[148:], flagState)
			}
			ne.PutUint16(p[150:], r.states)
		})
	case argAddrType:
		var flags uint32
		if r.negated(argAddrType) && r.srcType != 0 {
			flags |= 1 // XT_ADDRTYPE_INVERT_SOURCE
		}
		if r.negated(argAddrType) && r.dstType != 0 {
			flags |= 2 // XT_ADDRTYPE_INVERT_DEST
		}
		xt(b, false, "addrtype", 1, 8, func(p []byte) {
			ne.PutUint16(p[0:], r.srcType)
			ne.PutUint16(p[2:], r.dstType)
			ne.PutUint32(p[4:], flags)
		})
	case argStatistic:
		if r.oneIn == 0 {
			return fmt.Errorf("%w: a probability of 1/0", errNotNetlink)
		}
		if r.nth {
			// xt_statistic_info: mode NTH, every and count N-1 (the
			// kernel's counter starts there, so the first packet
			// matches), packet 0.
			xt(b, false, "statistic", 0, 24, func(p []byte) {
				ne.PutUint16(p[0:], 1)
				ne.PutUint32(p[4:], r.oneIn-1)
				ne.PutUint32(p[12:], r.oneIn-1)
			})
			break
		}
		xt(b, false, "statistic", 0, 24, func(p []byte) { ne.PutUint32(p[4:], probValue(int(r.oneIn))) })
	case argRecent:
		return e.recent(b, &r.recent)
	case argNFAcct:
		// xt_nfacct_match_info_v1: the name (NFACCT_NAME_MAX, 32 bytes
		// with its NUL), then a pointer the kernel fills in.
		if len(r.acct) > nfacct.MaxNameLen {
			return fmt.Errorf("%w: an nfacct name of %d bytes", errNotNetlink, len(r.acct))
		}
		xt(b, false, "nfacct", 1, 40, func(p []byte) { copy(p, r.acct) })
	}
	return nil
}

// portMatch is the destination port of tcp and udp as native expressions
// (a port-less match as the xtables match), and sctp's in the xtables
// match as iptables-nft keeps it (xt_sctp_info: dpts, spts, a 256-byte
// chunk map, the chunk match type, four flag infos, flag_count; flags at
// 284, invflags at 288).
func (e *encoder) portMatch(b *nfnl.Batch, r *rule) {
	lo, hi, inv := r.dport.lo, r.dport.hi, r.negated(argDport)
	hasPort := slices.Contains(r.args[:], argDport)
	switch {
	case r.proto == unix.IPPROTO_SCTP:
		var flags, invFlags uint32
		if hasPort {
			flags = 0x02 // XT_SCTP_DEST_PORTS
			if inv {
				invFlags = 0x02
			}
		}
		xt(b, false, "sctp", 0, 296, func(p []byte) {
			ne.PutUint16(p[0:], lo)
			ne.PutUint16(p[2:], hi)
			for i := range 4 {
				p[268+3*i] = 0xff // flag_info[i].chunktype: none
			}
			ne.PutUint32(p[284:], flags)
			ne.PutUint32(p[288:], invFlags)
		})
	case !hasPort:
		xt(b, false, protoName(r.proto), 0, 16, func(p []byte) {
			ne.PutUint16(p[2:], 0xffff) // source ports 0-65535
			ne.PutUint16(p[6:], 0xffff) // destination ports 0-65535
		})
	case lo == hi:
		payload(b, unix.NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2)
		cmp(b, inv, binary.BigEndian.AppendUint16(nil, lo))
	default:
		payload(b, unix.NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2)
		x := expr(b, "range")
		b.AttrBE32(unix.NFTA_RANGE_SREG, unix.NFT_REG_1)
		op := uint32(unix.NFT_RANGE_EQ)
		if inv {
			op = unix.NFT_RANGE_NEQ
		}
		b.AttrBE32(unix.NFTA_RANGE_OP, op)
		b.Value(unix.NFTA_RANGE_FROM_DATA, binary.BigEndian.AppendUint16(nil, lo))
		b.Value(unix.NFTA_RANGE_TO_DATA, binary.BigEndian.AppendUint16(nil, hi))
		endExpr(b, x)
	}
}

// recent is xt_recent_mtinfo_v1: seconds, hit_count, check_set, invert,
// name[200], side, then the mask at offset 212.
func (e *encoder) recent(b *nfnl.Batch, m *recentMatch) error {
	name := m.name
	if name == "" {
		name = "DEFAULT"
	}
	if len(name) >= 200 {
		return fmt.Errorf("%w: -m recent --name of %d bytes", errNotNetlink, len(name))
	}
	maskLen := 4
	if e.v6 {
		maskLen = 16
	}
	xt(b, false, "recent", 1, 232, func(p []byte) {
		ne.PutUint32(p[0:], m.seconds)
		p[8] = m.ops
		copy(p[10:210], name)
		for i := range maskLen {
			p[212+i] = 0xff
		}
	})
	return nil
}

func (e *encoder) encodeTarget(b *nfnl.Batch, t *target) error {
	switch t.kind {
	case targetNone:
	case targetAccept:
		verdict(b, 1, "") // NF_ACCEPT
	case targetDrop:
		verdict(b, 0, "") // NF_DROP
	case targetReturn:
		verdict(b, unix.NFT_RETURN, "")
	case targetJump:
		verdict(b, unix.NFT_JUMP, t.chain)
	case targetGoto:
		verdict(b, unix.NFT_GOTO, t.chain)
	case targetDNAT:
		if t.to.Addr().Is6() != e.v6 || t.to.Port() == 0 {
			return fmt.Errorf("%w: DNAT to %s", errNotNetlink, t.to)
		}
		xt(b, true, "DNAT", 2, 48, func(p []byte) {
			ne.PutUint32(p[0:], 1|2) // NF_NAT_RANGE_MAP_IPS | NF_NAT_RANGE_PROTO_SPECIFIED
			a := t.to.Addr().AsSlice()
			copy(p[4:], a)
			copy(p[20:], a)
			binary.BigEndian.PutUint16(p[36:], t.to.Port())
			binary.BigEndian.PutUint16(p[38:], t.to.Port())
		})
	case targetMarkOr, targetMarkXor:
		mask := t.mark // --or-mark sets the bits of the mark
		if t.kind == targetMarkXor {
			mask = 0
		}
		xt(b, true, "MARK", 2, 8, func(p []byte) {
			ne.PutUint32(p[0:], t.mark)
			ne.PutUint32(p[4:], mask)
		})
	case targetMasquerade:
		const randomFully = 1 << 4 // NF_NAT_RANGE_PROTO_RANDOM_FULLY
		if e.v6 {
			xt(b, true, "MASQUERADE", 0, 40, func(p []byte) { ne.PutUint32(p[0:], randomFully) })
			break
		}
		xt(b, true, "MASQUERADE", 0, 24, func(p []byte) {
			ne.PutUint32(p[0:], 1) // rangesize
			ne.PutUint32(p[4:], randomFully)
		})
	case targetReject, targetRejectTCPReset:
		code := uint32(3) // ICMP port unreachable (IPT_ICMP_PORT_UNREACHABLE)
		switch {
		case e.v6 && t.kind == targetReject:
			code = 4 // IP6T_ICMP6_PORT_UNREACH
		case e.v6:
			code = 6 // IP6T_TCP_RESET
		case t.kind == targetRejectTCPReset:
			code = 7 // IPT_TCP_RESET
		}
		xt(b, true, "REJECT", 0, 8, func(p []byte) { ne.PutUint32(p[0:], code) })
	default:
		return fmt.Errorf("%w: target kind %d", errNotNetlink, t.kind)
	}
	return nil
}

// verdict is an immediate verdict, to chain for a jump or goto.
func verdict(b *nfnl.Batch, code int32, chain string) {
	x := expr(b, "immediate")
	b.Verdict(code, chain)
	endExpr(b, x)
}

// probValue is statistic's probability field for 1/n as iptables computes
// it from the ten decimals render prints.
func probValue(n int) uint32 {
	if n < len(probValues) {
		return probValues[n]
	}
	return parseProb(probability(n))
}

var probValues = func() []uint32 {
	v := make([]uint32, len(probabilities))
	for i := 1; i < len(v); i++ {
		v[i] = parseProb(probabilities[i])
	}
	return v
}()

func parseProb(s string) uint32 {
	p, _ := strconv.ParseFloat(s, 64)
	return uint32(math.Round(0x80000000 * p))
}
