package iptables

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/internal/dataplane/dptest"
)

// A port rendered twice gives the same chains (lazyPorts renders again
// what the first rendering only summed), and a compacted port diffs as
// unchanged against a fresh rendering, as changed when a rule differs,
// and lists the chains a new rendering no longer has.
func TestCompactPortDiffs(t *testing.T) {
	p, err := New(dptest.Config())
	if err != nil {
		t.Fatal(err)
	}
	snap := featureSnapshot()
	r := newRenderer(p.params(), snap.V4, snap.Node)
	withChains := 0
	for _, sp := range snap.V4.Ports {
		first, again := r.port(sp), r.port(sp)
		if !reflect.DeepEqual(first, again) {
			t.Fatalf("%s: two renderings differ", sp.ID)
		}
		if len(first.nat) == 0 {
			continue
		}
		withChains++
		rules := 0
		for _, c := range first.nat {
			rules += len(c.Rules)
		}
		first.compact()
		if first.nat != nil || len(first.sums) != len(again.nat) || first.rules != rules {
			t.Fatalf("%s: compact kept %d chains, %d sums for %d chains, %d rules for %d", sp.ID,
				len(first.nat), len(first.sums), len(again.nat), first.rules, rules)
		}
		if changed, deletes := portDiff(first, r.port(sp)); len(changed) != 0 || len(deletes) != 0 {
			t.Errorf("%s: an unchanged port diffs as %d changed chains, deletes %v", sp.ID, len(changed), deletes)
		}
		edited := r.port(sp)
		last := edited.nat[len(edited.nat)-1]
		last.Rules = append(slices.Clone(last.Rules), rb().ret())
		gone := edited.nat[0].Name
		edited.nat = edited.nat[1:]
		changed, deletes := portDiff(first, edited)
		if len(changed) != 1 || changed[0].Name != last.Name || !slices.Equal(deletes, []string{gone}) {
			var names []string
			for _, c := range changed {
				names = append(names, c.Name)
			}
			t.Errorf("%s: edited port diffs as changed %v, deletes %v; want [%s], [%s]", sp.ID, names, deletes, last.Name, gone)
		}
		first.compact() // a second compact keeps the sums
		if len(first.sums) != len(again.nat) {
			t.Errorf("%s: a second compact lost the sums", sp.ID)
		}
	}
	if withChains < 5 {
		t.Fatalf("only %d ports with chains", withChains)
	}
}

// TestNodePortsJumpsLoopback: a nodePortAddresses CIDR that holds the
// loopback range without being in it (0.0.0.0/1) does not make NodePorts
// answer on 127.0.0.1 when localhost NodePorts are off, as upstream, which
// skips loopback node addresses; with them on, it does.
func TestNodePortsJumpsLoopback(t *testing.T) {
	snap := featureSnapshot()
	for _, c := range []struct {
		localhost bool
		want      []string
	}{
		{false, []string{
			`-m comment --comment "kubernetes service nodeports: not on loopback addresses" -d 127.0.0.0/8 -j RETURN`,
			`-m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -d 0.0.0.0/1 -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS`,
			`-m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -d 198.18.0.0/15 -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS`,
		}},
		{true, []string{
			`-m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -d 0.0.0.0/1 -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS`,
			`-m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -d 198.18.0.0/15 -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS`,
		}},
	} {
		cfg := dptest.Config()
		cfg.NodePortAddresses = []string{"0.0.0.0/1", "198.18.0.0/15"}
		r := newRenderer(Params{Config: cfg, LocalhostNodePorts: c.localhost}, snap.V4, snap.Node)
		var got []string
		for _, rule := range r.nodePortsJumps() {
			got = append(got, rule.String())
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("localhost NodePorts %v: got\n%s\nwant\n%s", c.localhost, strings.Join(got, "\n"), strings.Join(c.want, "\n"))
		}
	}
}
