package iptables

import (
	"strings"
	"testing"
)

func TestBatchTextsSections(t *testing.T) {
	defer func(c, r int) { batchChains, batchRules = c, r }(batchChains, batchRules)
	batchChains, batchRules = 4, 100
	mm := &Chain{Name: chainMarkMasq, Rules: []rule{rb().markOr(0x4000)}}
	g := func(names ...string) []*Chain {
		var cs []*Chain
		for _, n := range names {
			cs = append(cs, &Chain{Name: n, Rules: []rule{rb().ret()}})
		}
		return cs
	}
	groups := portGroups{g("A1", "A2"), g("B1"), g("C1", "C2", "C3", "C4", "C5"), g("D1")}
	for _, tc := range []struct {
		inputs int
		want   []string // the chains of each input's sections, "|" between sections
	}{
		{1, []string{"A1 A2 B1|C1 C2 C3 C4 C5|D1"}},
		{2, []string{"A1 A2 B1", "C1 C2 C3 C4 C5|D1"}},
		{9, []string{"A1 A2 B1", "C1 C2 C3 C4 C5", "D1"}},
	} {
		texts := batchInputs(groups, mm, tc.inputs)
		var got []string
		for _, ws := range texts {
			got = append(got, sectionChains(t, restoreText(ws...)))
		}
		if strings.Join(got, "/") != strings.Join(tc.want, "/") {
			t.Errorf("inputs=%d: got %q, want %q", tc.inputs, got, tc.want)
		}
	}
	if got := batchInputs(portGroups(nil), mm, 2); len(got) != 0 {
		t.Errorf("no groups gave %d inputs", len(got))
	}
}

// sectionChains lists the chains each section of text declares (without
// KUBE-MARK-MASQ, which must open every section).
func sectionChains(t *testing.T, text string) string {
	var secs []string
	for _, sec := range strings.SplitAfter(text, "COMMIT\n") {
		if sec == "" {
			continue
		}
		if !strings.HasPrefix(sec, "*nat\n:"+chainMarkMasq+" ") {
			t.Errorf("section does not open with KUBE-MARK-MASQ:\n%s", sec)
		}
		var names []string
		for _, line := range strings.Split(sec, "\n") {
			if name, ok := strings.CutPrefix(line, ":"); ok && !strings.HasPrefix(name, chainMarkMasq+" ") {
				names = append(names, strings.Fields(name)[0])
			}
		}
		secs = append(secs, strings.Join(names, " "))
	}
	return strings.Join(secs, "|")
}

// batchInputs is planInputs with every input rendered.
func batchInputs(g groupList, markMasq *Chain, inputs int) [][]*tableWrite {
	var out [][]*tableWrite
	for _, in := range planInputs(g, inputs) {
		out = append(out, inputWrites(g, markMasq, in))
	}
	return out
}
