package iptables

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/nfacct"
	"github.com/kproxy/kproxy/internal/trace"
)

// Verify traces pkt through the rules render makes of snap (what kproxy
// means the kernel to hold) and through the nat and filter tables the
// kernel holds, read with the backend's iptables-save. Of the built-in
// chains only the jumps into kproxy's chains are followed: other
// programs' rules (a CNI's, kubelet's) are not kproxy's to verify, and
// the tracer knows render's vocabulary only. isLocal says which addresses
// are the node's own.
func (p *Proxier) Verify(ctx context.Context, snap *model.Snapshot, pkt trace.Packet, isLocal func(netip.Addr) bool) (trace.Verification, error) {
	fam := model.FamilyOf(pkt.Dst)
	var v trace.Verification
	if x, err := p.sysctl.Get(sysctlTCPBeLiberal); err == nil {
		p.liberal = x != 0 // as a full sync reads it
	}
	backend := p.backend
	if backend == "" {
		backend = DetectBackend(ctx, p.exec)
	}
	var saved strings.Builder
	for _, table := range []string{tableNAT, tableFilter} {
		out, err := p.exec.Run(ctx, nil, backend.cmd(fam, "-save"), "-t", table)
		if err != nil {
			return v, fmt.Errorf("reading the %s table: %w", table, err)
		}
		saved.Write(out)
	}
	// The rules count into the nfacct counters that existed at the last
	// full sync (counters.go): render with the ones the kernel's rules name.
	p.counters = Counters{
		InvalidDropped:    countsInto(saved.String(), nfacct.CTStateInvalidDropped),
		LocalhostAccepted: countsInto(saved.String(), nfacct.LocalhostNodePortsAccepted),
	}
	rs := Render(p.params(), snap.Family(fam), snap.Node)
	want := newRulesetTracer(rs, isLocal)
	var err error
	if v.Model, err = want.trace(pkt); err != nil {
		return v, fmt.Errorf("tracing kproxy's own rules: %w", err)
	}
	got := newRuleTracer(saved.String(), isLocal)
	got.keepJumpsInto(want)
	v.Kernel, v.KernelErr = got.trace(pkt)
	v.Notes = chainNotes(want, got)
	return v, nil
}

// countsInto tells whether a rule of the iptables-save text counts into
// the nfacct counter (iptables-save prints two blanks before the name).
func countsInto(saved, counter string) bool {
	return regexp.MustCompile(`(?m)--nfacct-name +` + regexp.QuoteMeta(counter) + `( |$)`).MatchString(saved)
}

// TraceSaved traces pkt through iptables-save text of the nat and filter
// tables, following from the built-in chains only the jumps into chains
// named with prefix (another proxy's rules, say "KUBE-").
func TraceSaved(text, prefix string, pkt trace.Packet, isLocal func(netip.Addr) bool) (trace.Result, error) {
	tr := newRuleTracer(text, isLocal)
	tr.keepBuiltinJumps(func(_, to string) bool { return strings.HasPrefix(to, prefix) })
	return tr.trace(pkt)
}

// keepJumpsInto keeps in tr's built-in chains only the rules that jump
// into a chain of want's.
func (tr *tracer) keepJumpsInto(want *tracer) {
	tr.keepBuiltinJumps(func(table, to string) bool {
		_, ok := want.tables[table][to]
		return ok && !builtin(to)
	})
}

// keepBuiltinJumps keeps in the built-in chains only the rules whose
// target (in table) keep accepts.
func (tr *tracer) keepBuiltinJumps(keep func(table, to string) bool) {
	for table, chains := range tr.tables {
		for name, rules := range chains {
			if builtin(name) {
				chains[name] = slices.DeleteFunc(rules, func(r traced) bool { return !keep(table, r.target()) })
			}
		}
	}
}

// chainNotes compares the chains of want (render) with got's (the
// kernel's): chains missing or added, a different number of rules, and
// jumps missing from the built-in chains. Rules are compared by count,
// as iptables-save spells them its own way.
func chainNotes(want, got *tracer) []string {
	var out []string
	for _, table := range []string{tableNAT, tableFilter} {
		w, g := want.tables[table], got.tables[table]
		for _, name := range sortedKeys(w) {
			rules, ok := g[name]
			switch {
			case !ok && !builtin(name):
				out = append(out, fmt.Sprintf("chain %s/%s is missing in the kernel", table, name))
			case builtin(name):
				for _, r := range w[name] {
					if !slices.ContainsFunc(rules, func(k traced) bool { return k.target() == r.target() }) {
						out = append(out, fmt.Sprintf("chain %s/%s lacks kproxy's jump to %s", table, name, r.target()))
					}
				}
			case len(rules) != len(w[name]):
				out = append(out, fmt.Sprintf("chain %s/%s: the kernel has %d rules, kproxy writes %d", table, name, len(rules), len(w[name])))
			}
		}
		for _, name := range sortedKeys(g) {
			if _, ok := w[name]; !ok && isKproxyChain(name) {
				out = append(out, fmt.Sprintf("chain %s/%s is in the kernel but not in kproxy's rules", table, name))
			}
		}
	}
	return out
}

// isKproxyChain: the per-Service chains kproxy (and upstream's iptables
// mode, whose chains kproxy takes over) name, and KUBE-XLB-, upstream's
// name for the Local-policy chains before v1.22.
func isKproxyChain(name string) bool {
	return isServiceChain(name) || strings.HasPrefix(name, "KUBE-XLB-")
}

// PortObjects implements dataplane.ObjectCounter: each port's rules, in
// its own chains and in the shared ones.
func (p *Proxier) PortObjects(fs *model.FamilySnapshot, node model.NodeInfo) map[model.PortID]int {
	p.mu.Lock()
	params := p.params()
	p.mu.Unlock()
	r := newRenderer(params, fs, node)
	out := make(map[model.PortID]int, len(fs.Ports))
	for _, sp := range fs.Ports {
		pr := r.port(sp)
		n := len(pr.entries)
		for _, c := range pr.nat {
			n += len(c.Rules)
		}
		out[sp.ID] = n
	}
	return out
}
