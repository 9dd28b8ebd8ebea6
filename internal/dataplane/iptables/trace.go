package iptables

import (
	"net/netip"
	"strconv"
	"strings"

	"github.com/kproxy/kproxy/internal/trace"
)

// The tracer runs the first packet of a connection through netfilter's
// hooks, exploring every branch of `statistic` and `recent` matches, over
// either of two rule sets: render's typed rules (newRulesetTracer), or the
// kernel's rules as iptables-save prints them (newRuleTracer). That text
// is the kernel's, in its own spelling, so it is parsed here (and where
// full syncs and cleanup read the kernel); render's rules are never
// printed to be parsed back. The tracer knows the rule vocabulary render
// emits, in both spellings, and fails the trace (trace.Failf) on anything
// else.

type tracer struct {
	tables map[string]map[string][]traced // table -> chain -> rules
	local  func(netip.Addr) bool
}

// traced is one rule of the tracer: render's typed rule, or the
// arguments of one of the kernel's.
type traced struct {
	typed *rule
	toks  []string
}

// target is the rule's -j or -g target.
func (t traced) target() string {
	if t.typed != nil {
		return t.typed.target.name()
	}
	return argsTarget(t.toks)
}

// newRulesetTracer traces render's rules.
func newRulesetTracer(rs *Ruleset, isLocal func(netip.Addr) bool) *tracer {
	tr := &tracer{tables: map[string]map[string][]traced{}, local: isLocal}
	for _, table := range []string{tableMangle, tableFilter, tableNAT} {
		chains := map[string][]traced{}
		tr.tables[table] = chains
		for _, c := range rs.table(table) {
			chains[c.Name] = make([]traced, len(c.Rules))
			for i := range c.Rules {
				chains[c.Name][i] = traced{typed: &c.Rules[i]}
			}
		}
	}
	for i := range rs.Jumps {
		j := &rs.Jumps[i]
		tr.tables[j.Table][j.Chain] = append(tr.tables[j.Table][j.Chain], traced{typed: &j.Rule})
	}
	return tr
}

// newRuleTracer traces iptables-save (or iptables-restore) text.
func newRuleTracer(text string, isLocal func(netip.Addr) bool) *tracer {
	tr := &tracer{tables: map[string]map[string][]traced{}, local: isLocal}
	var table string
	for _, line := range strings.Split(text, "\n") {
		switch {
		case strings.HasPrefix(line, "*"):
			table = line[1:]
			if tr.tables[table] == nil {
				tr.tables[table] = map[string][]traced{}
			}
		case strings.HasPrefix(line, ":"):
			name, _, _ := strings.Cut(line[1:], " ")
			tr.tables[table][name] = nil
		case strings.HasPrefix(line, "-A "):
			toks := splitArgs(line)
			tr.tables[table][toks[1]] = append(tr.tables[table][toks[1]], traced{toks: toks[2:]})
		case strings.HasPrefix(line, "-I "):
			toks := splitArgs(line)
			tr.tables[table][toks[1]] = append([]traced{{toks: toks[3:]}}, tr.tables[table][toks[1]]...)
		}
	}
	return tr
}

// trace runs p through the rules over every branch of their probabilistic
// matches.
func (tr *tracer) trace(p trace.Packet) (trace.Result, error) { return trace.Explore(p, tr.run) }

// run follows the hooks of one path and returns the verdict.
func (tr *tracer) run(st *trace.Branch) string {
	hooks := [][2]string{{"nat", "PREROUTING"}}
	if st.FromHost {
		hooks = [][2]string{{"nat", "OUTPUT"}, {"filter", "OUTPUT"}}
	}
	for _, h := range hooks {
		if v := tr.hook(st, h[0], h[1]); v != "accept" {
			return v
		}
	}
	switch {
	case tr.local(st.Dst):
		hooks = [][2]string{{"filter", "INPUT"}}
	case st.FromHost:
		hooks = [][2]string{{"nat", "POSTROUTING"}}
	default:
		hooks = [][2]string{{"filter", "FORWARD"}, {"nat", "POSTROUTING"}}
	}
	for _, h := range hooks {
		if v := tr.hook(st, h[0], h[1]); v != "accept" {
			return v
		}
	}
	return "accept"
}

func (tr *tracer) hook(st *trace.Branch, table, chain string) string {
	v := tr.chain(st, table, chain, 0)
	if v == "" || v == "return" {
		return "accept"
	}
	return v
}

// chain evaluates a chain: "" when it falls through.
func (tr *tracer) chain(st *trace.Branch, table, name string, depth int) string {
	rules, ok := tr.tables[table][name]
	if !ok && !builtin(name) {
		trace.Failf("jump to missing chain %s/%s", table, name)
	}
	if depth > 16 {
		trace.Failf("chain depth exceeded at %s", name)
	}
	for _, r := range rules {
		v := ""
		if r.typed != nil {
			v = tr.typedRule(st, table, r.typed, depth)
		} else {
			v = tr.rule(st, table, r.toks, depth)
		}
		if v != "" {
			return v
		}
	}
	return ""
}

func builtin(name string) bool {
	return name == "PREROUTING" || name == "INPUT" || name == "FORWARD" || name == "OUTPUT" || name == "POSTROUTING"
}

// rule evaluates one rule: "" means continue with the next rule.
func (tr *tracer) rule(st *trace.Branch, table string, toks []string, depth int) string {
	for i := 0; i < len(toks); {
		neg := false
		if toks[i] == "!" {
			neg, i = true, i+1
		}
		opt := toks[i]
		if opt == "-j" || opt == "-g" {
			return tr.target(st, table, opt, toks[i+1:], depth)
		}
		ok, n := tr.match(st, opt, toks[i+1:])
		if ok == neg {
			return ""
		}
		i += 1 + n
	}
	return "" // a rule without target (KUBE-FW's last comment rule)
}

// match evaluates one option; it returns whether it matched and how many
// value tokens it consumed.
func (tr *tracer) match(st *trace.Branch, opt string, args []string) (bool, int) {
	switch opt {
	case "-m":
		return true, 1
	case "--comment", "--mode", "--name", "--seconds", "--mask", "--nfacct-name":
		return true, 1
	case "--reap", "--set", "--rsource":
		return true, 0
	case "--rcheck":
		return st.Choose(), 0
	case "--probability", "--every":
		return st.Choose(), 1
	case "--packet":
		return true, 1
	case "-p":
		return args[0] == st.Proto, 1
	case "--dport":
		return portMatch(args[0], st.DPort), 1
	case "-d":
		return addrMatch(args[0], st.Dst), 1
	case "-s":
		return addrMatch(args[0], st.Src), 1
	case "-i":
		return ifMatch(args[0], st.Iif), 1
	case "--dst-type":
		return tr.local(st.Dst), 1
	case "--src-type":
		return tr.local(st.Src), 1
	case "--mark":
		v, m := parseMark(args[0])
		return st.Mark&m == v, 1
	case "--ctstate":
		for _, s := range strings.Split(args[0], ",") {
			if s == "NEW" || (s == "DNAT" && st.DNATted) {
				return true, 1
			}
		}
		return false, 1
	}
	trace.Failf("tracer does not know option %q", opt)
	return false, 0
}

func (tr *tracer) target(st *trace.Branch, table, verb string, args []string, depth int) string {
	return tr.enter(st, table, verb == "-g", args[0], depth, func() string {
		return tr.mangle(st, args)
	})
}

// mangle applies a DNAT, MASQUERADE or MARK target given as arguments.
func (tr *tracer) mangle(st *trace.Branch, args []string) string {
	switch args[0] {
	case "DNAT":
		ap, err := netip.ParseAddrPort(args[2])
		if err != nil {
			trace.Failf("bad DNAT target %q", args[2])
		}
		st.Dst, st.DPort, st.DNATted = ap.Addr(), ap.Port(), true
		return "accept"
	case "MASQUERADE":
		st.Masq = true
		return "accept"
	case "MARK":
		switch args[1] {
		case "--or-mark":
			st.Mark |= hexMark(args[2])
		case "--xor-mark":
			st.Mark ^= hexMark(args[2])
		case "--set-xmark": // iptables-save's spelling: clear the mask's bits, then xor
			v, m := parseMark(args[2])
			st.Mark = st.Mark&^m ^ v
		default:
			trace.Failf("tracer does not know MARK %q", args[1])
		}
		return ""
	}
	trace.Failf("tracer does not know target %q", args[0])
	return ""
}

// enter follows a rule's target to: a verdict, a chain (jumped to, or
// gone to with isGoto), or else what mangle returns (DNAT, MASQUERADE,
// MARK).
func (tr *tracer) enter(st *trace.Branch, table string, isGoto bool, to string, depth int, mangle func() string) string {
	switch to {
	case "ACCEPT":
		return "accept"
	case "DROP":
		return "drop"
	case "REJECT":
		return "reject"
	case "RETURN":
		return "return"
	case "DNAT", "MASQUERADE", "MARK":
		return mangle()
	}
	v := tr.chain(st, table, to, depth+1)
	if isGoto {
		if v == "" {
			return "return"
		}
		return v
	}
	if v == "return" {
		return ""
	}
	return v
}

func portMatch(spec string, p uint16) bool {
	lo, hi, isRange := strings.Cut(spec, ":")
	a, _ := strconv.Atoi(lo)
	if !isRange {
		return int(p) == a
	}
	b, _ := strconv.Atoi(hi)
	return int(p) >= a && int(p) <= b
}

// addrMatch handles a/len, a/mask (non-contiguous too) and bare addresses.
func addrMatch(spec string, a netip.Addr) bool {
	addr, mask, hasMask := strings.Cut(spec, "/")
	want, err := netip.ParseAddr(addr)
	if err != nil {
		trace.Failf("bad address %q", spec)
	}
	if want.BitLen() != a.BitLen() {
		return false
	}
	if !hasMask {
		return want == a
	}
	if bits, err := strconv.Atoi(mask); err == nil {
		return netip.PrefixFrom(want, bits).Contains(a)
	}
	mk, err := netip.ParseAddr(mask)
	if err != nil || mk.BitLen() != want.BitLen() {
		trace.Failf("bad address mask %q", spec)
	}
	m := mk.AsSlice()
	x, w := a.AsSlice(), want.AsSlice()
	for i := range m {
		if x[i]&m[i] != w[i]&m[i] {
			return false
		}
	}
	return true
}

func ifMatch(spec, iif string) bool {
	if p, ok := strings.CutSuffix(spec, "+"); ok {
		return strings.HasPrefix(iif, p)
	}
	return spec == iif
}

func hexMark(s string) uint32 {
	v, err := strconv.ParseUint(strings.TrimPrefix(s, "0x"), 16, 32)
	if err != nil {
		trace.Failf("bad mark %q", s)
	}
	return uint32(v)
}

func parseMark(s string) (uint32, uint32) {
	v, m, _ := strings.Cut(s, "/")
	pv, err1 := strconv.ParseUint(strings.TrimPrefix(v, "0x"), 16, 32)
	pm, err2 := strconv.ParseUint(strings.TrimPrefix(m, "0x"), 16, 32)
	if err1 != nil || err2 != nil {
		trace.Failf("bad mark %q", s)
	}
	return uint32(pv), uint32(pm)
}

// typedRule evaluates one of render's rules: "" means continue with the
// next rule. Its matches are tested in print order, as the text's are, so
// both ask trace.Branch to choose in the same order.
func (tr *tracer) typedRule(st *trace.Branch, table string, r *rule, depth int) string {
	for _, k := range r.args {
		if k == argEnd {
			break
		}
		if tr.typedMatch(st, r, k) == r.negated(k) {
			return ""
		}
	}
	t := &r.target
	if t.kind == targetNone {
		return ""
	}
	return tr.enter(st, table, t.kind == targetGoto, t.name(), depth, func() string {
		switch t.kind {
		case targetDNAT:
			st.Dst, st.DPort, st.DNATted = t.to.Addr(), t.to.Port(), true
			return "accept"
		case targetMasquerade:
			st.Masq = true
			return "accept"
		case targetMarkOr:
			st.Mark |= t.mark
		case targetMarkXor:
			st.Mark ^= t.mark
		}
		return ""
	})
}

// typedMatch tells whether argument k of r matches (before negation).
func (tr *tracer) typedMatch(st *trace.Branch, r *rule, k argKind) bool {
	switch k {
	case argIn:
		return ifMatch(r.iface, st.Iif)
	case argProto, argPortMatch:
		return protoName(r.proto) == st.Proto
	case argSrc:
		return r.src.contains(st.Src)
	case argDst:
		return r.dst.contains(st.Dst)
	case argComment, argNFAcct:
		return true
	case argDport:
		return st.DPort >= r.dport.lo && st.DPort <= r.dport.hi
	case argCtstate:
		return r.states&ctNew != 0 || r.states&ctDNAT != 0 && st.DNATted
	case argAddrType:
		return (r.srcType == 0 || tr.local(st.Src)) && (r.dstType == 0 || tr.local(st.Dst))
	case argMark:
		return st.Mark&r.markMask == r.mark
	case argStatistic:
		return st.Choose()
	case argRecent:
		return r.recent.ops&recentRcheck == 0 || st.Choose()
	}
	trace.Failf("tracer does not know argument kind %d", k)
	return false
}

// contains tells whether the address matches a.
func (a addr) contains(ip netip.Addr) bool {
	if ip.BitLen() != a.ip.BitLen() {
		return false
	}
	if a.form == addrLowBits {
		return ip.As16()[15]&a.bits == a.ip.As16()[15]
	}
	return netip.PrefixFrom(a.ip, int(a.bits)).Contains(ip)
}
