package iptables

import (
	"reflect"
	"slices"
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
