package iptables

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/internal/model"
)

// The tracer parses the iptables-restore text render produces and runs the
// first packet of a connection through netfilter's hooks, exploring every
// branch of `statistic` and `recent` matches. It knows exactly the rule
// vocabulary render emits and fails the test on anything else.

type tracePacket struct {
	src, dst netip.Addr
	proto    string
	dport    uint16
	iif      string
	fromHost bool
}

type traceResult struct {
	verdict string
	dnat    []string
	masq    bool
}

func (r traceResult) String() string {
	return fmt.Sprintf("%s dnat=%v masq=%v", r.verdict, r.dnat, r.masq)
}

type tracer struct {
	t      testing.TB
	tables map[string]map[string][][]string // table -> chain -> rules (tokens)
	local  func(netip.Addr) bool
}

func newTracer(t testing.TB, text string, localAddrs ...netip.Addr) *tracer {
	tr := &tracer{t: t, tables: map[string]map[string][][]string{}}
	var table string
	for _, line := range strings.Split(text, "\n") {
		switch {
		case strings.HasPrefix(line, "*"):
			table = line[1:]
			if tr.tables[table] == nil {
				tr.tables[table] = map[string][][]string{}
			}
		case strings.HasPrefix(line, ":"):
			name, _, _ := strings.Cut(line[1:], " ")
			tr.tables[table][name] = nil
		case strings.HasPrefix(line, "-A "):
			toks := splitArgs(line)
			tr.tables[table][toks[1]] = append(tr.tables[table][toks[1]], toks[2:])
		case strings.HasPrefix(line, "-I "):
			toks := splitArgs(line)
			tr.tables[table][toks[1]] = append([][]string{toks[3:]}, tr.tables[table][toks[1]]...)
		}
	}
	tr.local = func(a netip.Addr) bool { return a.IsLoopback() || slices.Contains(localAddrs, a) }
	return tr
}

type pktState struct {
	tracePacket
	mark          uint32
	dnatted, masq bool
	choices       []bool
	used          int
	taken         []bool
}

func (st *pktState) choose() bool {
	c := true
	if st.used < len(st.choices) {
		c = st.choices[st.used]
	}
	st.used++
	st.taken = append(st.taken, c)
	return c
}

func (tr *tracer) trace(p tracePacket) traceResult {
	queue := [][]bool{nil}
	verdicts, targets := map[string]bool{}, map[string]bool{}
	var res traceResult
	for runs := 0; len(queue) > 0; runs++ {
		if runs > 1000 {
			tr.t.Fatalf("trace of %+v does not terminate", p)
		}
		prefix := queue[0]
		queue = queue[1:]
		st := &pktState{tracePacket: p, choices: prefix}
		verdicts[tr.run(st)] = true
		if st.dnatted {
			targets[netip.AddrPortFrom(st.dst, st.dport).String()] = true
		}
		res.masq = res.masq || st.masq
		for i := len(prefix); i < len(st.taken); i++ {
			if st.taken[i] {
				queue = append(queue, append(slices.Clone(st.taken[:i]), false))
			}
		}
	}
	if len(verdicts) != 1 {
		tr.t.Fatalf("branches of %+v end differently: %v", p, verdicts)
	}
	for v := range verdicts {
		res.verdict = v
	}
	for tg := range targets {
		res.dnat = append(res.dnat, tg)
	}
	slices.Sort(res.dnat)
	return res
}

// run follows the hooks of one path and returns the verdict.
func (tr *tracer) run(st *pktState) string {
	hooks := [][2]string{{"nat", "PREROUTING"}}
	if st.fromHost {
		hooks = [][2]string{{"nat", "OUTPUT"}, {"filter", "OUTPUT"}}
	}
	for _, h := range hooks {
		if v := tr.hook(st, h[0], h[1]); v != "accept" {
			return v
		}
	}
	switch {
	case tr.local(st.dst):
		hooks = [][2]string{{"filter", "INPUT"}}
	case st.fromHost:
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

func (tr *tracer) hook(st *pktState, table, chain string) string {
	v := tr.chain(st, table, chain, 0)
	if v == "" || v == "return" {
		return "accept"
	}
	return v
}

// chain evaluates a chain: "" when it falls through.
func (tr *tracer) chain(st *pktState, table, name string, depth int) string {
	rules, ok := tr.tables[table][name]
	if !ok && !builtin(name) {
		tr.t.Fatalf("jump to missing chain %s/%s", table, name)
	}
	if depth > 16 {
		tr.t.Fatalf("chain depth exceeded at %s", name)
	}
	for _, r := range rules {
		if v := tr.rule(st, table, r, depth); v != "" {
			return v
		}
	}
	return ""
}

func builtin(name string) bool {
	return name == "PREROUTING" || name == "INPUT" || name == "FORWARD" || name == "OUTPUT" || name == "POSTROUTING"
}

// rule evaluates one rule: "" means continue with the next rule.
func (tr *tracer) rule(st *pktState, table string, toks []string, depth int) string {
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
func (tr *tracer) match(st *pktState, opt string, args []string) (bool, int) {
	switch opt {
	case "-m":
		return true, 1
	case "--comment", "--mode", "--name", "--seconds":
		return true, 1
	case "--reap", "--set":
		return true, 0
	case "--rcheck":
		return st.choose(), 0
	case "--probability":
		return st.choose(), 1
	case "-p":
		return args[0] == st.proto, 1
	case "--dport":
		return portMatch(args[0], st.dport), 1
	case "-d":
		return addrMatch(tr.t, args[0], st.dst), 1
	case "-s":
		return addrMatch(tr.t, args[0], st.src), 1
	case "-i":
		return ifMatch(args[0], st.iif), 1
	case "--dst-type":
		return tr.local(st.dst), 1
	case "--src-type":
		return tr.local(st.src), 1
	case "--mark":
		v, m := parseMark(tr.t, args[0])
		return st.mark&m == v, 1
	case "--ctstate":
		for _, s := range strings.Split(args[0], ",") {
			if s == "NEW" || (s == "DNAT" && st.dnatted) {
				return true, 1
			}
		}
		return false, 1
	}
	tr.t.Fatalf("tracer does not know option %q", opt)
	return false, 0
}

func (tr *tracer) target(st *pktState, table, verb string, args []string, depth int) string {
	switch args[0] {
	case "ACCEPT":
		return "accept"
	case "DROP":
		return "drop"
	case "REJECT":
		return "reject"
	case "RETURN":
		return "return"
	case "DNAT":
		ap := netip.MustParseAddrPort(args[2])
		st.dst, st.dport, st.dnatted = ap.Addr(), ap.Port(), true
		return "accept"
	case "MASQUERADE":
		st.masq = true
		return "accept"
	case "MARK":
		v, _ := strconv.ParseUint(strings.TrimPrefix(args[2], "0x"), 16, 32)
		if args[1] == "--or-mark" {
			st.mark |= uint32(v)
		} else {
			st.mark ^= uint32(v)
		}
		return ""
	}
	v := tr.chain(st, table, args[0], depth+1)
	if verb == "-g" {
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
func addrMatch(t testing.TB, spec string, a netip.Addr) bool {
	addr, mask, hasMask := strings.Cut(spec, "/")
	want := netip.MustParseAddr(addr)
	if want.BitLen() != a.BitLen() {
		return false
	}
	if !hasMask {
		return want == a
	}
	if bits, err := strconv.Atoi(mask); err == nil {
		return netip.PrefixFrom(want, bits).Contains(a)
	}
	m := netip.MustParseAddr(mask).AsSlice()
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

func parseMark(t testing.TB, s string) (uint32, uint32) {
	v, m, _ := strings.Cut(s, "/")
	pv, err1 := strconv.ParseUint(strings.TrimPrefix(v, "0x"), 16, 32)
	pm, err2 := strconv.ParseUint(strings.TrimPrefix(m, "0x"), 16, 32)
	if err1 != nil || err2 != nil {
		t.Fatalf("bad mark %q", s)
	}
	return uint32(pv), uint32(pm)
}

// traceOf renders snap for one family and builds a tracer over it.
func traceOf(t testing.TB, p Params, snap *model.Snapshot, fam model.Family) *tracer {
	rs := Render(p, snap.Family(fam), snap.Node)
	return newTracer(t, RestoreText(rs), nodeIP, nodeIP6)
}
