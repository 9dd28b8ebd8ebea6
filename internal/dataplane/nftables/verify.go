package nftables

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"sigs.k8s.io/knftables"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/nfnl"
	"github.com/kproxy/kproxy/internal/trace"
)

// Verification is trace.Verification.
type Verification = trace.Verification

// Verify traces p in the table of p's family. isLocal says which
// addresses are the node's own (fib ... type local).
func Verify(cfg dataplane.Config, table string, snap *model.Snapshot, p trace.Packet, isLocal func(netip.Addr) bool) (Verification, error) {
	fam := model.FamilyOf(p.Dst)
	d := render(cfg, snap.Family(fam), snap.Node)
	var v Verification
	var err error
	if v.Model, err = newRuleTracer(newDesiredSource(d), isLocal).trace(p); err != nil {
		return v, fmt.Errorf("tracing kproxy's own rules: %w", err)
	}
	k := &kernelSource{nl: newNetlinkReader(fam, table), want: newDesiredSource(d),
		sets: map[string]*set{}, chains: map[string][]rule{}, elems: map[string]map[string]string{}}
	for _, s := range newRenderer(cfg, fam, snap.Node).knownSets() {
		k.sets[s.Name] = s
	}
	v.Kernel, v.KernelErr = newRuleTracer(k, isLocal).trace(p)
	if k.err != nil {
		return v, k.err
	}
	v.Notes = k.notes()
	return v, nil
}

// kernelSource reads the chains and sets a trace visits from the kernel,
// once each, and keeps what it read to compare with the render.
type kernelSource struct {
	nl     *netlinkReader
	want   *desiredSource
	sets   map[string]*set
	chains map[string][]rule            // visited chain -> decoded rules (nil: missing)
	elems  map[string]map[string]string // visited set -> elements
	order  []string                     // chains and sets, as visited
	// byNormName indexes want's port chains by normalized name (wantChain).
	byNormName map[string]*chain
	err        error // a failed read (not a difference)
}

func (k *kernelSource) chainRules(name string) ([]rule, bool) {
	if rules, seen := k.chains[name]; seen {
		return rules, true
	}
	k.order = append(k.order, "chain "+name)
	rules, err := k.readChain(name)
	if err != nil {
		k.err = err
		trace.Failf("reading chain %s: %v", name, err)
	}
	// A missing chain traces as an empty one: a missing base chain is a
	// missing hook (jumps to missing chains cannot exist in the kernel).
	k.chains[name] = rules
	return rules, true
}

func (k *kernelSource) readChain(name string) ([]rule, error) {
	rules, errs, found, err := k.nl.chainRules(name)
	if err != nil || !found {
		return nil, err
	}
	if rules == nil {
		rules = []rule{}
	}
	for i, derr := range errs {
		if derr != nil {
			rules[i] = rule{foreign{what: fmt.Sprintf("%s#%d holds a rule kproxy does not write (%v)", name, i+1, derr)}}
		}
	}
	return rules, nil
}

func (k *kernelSource) setElements(name string) map[string]string {
	if el, seen := k.elems[name]; seen {
		return el
	}
	k.order = append(k.order, "set "+name)
	s := k.sets[name]
	if s == nil {
		trace.Failf("rule refers to set %s, which kproxy does not create", name)
	}
	var el map[string]string
	var err error
	if slices.Contains(s.Flags, knftables.IntervalFlag) && !s.IsMap {
		el, err = k.nl.intervalSet(s)
	} else {
		el, err = k.nl.elementMap(s)
	}
	if isNotFound(err) {
		el, err = nil, nil
	}
	if err != nil {
		k.err = err
		trace.Failf("reading set %s: %v", name, err)
	}
	k.elems[name] = el
	return el
}

// A running kproxy and a fresh render may name the same thing
// differently: where a policy chain's endpoints are kept (its block in an
// endpoint-ranges map, which depends on the order in which Services came)
// shows in the DNAT rule, in the policy chain's name (…/INDEX) and so in
// the content hash of every port chain name that leads to it. Differences
// are looked for after normalising those parts away.
var (
	slotRef   = regexp.MustCompile(`offset \d+ map @endpoint-ranges-\S+`)
	portChain = regexp.MustCompile(`\b([a-z]+)-[A-Z2-7]{10}-(\S+)`)
	blockIdx  = regexp.MustCompile(`^((?:svc|loc)-\*-.+)/\d+$`)
)

// normalized is s (a rule, an element's value, a chain name) with the
// parts that depend on a kproxy's history replaced by "*".
func normalized(s string) string {
	s = slotRef.ReplaceAllString(s, "offset * map @endpoint-ranges-*")
	return portChain.ReplaceAllStringFunc(s, func(name string) string {
		return blockIdx.ReplaceAllString(portChain.ReplaceAllString(name, "$1-*-$2"), "$1/*")
	})
}

// wantChain finds the render's chain for a kernel chain name, also under
// another history's name (the render's port chains by normalized name,
// indexed at the first such lookup).
func (k *kernelSource) wantChain(name string) ([]rule, bool) {
	if rules, ok := k.want.chainRules(name); ok {
		return rules, true
	}
	if k.byNormName == nil {
		k.byNormName = map[string]*chain{}
		for wname, c := range k.want.chains {
			if isPortObject(wname) {
				k.byNormName[normalized(wname)] = c
			}
		}
	}
	if c := k.byNormName[normalized(name)]; c != nil {
		return c.Rules, true
	}
	return nil, false
}

// notes compares what the trace read with the render: chains missing in
// the kernel, rules missing or added in a visited chain, and the elements
// of a visited set (other than the endpoint-ranges maps, whose layout is
// a running kproxy's own) missing or added.
func (k *kernelSource) notes() []string {
	var out []string
	for _, what := range k.order {
		kind, name, _ := strings.Cut(what, " ")
		if kind == "chain" {
			out = append(out, k.chainNotes(name)...)
		} else if !strings.HasPrefix(name, "endpoint-ranges-") {
			out = append(out, elemNotes(name, k.want.setElements(name), k.elems[name])...)
		}
	}
	return out
}

func (k *kernelSource) chainNotes(name string) []string {
	got := k.chains[name]
	want, ok := k.wantChain(name)
	switch {
	case !ok:
		return []string{fmt.Sprintf("chain %s is in the kernel but not in kproxy's rules", name)}
	case got == nil:
		return []string{fmt.Sprintf("chain %s is missing in the kernel", name)}
	}
	norm := func(rs []rule) []string {
		out := make([]string, 0, len(rs))
		for _, r := range rs {
			for _, kr := range r.kernelRules() {
				out = append(out, normalized(kr.String()))
			}
		}
		return out
	}
	g, w := norm(got), norm(want)
	var out []string
	for _, r := range w {
		if !slices.Contains(g, r) {
			out = append(out, fmt.Sprintf("chain %s: the kernel lacks kproxy's rule %q", name, r))
		}
	}
	for _, r := range g {
		if !slices.Contains(w, r) {
			out = append(out, fmt.Sprintf("chain %s: the kernel has a rule kproxy does not write: %q", name, r))
		}
	}
	if len(out) == 0 && !slices.Equal(g, w) {
		out = append(out, fmt.Sprintf("chain %s: the kernel holds kproxy's rules in another order", name))
	}
	return out
}

// elemNotes lists up to five elements missing and five added (values
// compared normalized).
func elemNotes(set string, want, got map[string]string) []string {
	norm := func(m map[string]string) map[string]string {
		out := make(map[string]string, len(m))
		for k, v := range m {
			out[k] = normalized(v)
		}
		return out
	}
	want, got = norm(want), norm(got)
	var out []string
	diff := func(a, b map[string]string, format string) {
		var keys []string
		for key, v := range a {
			if w, ok := b[key]; !ok || w != v {
				keys = append(keys, key)
			}
		}
		slices.Sort(keys)
		for i, key := range keys {
			if i == 5 {
				out = append(out, fmt.Sprintf("set %s: %d more", set, len(keys)-5))
				break
			}
			out = append(out, fmt.Sprintf(format, set, elemText(key, a[key])))
		}
	}
	diff(want, got, "set %s: the kernel lacks kproxy's element %s")
	diff(got, want, "set %s: the kernel has an element kproxy does not write: %s")
	return out
}

func elemText(key, value string) string {
	if value == "" {
		return key
	}
	return key + " : " + value
}

// Verify is the package's Verify for the proxier's configuration and
// table.
func (p *Proxier) Verify(_ context.Context, snap *model.Snapshot, pkt trace.Packet, isLocal func(netip.Addr) bool) (trace.Verification, error) {
	return Verify(p.cfg, p.table, snap, pkt, isLocal)
}

// TableChains returns how many chains the family's table of that name has
// (in the calling thread's network namespace): 0 when there is no table.
func TableChains(f model.Family, table string) (int, error) {
	n := newNetlinkReader(f, table)
	names, err := nfnl.ChainNames(n.nfproto(), table)
	if isNotFound(err) {
		return 0, nil
	}
	return len(names), err
}

// intervalSet reads an interval set of addresses (service-cidrs,
// nodeport-cidrs) as render writes it: one element per range, a prefix
// where the range is one ("first-last" otherwise).
func (n *netlinkReader) intervalSet(s *set) (map[string]string, error) {
	type edge struct {
		addr netip.Addr
		end  bool
	}
	var edges []edge
	err := n.eachElement(s, func(el []byte) {
		a, ok := netip.AddrFromSlice(attr(attr(el, unix.NFTA_SET_ELEM_KEY), unix.NFTA_DATA_VALUE))
		if !ok {
			return
		}
		f := attr(el, unix.NFTA_SET_ELEM_FLAGS)
		edges = append(edges, edge{a, len(f) == 4 && binary.BigEndian.Uint32(f)&unix.NFT_SET_ELEM_INTERVAL_END != 0})
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(edges, func(a, b edge) int {
		if c := a.addr.Compare(b.addr); c != 0 {
			return c
		}
		if a.end == b.end {
			return 0
		}
		if a.end {
			return -1
		}
		return 1
	})
	out := map[string]string{}
	for i, e := range edges {
		if e.end {
			continue
		}
		var last netip.Addr
		switch {
		case i+1 < len(edges): // an end, or a start right after this range
			last = edges[i+1].addr.Prev()
		default: // to the top of the address space
			last = lastOf(netip.PrefixFrom(e.addr, 0))
		}
		out[rangeText(e.addr, last)] = ""
	}
	return out, nil
}

// rangeText is first/len when [first, last] is a prefix, else first-last.
func rangeText(first, last netip.Addr) string {
	for bits := 0; bits <= first.BitLen(); bits++ {
		p := netip.PrefixFrom(first, bits)
		if p.Masked().Addr() != first {
			continue
		}
		if lastOf(p) == last {
			return p.String()
		}
	}
	return first.String() + "-" + last.String()
}

// lastOf is the last address of a prefix.
func lastOf(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// PortObjects implements dataplane.ObjectCounter: each port's rules (of its
// own chains) and elements (of the shared sets and maps).
func (p *Proxier) PortObjects(fs *model.FamilySnapshot, node model.NodeInfo) map[model.PortID]int {
	p.mu.Lock()
	cfg := p.cfg
	p.mu.Unlock()
	r := newRenderer(cfg, fs.Family, node)
	out := make(map[model.PortID]int, len(fs.Ports))
	for _, sp := range fs.Ports {
		ps := r.port(sp)
		n := ps.elemCount()
		for _, c := range ps.Chains {
			n += len(c.Rules)
		}
		out[sp.ID] = n
	}
	return out
}
