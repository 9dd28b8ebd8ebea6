package nftables

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/kproxy/kproxy/internal/trace"
)

// The tracer evaluates one family's rules against a packet, following
// netfilter's hook order, and explores every branch of the `numgen`
// load-balancing rules. It reads the rules from a ruleSource: the rules
// render produced (the dataplane tests, and the model's side of `kproxy
// explain --verify`) or the rules read back from the kernel (the
// kernel's side). It understands exactly the rule vocabulary render emits
// and fails the trace (trace.Failf) on anything else.

// ruleSource is what the tracer reads: the rules of a chain (false when
// the chain does not exist) and the elements of a set or map, key ->
// value as render formats them.
type ruleSource interface {
	chainRules(name string) ([]string, bool)
	setElements(name string) map[string]string
}

type tracer struct {
	src     ruleSource
	isLocal func(netip.Addr) bool
}

func newRuleTracer(src ruleSource, isLocal func(netip.Addr) bool) *tracer {
	return &tracer{src: src, isLocal: isLocal}
}

// desiredSource serves the rules of a render.
type desiredSource struct {
	chains map[string]*chain
	sets   map[string]map[string]string // set -> key -> value
}

func newDesiredSource(d *desired) *desiredSource {
	s := &desiredSource{chains: map[string]*chain{}, sets: map[string]map[string]string{}}
	add := func(e element) {
		if s.sets[e.Set] == nil {
			s.sets[e.Set] = map[string]string{}
		}
		s.sets[e.Set][e.Key] = e.Value
	}
	for _, c := range d.Chains {
		s.chains[c.Name] = c
	}
	for _, e := range d.Elems {
		add(e)
	}
	for _, ps := range d.Ports {
		for _, c := range ps.Chains {
			s.chains[c.Name] = c
		}
		for _, e := range ps.Elems {
			add(e)
		}
	}
	return s
}

func (s *desiredSource) chainRules(name string) ([]string, bool) {
	c := s.chains[name]
	if c == nil {
		return nil, false
	}
	return c.Rules, true
}

func (s *desiredSource) setElements(name string) map[string]string { return s.sets[name] }

// trace explores all numgen branches and merges their outcomes.
func (tr *tracer) trace(p trace.Packet) (trace.Result, error) { return trace.Explore(p, tr.run) }

// run follows the hooks of one path; it returns the final verdict.
func (tr *tracer) run(st *trace.Branch) string {
	pre := []string{chainFilterPreroutingPreDNAT, chainNATPrerouting}
	if st.FromHost {
		pre = []string{chainFilterOutputPreDNAT, chainNATOutput, chainFilterOutput}
	}
	for _, c := range pre {
		if v := tr.hook(st, c); v != "accept" {
			return v
		}
	}
	var post []string
	switch {
	case tr.isLocal(st.Dst):
		post = []string{chainFilterInput}
	case st.FromHost:
		post = []string{chainNATPostrouting}
	default:
		post = []string{chainFilterForward, chainNATPostrouting}
	}
	for _, c := range post {
		if v := tr.hook(st, c); v != "accept" {
			return v
		}
	}
	return "accept"
}

// hook runs a base chain; "accept" means the packet continues.
func (tr *tracer) hook(st *trace.Branch, name string) string {
	v := tr.chain(st, name, 0)
	if v == "" || v == "return" {
		return "accept"
	}
	return v
}

// chain evaluates a chain; "" means it fell through (or returned).
func (tr *tracer) chain(st *trace.Branch, name string, depth int) string {
	rules, ok := tr.src.chainRules(name)
	if !ok {
		trace.Failf("jump to missing chain %q", name)
	}
	if depth > 16 {
		trace.Failf("chain depth exceeded at %q", name)
	}
	for _, r := range rules {
		if v := tr.rule(st, r, depth); v != "" {
			return v
		}
	}
	return ""
}

// rule evaluates one rule; "" means continue with the next rule.
func (tr *tracer) rule(st *trace.Branch, rule string, depth int) string {
	toks := tokenize(rule)
	for len(toks) > 0 {
		ok, v, rest := tr.step(st, toks, depth)
		if !ok {
			return ""
		}
		if v != "" {
			return v
		}
		toks = rest
	}
	return ""
}

// verdict applies a verdict statement: jump returns into the rule; goto
// does not.
func (tr *tracer) verdict(st *trace.Branch, verb, target string, depth int) string {
	switch verb {
	case "jump":
		if v := tr.chain(st, target, depth+1); v != "return" {
			return v
		}
		return ""
	case "goto":
		v := tr.chain(st, target, depth+1)
		if v == "" {
			return "return"
		}
		return v
	}
	return verb
}

// step consumes one match or statement from toks. ok=false: no match.
// v != "": the rule ends with that verdict.
func (tr *tracer) step(st *trace.Branch, toks []string, depth int) (ok bool, v string, rest []string) {
	switch toks[0] {
	case "ct":
		if toks[1] == "state" {
			return toks[2] == "new", "", toks[3:]
		}
		return st.DNATted, "", toks[3:] // ct status dnat
	case "jump", "goto":
		return true, tr.verdict(st, toks[0], toks[1], depth), nil
	case "drop", "reject", "accept", "return":
		return true, toks[0], nil
	case foreignRule:
		trace.Failf("%s holds a rule kproxy does not write: %s", toks[1], strings.Join(toks[2:], " "))
	case "fib":
		a := st.Dst
		if toks[1] == "saddr" {
			a = st.Src
		}
		return tr.isLocal(a), "", toks[4:]
	case "iifname":
		return tr.matchIface(st, toks)
	case "mark":
		return tr.markStep(st, toks)
	case "masquerade":
		st.Masq = true
		return true, "accept", nil
	case "numgen":
		return st.Choose(), "", toks[5:]
	case "update":
		end := slices.Index(toks, "}")
		return true, "", toks[end+1:]
	case "dnat":
		if len(toks) == 11 { // dnat ip to numgen random mod M offset B map @m
			return tr.mappedDNAT(st, toks)
		}
		ap := netip.MustParseAddrPort(toks[2])
		st.Dst, st.DPort, st.DNATted = ap.Addr(), ap.Port(), true
		return true, "accept", nil
	}
	return tr.exprStep(st, toks, depth)
}

// mappedDNAT picks one range of the block [B, B+M) of the map (one binary
// numgen decision per range, so every range is a branch) and DNATs to its
// endpoint; no range (no endpoints) DNATs nothing. The ranges must tile the
// block with sizes differing by at most one key: a uniform choice.
func (tr *tracer) mappedDNAT(st *trace.Branch, toks []string) (bool, string, []string) {
	m, _ := strconv.ParseUint(toks[6], 10, 64)
	base, _ := strconv.ParseUint(toks[8], 10, 64)
	type rng struct {
		first, last uint64
		value       string
	}
	var rs []rng
	for k, v := range tr.src.setElements(toks[10][1:]) {
		first, last, err := parseRange(k)
		if err != nil {
			trace.Failf("element %q of %s is not a range", k, toks[10])
		}
		if uint64(first) >= base && uint64(first) < base+m {
			rs = append(rs, rng{uint64(first), uint64(last), v})
		}
	}
	if len(rs) == 0 {
		return false, "", nil
	}
	slices.SortFunc(rs, func(a, b rng) int { return int(a.first - b.first) })
	next := base
	for _, r := range rs {
		size := r.last - r.first + 1
		if r.first != next || size < m/uint64(len(rs)) || size > m/uint64(len(rs))+1 {
			trace.Failf("ranges of %s in [%d, %d) are not a uniform split: %v", toks[10], base, base+m, rs)
		}
		next = r.last + 1
	}
	if next != base+m {
		trace.Failf("ranges of %s do not cover [%d, %d): %v", toks[10], base, base+m, rs)
	}
	i := 0
	for ; i < len(rs)-1; i++ {
		if st.Choose() {
			break
		}
	}
	f := strings.Split(rs[i].value, fieldSep)
	a, _ := netip.ParseAddr(f[0])
	port, _ := strconv.Atoi(f[1])
	st.Dst, st.DPort, st.DNATted = a, uint16(port), true
	return true, "accept", nil
}

func (tr *tracer) matchIface(st *trace.Branch, toks []string) (bool, string, []string) {
	neg := toks[1] == "!="
	var pat string
	if neg {
		pat, toks = toks[2], toks[3:]
	} else {
		pat, toks = toks[1], toks[2:]
	}
	pat = strings.Trim(pat, `"`)
	m := st.Iif == pat
	if strings.HasSuffix(pat, "*") {
		m = strings.HasPrefix(st.Iif, strings.TrimSuffix(pat, "*"))
	}
	return m != neg, "", toks
}

func (tr *tracer) markStep(st *trace.Branch, toks []string) (bool, string, []string) {
	val := func(s string) uint32 {
		n, err := strconv.ParseUint(s, 0, 32)
		if err != nil {
			trace.Failf("bad mark %q", s)
		}
		return uint32(n)
	}
	switch {
	case toks[1] == "and": // mark and X != 0
		return st.Mark&val(toks[2]) != 0, "", toks[5:]
	case toks[3] == "or": // mark set mark or X
		st.Mark |= val(toks[4])
	default: // mark set mark xor X
		st.Mark ^= val(toks[4])
	}
	return true, "", toks[5:]
}

// exprStep handles `sel [. sel]* (vmap @m | @s | != v | v | != { ... })`.
func (tr *tracer) exprStep(st *trace.Branch, toks []string, depth int) (bool, string, []string) {
	var key []string
	for {
		val, n := tr.selector(st, toks)
		key = append(key, val)
		toks = toks[n:]
		if len(toks) == 0 || toks[0] != "." {
			break
		}
		toks = toks[1:]
	}
	k := strings.Join(key, " . ")
	switch {
	case toks[0] == "vmap":
		v, found := tr.lookup(toks[1][1:], k)
		if !found {
			return false, "", nil
		}
		f := strings.Fields(v)
		if len(f) == 1 {
			return true, f[0], nil
		}
		return true, tr.verdict(st, f[0], f[1], depth), nil
	case strings.HasPrefix(toks[0], "@"):
		_, found := tr.lookup(toks[0][1:], k)
		return found, "", toks[1:]
	case toks[0] == "!=" && toks[1] == "{":
		end := slices.Index(toks, "}")
		in := false
		for _, s := range toks[2:end] {
			in = in || contains(strings.TrimSuffix(s, ","), k)
		}
		return !in, "", toks[end+1:]
	case toks[0] == "!=":
		return !contains(toks[1], k), "", toks[2:]
	}
	return contains(toks[0], k), "", toks[1:]
}

// selector returns the value of one packet field (or a constant of a
// concatenation) and how many tokens it took.
func (tr *tracer) selector(st *trace.Branch, toks []string) (string, int) {
	if strings.HasPrefix(toks[0], "0x") {
		return toks[0], 1
	}
	switch toks[0] + " " + toks[1] {
	case "ip saddr", "ip6 saddr":
		return st.Src.String(), 2
	case "ip daddr", "ip6 daddr":
		return st.Dst.String(), 2
	case "meta l4proto":
		return st.Proto, 2
	case "th dport":
		return strconv.Itoa(int(st.DPort)), 2
	}
	trace.Failf("tracer does not understand %q", strings.Join(toks, " "))
	return "", 0
}

// lookup finds k in a set, also as an address inside a CIDR element.
func (tr *tracer) lookup(set, k string) (string, bool) {
	if set == setAffinity {
		return "", false // the affinity set starts empty
	}
	elems := tr.src.setElements(set)
	if v, ok := elems[k]; ok {
		return v, true
	}
	for e, v := range elems {
		if strings.ContainsAny(e, "/-") && contains(e, k) {
			return v, true
		}
	}
	return "", false
}

// contains reports whether pattern (an address, CIDR or literal) matches v.
func contains(pattern, v string) bool {
	if p, err := netip.ParsePrefix(pattern); err == nil {
		a, err := netip.ParseAddr(v)
		return err == nil && p.Contains(a)
	}
	if lo, hi, ok := strings.Cut(pattern, "-"); ok { // an address range read back
		first, err1 := netip.ParseAddr(lo)
		last, err2 := netip.ParseAddr(hi)
		a, err3 := netip.ParseAddr(v)
		if err1 == nil && err2 == nil && err3 == nil {
			return a.BitLen() == first.BitLen() && a.Compare(first) >= 0 && a.Compare(last) <= 0
		}
	}
	return pattern == v
}

func tokenize(rule string) []string {
	rule = strings.NewReplacer("{", " { ", "}", " } ").Replace(rule)
	return strings.Fields(rule)
}
