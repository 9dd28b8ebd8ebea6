package iptables

import (
	"bytes"
	"os"
	"testing"

	"encoding/binary"
	"fmt"
	"github.com/kproxy/kproxy/internal/dataplane/dptest"
	"math"
	"net/netip"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/nfnl"
)

// expressions: interfaces, protocol, source, destination, then matches in
// their order, a counter, the target. One oldXtRule is reused for every rule
// of a batch (parse resets it): at 10k Services a full sync parses
// 330k rules.
type oldXtRule struct {
	v6               bool
	iif, oif         string
	iifInv, oifInv   bool
	proto            byte
	protoInv         bool
	src, dst         []byte // address, masked (nil: none)
	srcMask, dstMask []byte
	srcInv, dstInv   bool
	matches          []oldXtModule
	target           *oldXtModule // nil, or &tgt
	verdict          int32
	chain            string // jump or goto target
	noCounter        bool

	toks           []string
	tgt            oldXtModule
	srcBuf, dstBuf [2][16]byte // address and mask storage
}

// oldXtModule is one -m module or -j target with its options.
type oldXtModule struct {
	name string
	opts []oldXtOpt
}

type oldXtOpt struct {
	name  string
	value string
	inv   bool
}

func (m *oldXtModule) opt(name string) (oldXtOpt, bool) {
	for _, o := range m.opts {
		if o.name == name {
			return o, true
		}
	}
	return oldXtOpt{}, false
}

// oldTakesValue lists the options render writes that have an argument.
var oldTakesValue = map[string]bool{
	"--comment": true, "--dport": true, "--ctstate": true, "--dst-type": true, "--src-type": true,
	"--mark": true, "--mode": true, "--probability": true, "--name": true, "--seconds": true,
	"--to-destination": true, "--or-mark": true, "--xor-mark": true, "--set-xmark": true,
	"--reject-with": true, "--mask": true,
}

// parse makes r the rule text after "-A <chain> ", reusing r's storage.
func (r *oldXtRule) parse(fam model.Family, rule string) error {
	matches := r.matches[:0]
	*r = oldXtRule{v6: fam == model.IPv6, verdict: math.MinInt32, toks: appendArgs(r.toks[:0], rule),
		tgt: oldXtModule{opts: r.tgt.opts[:0]}, srcBuf: r.srcBuf, dstBuf: r.dstBuf}
	toks := r.toks
	// cur is the module (or target) taking options: an index into
	// r.matches, or -2 for the target, -1 for none.
	cur := -1
	inv := false
	for i := 0; i < len(toks); i++ {
		t := toks[i]
		if t == "!" {
			inv = true
			continue
		}
		arg := func() (string, error) {
			if i+1 >= len(toks) {
				return "", fmt.Errorf("%w: %s without a value in %q", errNotNetlink, t, rule)
			}
			i++
			return toks[i], nil
		}
		var err error
		var v string
		switch t {
		case "-m":
			if v, err = arg(); err == nil {
				// Reuse the options storage of an earlier rule's module.
				if len(matches) < cap(matches) {
					matches = matches[:len(matches)+1]
					m := &matches[len(matches)-1]
					m.name, m.opts = v, m.opts[:0]
				} else {
					matches = append(matches, oldXtModule{name: v})
				}
				cur = len(matches) - 1
			}
		case "-j", "-g":
			if v, err = arg(); err == nil {
				err = r.setTarget(t == "-g", v)
				cur = -2
			}
		case "-p":
			if v, err = arg(); err == nil {
				r.protoInv = inv
				r.proto, err = oldProtoNumber(v)
			}
		case "-s", "-d":
			if v, err = arg(); err == nil {
				buf := &r.srcBuf
				if t == "-d" {
					buf = &r.dstBuf
				}
				var a, m []byte
				if a, m, err = oldParseAddr(buf, fam, v); err == nil && inv && allZero(m) {
					err = fmt.Errorf("%w: ! %s %s matches nothing", errNotNetlink, t, v)
				}
				if err == nil {
					if t == "-s" {
						r.src, r.srcMask, r.srcInv = a, m, inv
					} else {
						r.dst, r.dstMask, r.dstInv = a, m, inv
					}
				}
			}
		case "-i", "-o":
			if v, err = arg(); err == nil {
				if t == "-i" {
					r.iif, r.iifInv = v, inv
				} else {
					r.oif, r.oifInv = v, inv
				}
			}
		default:
			if !strings.HasPrefix(t, "--") || cur == -1 || cur == -2 && r.target == nil {
				return fmt.Errorf("%w: %q in %q", errNotNetlink, t, rule)
			}
			o := oldXtOpt{name: t, inv: inv}
			if oldTakesValue[t] {
				o.value, err = arg()
			}
			if cur == -2 {
				r.tgt.opts = append(r.tgt.opts, o)
			} else {
				matches[cur].opts = append(matches[cur].opts, o)
			}
		}
		if err != nil {
			return err
		}
		inv = false
	}
	r.matches = matches
	return nil
}

func (r *oldXtRule) setTarget(isGoto bool, name string) error {
	switch name {
	case "ACCEPT":
		r.verdict = 1 // NF_ACCEPT
	case "DROP":
		r.verdict = 0 // NF_DROP
	case "RETURN":
		r.verdict = unix.NFT_RETURN
	case "DNAT", "MARK", "MASQUERADE", "REJECT":
		r.tgt.name = name
		r.target = &r.tgt
	default:
		if strings.ToUpper(name) != name {
			return fmt.Errorf("%w: target %s", errNotNetlink, name)
		}
		r.chain, r.verdict = name, unix.NFT_JUMP
		if isGoto {
			r.verdict = unix.NFT_GOTO
		}
	}
	if isGoto && r.chain == "" {
		return fmt.Errorf("%w: goto %s", errNotNetlink, name)
	}
	return nil
}

func oldProtoNumber(p string) (byte, error) {
	switch p {
	case "tcp":
		return unix.IPPROTO_TCP, nil
	case "udp":
		return unix.IPPROTO_UDP, nil
	case "sctp":
		return unix.IPPROTO_SCTP, nil
	}
	return 0, fmt.Errorf("%w: protocol %s", errNotNetlink, p)
}

// oldParseAddr reads "a", "a/len" or "a/mask" and returns the masked address
// and the mask, kept in buf.
func oldParseAddr(buf *[2][16]byte, fam model.Family, s string) (addr, mask []byte, err error) {
	a, m, hasMask := strings.Cut(s, "/")
	ip, err := netip.ParseAddr(a)
	if err != nil || ip.Is6() != (fam == model.IPv6) {
		return nil, nil, fmt.Errorf("%w: address %q", errNotNetlink, s)
	}
	n := ip.BitLen() / 8
	addr, mask = buf[0][:n], buf[1][:n]
	if ip.Is4() {
		a4 := ip.As4()
		copy(addr, a4[:])
	} else {
		a16 := ip.As16()
		copy(addr, a16[:])
	}
	clear(mask)
	bits := len(addr) * 8
	if hasMask {
		if mip, err := netip.ParseAddr(m); err == nil && mip.BitLen() == bits {
			copy(mask, mip.AsSlice())
			bits = -1
		} else if n, err := strconv.Atoi(m); err == nil && n >= 0 && n <= bits {
			bits = n
		} else {
			return nil, nil, fmt.Errorf("%w: address %q", errNotNetlink, s)
		}
	}
	for i := 0; i < bits; i++ {
		mask[i/8] |= 0x80 >> (i % 8)
	}
	for i := range addr {
		addr[i] &= mask[i]
	}
	return addr, mask, nil
}

// oldAddRule appends (or, with appendRule false, inserts at the top) one
// rule, parsed into r.
func oldAddRule(b *nfnl.Batch, r *oldXtRule, fam model.Family, table, chain, text string, appendRule bool) error {
	if err := r.parse(fam, text); err != nil {
		return err
	}
	flags := uint16(unix.NLM_F_CREATE)
	if appendRule {
		flags |= unix.NLM_F_APPEND
	}
	m := b.Msg(unix.NFT_MSG_NEWRULE, flags)
	b.AttrStr(unix.NFTA_RULE_TABLE, table)
	b.AttrStr(unix.NFTA_RULE_CHAIN, chain)
	// Two kinds of per-endpoint rule get no counter: the kernel allocates
	// one per CPU for every counter, and 100k of them cost ~0.6 s of a cold
	// start at 10k Services × 10 endpoints. The hairpin rule of a KUBE-SEP
	// chain counts what is rarely read (a pod reaching itself through its
	// Service); the KUBE-SVC/KUBE-SVL rule that picks an endpoint counts
	// what the endpoint's DNAT rule counts too. Each endpoint keeps that
	// count, on its DNAT rule.
	r.noCounter = strings.HasPrefix(chain, prefixSEP) && r.chain == chainMarkMasq ||
		(strings.HasPrefix(chain, prefixSVC) || strings.HasPrefix(chain, prefixSVL)) && strings.HasPrefix(r.chain, prefixSEP)
	l := b.Nest(unix.NFTA_RULE_EXPRESSIONS)
	if err := r.encode(b); err != nil {
		return fmt.Errorf("rule %q: %w", text, err)
	}
	b.End(l)
	c := b.Nest(unix.NFTA_RULE_COMPAT)
	b.AttrBE32(unix.NFTA_RULE_COMPAT_PROTO, uint32(r.proto))
	var cf uint32
	if r.protoInv {
		cf = unix.NFT_RULE_COMPAT_F_INV
	}
	b.AttrBE32(unix.NFTA_RULE_COMPAT_FLAGS, cf)
	b.End(c)
	b.Finish(m)
	return nil
}

func (r *oldXtRule) encode(b *nfnl.Batch) error {
	if r.iif != "" {
		ifname(b, unix.NFT_META_IIFNAME, r.iif, r.iifInv)
	}
	if r.oif != "" {
		ifname(b, unix.NFT_META_OIFNAME, r.oif, r.oifInv)
	}
	if r.proto != 0 {
		meta(b, unix.NFT_META_L4PROTO)
		cmp(b, r.protoInv, []byte{r.proto})
	}
	srcOff, dstOff := uint32(12), uint32(16)
	if r.v6 {
		srcOff, dstOff = 8, 24
	}
	// An address with an all-zero mask matches everything: iptables-nft
	// writes nothing for it (parse refuses the inverted form).
	if r.src != nil && !allZero(r.srcMask) {
		nlAddr(b, srcOff, r.src, r.srcMask, r.srcInv)
	}
	if r.dst != nil && !allZero(r.dstMask) {
		nlAddr(b, dstOff, r.dst, r.dstMask, r.dstInv)
	}
	for i := range r.matches {
		if err := r.encodeMatch(b, &r.matches[i]); err != nil {
			return err
		}
	}
	if !r.noCounter {
		counter(b)
	}
	if r.target != nil {
		return r.encodeTarget(b, r.target)
	}
	if r.verdict != math.MinInt32 {
		e := expr(b, "immediate")
		b.AttrBE32(unix.NFTA_IMMEDIATE_DREG, unix.NFT_REG_VERDICT)
		d := b.Nest(unix.NFTA_IMMEDIATE_DATA)
		v := b.Nest(unix.NFTA_DATA_VERDICT)
		b.AttrBE32(unix.NFTA_VERDICT_CODE, uint32(r.verdict))
		if r.chain != "" {
			b.AttrStr(unix.NFTA_VERDICT_CHAIN, r.chain)
		}
		b.End(v)
		b.End(d)
		endExpr(b, e)
	}
	return nil
}

func (r *oldXtRule) encodeMatch(b *nfnl.Batch, m *oldXtModule) error {
	bad := func(what string) error { return fmt.Errorf("%w: -m %s %s", errNotNetlink, m.name, what) }
	switch m.name {
	case "comment":
		o, ok := m.opt("--comment")
		if !ok || len(m.opts) != 1 || len(o.value) > 255 {
			return bad("options")
		}
		xt(b, false, "comment", 0, 256, func(p []byte) { copy(p, o.value) })
	case "tcp", "udp":
		if len(m.opts) == 0 {
			xt(b, false, m.name, 0, 16, func(p []byte) {
				ne.PutUint16(p[2:], 0xffff) // source ports 0-65535
				ne.PutUint16(p[6:], 0xffff) // destination ports 0-65535
			})
			return nil
		}
		o, ok := m.opt("--dport")
		if !ok || len(m.opts) != 1 {
			return bad("options")
		}
		lo, hi, err := oldPortRange(o.value)
		if err != nil {
			return bad(o.value)
		}
		payload(b, unix.NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2)
		if lo == hi {
			cmp(b, o.inv, binary.BigEndian.AppendUint16(nil, lo))
			return nil
		}
		e := expr(b, "range")
		b.AttrBE32(unix.NFTA_RANGE_SREG, unix.NFT_REG_1)
		op := uint32(unix.NFT_RANGE_EQ)
		if o.inv {
			op = unix.NFT_RANGE_NEQ
		}
		b.AttrBE32(unix.NFTA_RANGE_OP, op)
		b.Value(unix.NFTA_RANGE_FROM_DATA, binary.BigEndian.AppendUint16(nil, lo))
		b.Value(unix.NFTA_RANGE_TO_DATA, binary.BigEndian.AppendUint16(nil, hi))
		endExpr(b, e)
	case "sctp":
		// iptables-nft keeps SCTP ports in the xtables match
		// (xt_sctp_info: dpts, spts, a 256-byte chunk map, the chunk
		// match type, four flag infos, flag_count; flags at 284,
		// invflags at 288).
		var lo, hi uint16
		var flags uint32
		var inv uint32
		for _, o := range m.opts {
			if o.name != "--dport" {
				return bad(o.name)
			}
			var err error
			if lo, hi, err = oldPortRange(o.value); err != nil {
				return bad(o.value)
			}
			flags |= 0x02 // XT_SCTP_DEST_PORTS
			if o.inv {
				inv |= 0x02
			}
		}
		xt(b, false, "sctp", 0, 296, func(p []byte) {
			ne.PutUint16(p[0:], lo)
			ne.PutUint16(p[2:], hi)
			for i := range 4 {
				p[268+3*i] = 0xff // flag_info[i].chunktype: none
			}
			ne.PutUint32(p[284:], flags)
			ne.PutUint32(p[288:], inv)
		})
	case "mark":
		o, ok := m.opt("--mark")
		if !ok || len(m.opts) != 1 {
			return bad("options")
		}
		val, mask, err := oldMarkMask(o.value)
		if err != nil {
			return bad(o.value)
		}
		meta(b, unix.NFT_META_MARK)
		if mask != math.MaxUint32 {
			bitwise(b, ne.AppendUint32(nil, mask))
		}
		cmp(b, o.inv, ne.AppendUint32(nil, val))
	case "conntrack":
		o, ok := m.opt("--ctstate")
		if !ok || len(m.opts) != 1 {
			return bad("options")
		}
		var states uint16
		for _, s := range strings.Split(o.value, ",") {
			bit, ok := oldCtStates[s]
			if !ok {
				return bad(s)
			}
			states |= bit
		}
		xt(b, false, "conntrack", 3, 168, func(p []byte) {
			const flagState = 1 // XT_CONNTRACK_STATE
			ne.PutUint16(p[146:], flagState)
			if o.inv {
				ne.PutUint16(p[148:], flagState)
			}
			ne.PutUint16(p[150:], states)
		})
	case "addrtype":
		var src, dst uint16
		var flags uint32
		for _, o := range m.opts {
			t, ok := oldAddrTypes[o.value]
			if !ok {
				return bad(o.value)
			}
			switch o.name {
			case "--src-type":
				src = t
				if o.inv {
					flags |= 1 // XT_ADDRTYPE_INVERT_SOURCE
				}
			case "--dst-type":
				dst = t
				if o.inv {
					flags |= 2 // XT_ADDRTYPE_INVERT_DEST
				}
			default:
				return bad(o.name)
			}
		}
		xt(b, false, "addrtype", 1, 8, func(p []byte) {
			ne.PutUint16(p[0:], src)
			ne.PutUint16(p[2:], dst)
			ne.PutUint32(p[4:], flags)
		})
	case "statistic":
		mode, _ := m.opt("--mode")
		o, ok := m.opt("--probability")
		if mode.value != "random" || !ok || len(m.opts) != 2 || o.inv {
			return bad("options")
		}
		prob, err := strconv.ParseFloat(o.value, 64)
		if err != nil || prob < 0 || prob > 1 {
			return bad(o.value)
		}
		xt(b, false, "statistic", 0, 24, func(p []byte) {
			ne.PutUint32(p[4:], uint32(math.Round(0x80000000*prob)))
		})
	case "recent":
		return r.recent(b, m)
	default:
		return bad("")
	}
	return nil
}

// recent is xt_recent_mtinfo_v1: seconds, hit_count, check_set, invert,
// name[200], side, then the mask at offset 212.
func (r *oldXtRule) recent(b *nfnl.Batch, m *oldXtModule) error {
	var seconds uint32
	var check byte
	name := "DEFAULT"
	for _, o := range m.opts {
		switch o.name {
		case "--name":
			name = o.value
		case "--set":
			check |= 2
		case "--rcheck":
			check |= 1
		case "--reap":
			check |= 32
		case "--rsource":
		case "--seconds":
			s, err := strconv.ParseUint(o.value, 10, 32)
			if err != nil {
				return fmt.Errorf("%w: --seconds %s", errNotNetlink, o.value)
			}
			seconds = uint32(s)
		case "--mask":
			if o.value != "255.255.255.255" && o.value != "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff" {
				return fmt.Errorf("%w: --mask %s", errNotNetlink, o.value)
			}
		default:
			return fmt.Errorf("%w: -m recent %s", errNotNetlink, o.name)
		}
		if o.inv || len(name) >= 200 {
			return fmt.Errorf("%w: -m recent %s", errNotNetlink, o.name)
		}
	}
	maskLen := 4
	if r.v6 {
		maskLen = 16
	}
	xt(b, false, "recent", 1, 232, func(p []byte) {
		ne.PutUint32(p[0:], seconds)
		p[8] = check
		copy(p[10:210], name)
		for i := range maskLen {
			p[212+i] = 0xff
		}
	})
	return nil
}

func (r *oldXtRule) encodeTarget(b *nfnl.Batch, t *oldXtModule) error {
	bad := func(what string) error { return fmt.Errorf("%w: -j %s %s", errNotNetlink, t.name, what) }
	switch t.name {
	case "DNAT":
		o, ok := t.opt("--to-destination")
		if !ok || len(t.opts) != 1 {
			return bad("options")
		}
		ap, err := netip.ParseAddrPort(o.value)
		if err != nil || ap.Addr().Is6() != r.v6 || ap.Port() == 0 {
			return bad(o.value)
		}
		xt(b, true, "DNAT", 2, 48, func(p []byte) {
			ne.PutUint32(p[0:], 1|2) // NF_NAT_RANGE_MAP_IPS | NF_NAT_RANGE_PROTO_SPECIFIED
			a := ap.Addr().AsSlice()
			copy(p[4:], a)
			copy(p[20:], a)
			binary.BigEndian.PutUint16(p[36:], ap.Port())
			binary.BigEndian.PutUint16(p[38:], ap.Port())
		})
	case "MARK":
		if len(t.opts) != 1 {
			return bad("options")
		}
		o := t.opts[0]
		var mark, mask uint32
		var err error
		switch o.name {
		case "--or-mark":
			mark, err = oldParseU32(o.value)
			mask = mark
		case "--xor-mark":
			mark, err = oldParseU32(o.value)
		case "--set-xmark":
			mark, mask, err = oldMarkMask(o.value)
		default:
			return bad(o.name)
		}
		if err != nil {
			return bad(o.value)
		}
		xt(b, true, "MARK", 2, 8, func(p []byte) {
			ne.PutUint32(p[0:], mark)
			ne.PutUint32(p[4:], mask)
		})
	case "MASQUERADE":
		var flags uint32
		for _, o := range t.opts {
			if o.name != "--random-fully" {
				return bad(o.name)
			}
			flags |= 1 << 4 // NF_NAT_RANGE_PROTO_RANDOM_FULLY
		}
		if r.v6 {
			xt(b, true, "MASQUERADE", 0, 40, func(p []byte) { ne.PutUint32(p[0:], flags) })
			break
		}
		xt(b, true, "MASQUERADE", 0, 24, func(p []byte) {
			ne.PutUint32(p[0:], 1) // rangesize
			ne.PutUint32(p[4:], flags)
		})
	case "REJECT":
		// Without --reject-with, iptables rejects with port unreachable.
		with := "icmp-port-unreachable"
		if r.v6 {
			with = "icmp6-port-unreachable"
		}
		if o, ok := t.opt("--reject-with"); ok {
			with = o.value
		}
		if len(t.opts) > 1 || len(t.opts) == 1 && t.opts[0].name != "--reject-with" {
			return bad("options")
		}
		codes := oldRejectV4
		if r.v6 {
			codes = oldRejectV6
		}
		code, ok := codes[with]
		if !ok {
			return bad(with)
		}
		xt(b, true, "REJECT", 0, 8, func(p []byte) { ne.PutUint32(p[0:], code) })
	default:
		return bad("")
	}
	return nil
}

var (
	oldCtStates = map[string]uint16{
		"INVALID": 1 << 0, "ESTABLISHED": 1 << 1, "RELATED": 1 << 2, "NEW": 1 << 3,
		"SNAT": 1 << 6, "DNAT": 1 << 7, "UNTRACKED": 1 << 8,
	}
	oldAddrTypes = map[string]uint16{"UNICAST": 1 << 1, "LOCAL": 1 << 2, "BROADCAST": 1 << 3}
	oldRejectV4  = map[string]uint32{"icmp-port-unreachable": 3, "tcp-reset": 7, "icmp-host-unreachable": 1, "icmp-net-unreachable": 0, "icmp-admin-prohibited": 8}
	oldRejectV6  = map[string]uint32{"icmp6-port-unreachable": 4, "tcp-reset": 6, "icmp6-adm-prohibited": 1, "icmp6-no-route": 0, "icmp6-addr-unreachable": 3}
)

func oldPortRange(s string) (lo, hi uint16, err error) {
	a, z, isRange := strings.Cut(s, ":")
	l, err := strconv.ParseUint(a, 10, 16)
	if err != nil {
		return 0, 0, err
	}
	h := l
	if isRange {
		if h, err = strconv.ParseUint(z, 10, 16); err != nil || h < l {
			return 0, 0, fmt.Errorf("bad range %q", s)
		}
	}
	return uint16(l), uint16(h), nil
}

func oldParseU32(s string) (uint32, error) {
	v, err := strconv.ParseUint(s, 0, 32)
	return uint32(v), err
}

// markMask reads "value[/mask]".
func oldMarkMask(s string) (val, mask uint32, err error) {
	v, m, hasMask := strings.Cut(s, "/")
	if val, err = oldParseU32(v); err != nil {
		return 0, 0, err
	}
	mask = math.MaxUint32
	if hasMask {
		mask, err = oldParseU32(m)
	}
	return val, mask, err
}

func TestTypedEncodingMatchesParsed(t *testing.T) {
	n := 0
	check := func(fam model.Family, table, chain string, r *rule, appendRule bool) {
		nb := nfnl.NewBatch(nfproto(fam), nil, 0)
		if err := (&encoder{v6: fam == model.IPv6}).addRule(nb, table, chain, r, appendRule); err != nil {
			t.Fatalf("%s: %v", r, err)
		}
		ob := nfnl.NewBatch(nfproto(fam), nil, 0)
		if err := oldAddRule(ob, &oldXtRule{}, fam, table, chain, r.String(), appendRule); err != nil {
			t.Fatalf("old %s: %v", r, err)
		}
		np, _, _ := nb.Close()
		op, _, _ := ob.Close()
		if !bytes.Equal(bytes.Join(np, nil), bytes.Join(op, nil)) {
			t.Errorf("%s %s: %s encodes differently", fam, chain, r)
		}
		n++
	}
	snaps := []*model.Snapshot{}
	{
		snap := featureSnapshot()
		sctp := dptest.Svc("ns", "sctp", "198.19.0.77", 9999, dptest.WithProto(model.SCTP), dptest.WithNodePort(30077),
			dptest.WithEPs(dptest.EP("198.18.65.12", 9999, true), dptest.EP("198.18.65.13", 9999, true)))
		udpEmpty := dptest.Svc("ns", "udp-empty", "198.19.0.78", 53, dptest.WithProto(model.UDP))
		snaps = append(snaps, dptest.Snapshot(append(append(snap.V4.Ports, snap.V6.Ports...), sctp, udpEmpty)...))
	}
	os.Setenv("KPROXY_SCALE_AFFINITY", "1")
	snaps = append(snaps, scaleSnapshot(300, 10))
	os.Unsetenv("KPROXY_SCALE_AFFINITY")
	for _, v := range configVariants(dptest.Config) {
		p, err := New(v.cfg, v.opts...)
		if err != nil {
			t.Fatal(err)
		}
		for _, snap := range snaps {
			for _, fam := range []model.Family{model.IPv4, model.IPv6} {
				params := p.params()
				params.ConntrackLiberal = false
				rs := Render(params, snap.Family(fam), snap.Node)
				for _, w := range rulesetWrites(rs) {
					for _, c := range w.chains {
						for i := range c.Rules {
							check(fam, w.table, c.Name, &c.Rules[i], true)
						}
					}
					for _, j := range w.inserts {
						check(fam, w.table, j.Chain, &j.Rule, false)
					}
				}
			}
		}
	}
	t.Logf("%d rules compared", n)
}
