package nftables

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/google/nftables/expr"

	"github.com/kproxy/kproxy/internal/jhash"
	"github.com/kproxy/kproxy/internal/trace"
)

// The tracer evaluates one family's rules against a packet, following
// netfilter's hook order, and explores every branch of the `numgen`
// load-balancing rules. It reads the rules from a ruleSource: the rules
// render produced (the dataplane tests, and the model's side of `kproxy
// explain --verify`) or the rules read back from the kernel (the
// kernel's side). It evaluates render's typed statements and fails the
// trace (trace.Failf) on a rule nldecode could not read (foreign).

// ruleSource is what the tracer reads: the rules of a chain (false when
// the chain does not exist) and the elements of a set or map, key ->
// value as render formats them.
type ruleSource interface {
	chainRules(name string) ([]rule, bool)
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
		for _, e := range ps.allElems() {
			add(e)
		}
	}
	return s
}

func (s *desiredSource) chainRules(name string) ([]rule, bool) {
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
func (tr *tracer) rule(st *trace.Branch, r rule, depth int) string {
	for _, s := range r {
		ok, v := tr.step(st, s, depth)
		if !ok {
			return ""
		}
		if v != "" {
			return v
		}
	}
	return ""
}

// verdict applies a verdict statement: jump returns into the rule; goto
// does not.
func (tr *tracer) verdict(st *trace.Branch, v verdict, depth int) string {
	switch v.kind {
	case expr.VerdictJump:
		if got := tr.chain(st, v.chain, depth+1); got != "return" {
			return got
		}
		return ""
	case expr.VerdictGoto:
		got := tr.chain(st, v.chain, depth+1)
		if got == "" {
			return "return"
		}
		return got
	}
	return v.word()
}

// step evaluates one statement. ok=false: no match. v != "": the rule
// ends with that verdict.
func (tr *tracer) step(st *trace.Branch, s stmt, depth int) (ok bool, v string) {
	switch s := s.(type) {
	case ctMatch:
		if s.dnat {
			return st.DNATted, ""
		}
		return true, "" // a traced packet starts a connection
	case verdict:
		return true, tr.verdict(st, s, depth)
	case reject:
		return true, "reject"
	case foreign:
		trace.Failf("%s", s.what)
	case fibLocal:
		if s.saddr {
			return tr.isLocal(st.Src), ""
		}
		return tr.isLocal(st.Dst), ""
	case iifname:
		m := st.Iif == s.name
		if p, ok := strings.CutSuffix(s.name, "*"); ok {
			m = strings.HasPrefix(st.Iif, p)
		}
		return m != s.neg, ""
	case markTest:
		return st.Mark&s.mask != 0, ""
	case markSet:
		if s.xor {
			st.Mark ^= s.v
		} else {
			st.Mark |= s.v
		}
		return true, ""
	case masquerade:
		st.Masq = true
		return true, "accept"
	case numgenZero:
		return st.Choose(), ""
	case setUpdate:
		return true, ""
	case dnatTo:
		st.Dst, st.DPort, st.DNATted = s.to.Addr(), s.to.Port(), true
		return true, "accept"
	case dnatMap:
		return tr.mappedDNAT(st, s)
	case mapIs:
		v, ok := tr.hashedValue(st, s.m)
		return ok && v == addrPort(s.to.Addr(), s.to.Port()), ""
	case lookup:
		return tr.lookupStep(st, s, depth)
	case addrCmp:
		a := st.Src
		if s.sel == selDaddr4 || s.sel == selDaddr6 {
			a = st.Dst
		}
		return s.p.Contains(a) != s.neg, ""
	case protoCmp:
		return (st.Proto == s.proto) != s.neg, ""
	case allowOnly:
		for _, p := range s.allowed {
			if p.Contains(st.Src) {
				return false, ""
			}
		}
		return true, "drop"
	}
	trace.Failf("tracer does not understand %q", rule{s})
	return false, ""
}

// mappedDNAT picks one range of the block [B, B+M) of the map (one binary
// numgen decision per range, so every range is a branch) and DNATs to its
// endpoint; no range (no endpoints) DNATs nothing. The ranges must tile the
// block with sizes differing by at most one key: a uniform choice.
func (tr *tracer) mappedDNAT(st *trace.Branch, d dnatMap) (bool, string) {
	if d.gen == genHash {
		// One endpoint: the client's bucket's.
		if v, ok := tr.hashedValue(st, d); ok {
			return tr.dnatValue(st, v)
		}
		return false, ""
	}
	m, base := uint64(d.mod), uint64(d.offset)
	type rng struct {
		first, last uint64
		value       string
	}
	var rs []rng
	for k, v := range tr.src.setElements(d.set) {
		first, last, err := parseRange(k)
		if err != nil {
			trace.Failf("element %q of %s is not a range", k, d.set)
		}
		if uint64(first) >= base && uint64(first) < base+m {
			rs = append(rs, rng{uint64(first), uint64(last), v})
		}
	}
	if len(rs) == 0 {
		return false, ""
	}
	slices.SortFunc(rs, func(a, b rng) int { return int(a.first - b.first) })
	next := base
	for _, r := range rs {
		size := r.last - r.first + 1
		if r.first != next || size < m/uint64(len(rs)) || size > m/uint64(len(rs))+1 {
			trace.Failf("ranges of %s in [%d, %d) are not a uniform split: %v", d.set, base, base+m, rs)
		}
		next = r.last + 1
	}
	if next != base+m {
		trace.Failf("ranges of %s do not cover [%d, %d): %v", d.set, base, base+m, rs)
	}
	i := 0
	for ; i < len(rs)-1; i++ {
		if st.Choose() {
			break
		}
	}
	return tr.dnatValue(st, rs[i].value)
}

// hashedValue is the map value of the client's bucket, as the kernel's
// jhash computes it; false when no range holds the bucket.
func (tr *tracer) hashedValue(st *trace.Branch, d dnatMap) (string, bool) {
	k := uint64(d.offset) + uint64(jhash.Bucket(st.Src.AsSlice(), d.seed, d.mod))
	for key, v := range tr.src.setElements(d.set) {
		first, last, err := parseRange(key)
		if err != nil {
			trace.Failf("element %q of %s is not a range", key, d.set)
		}
		if uint64(first) <= k && k <= uint64(last) {
			return v, true
		}
	}
	return "", false
}

// dnatValue DNATs to an endpoint-ranges map value, "address . port".
func (tr *tracer) dnatValue(st *trace.Branch, v string) (bool, string) {
	f := strings.Split(v, fieldSep)
	a, _ := netip.ParseAddr(f[0])
	port, _ := strconv.Atoi(f[1])
	st.Dst, st.DPort, st.DNATted = a, uint16(port), true
	return true, "accept"
}

// lookupStep evaluates `KEY @set` and `KEY vmap @map`.
func (tr *tracer) lookupStep(st *trace.Branch, l lookup, depth int) (bool, string) {
	parts := make([]string, len(l.key))
	for i, p := range l.key {
		parts[i] = tr.field(st, p)
	}
	v, found := tr.lookup(l.set, strings.Join(parts, fieldSep))
	if !found || !l.vmap {
		return found, ""
	}
	verb, chain, _ := strings.Cut(v, " ")
	for kind, word := range verdictWords {
		if word == verb {
			return true, tr.verdict(st, verdict{kind: kind, chain: chain}, depth)
		}
	}
	trace.Failf("map %s holds %q, not a verdict", l.set, v)
	return false, ""
}

// field returns a packet field (or a constant) as set elements write it.
func (tr *tracer) field(st *trace.Branch, p keyPart) string {
	switch p.sel {
	case selNone:
		return fmt.Sprintf("0x%08x", p.mark)
	case selSaddr4, selSaddr6:
		return st.Src.String()
	case selDaddr4, selDaddr6:
		return st.Dst.String()
	case selL4proto:
		return st.Proto
	}
	return strconv.Itoa(int(st.DPort))
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
