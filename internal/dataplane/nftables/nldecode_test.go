package nftables

import (
	"net/netip"
	"reflect"
	"testing"

	"github.com/google/nftables/expr"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/dataplane/dptest"
	"github.com/kproxy/kproxy/internal/model"
)

// TestDecodeRoundTrip translates every rule of the feature renders (both
// families, the golden configurations) to expressions and back: each
// kernel rule decodes to text that translates to the same expressions,
// and a rule that is one kernel rule decodes to its own text.
func TestDecodeRoundTrip(t *testing.T) {
	masqAll := dptest.Config()
	masqAll.MasqueradeAll = true
	masqAll.NodePortAddresses = []string{"primary", "198.18.1.0/24"}
	bridge := dptest.Config()
	bridge.LocalMode = dataplane.LocalBridgeInterface
	bridge.BridgeInterface = "cbr0"
	dual := dptest.Config()
	dual.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("198.19.0.0/24"), netip.MustParsePrefix("fd00:19::/112")}
	rules := 0
	for _, cfg := range []dataplane.Config{dual, masqAll, bridge} {
		for _, fam := range []model.Family{model.IPv4, model.IPv6} {
			n := newNetlinkReader(fam, "kube-proxy")
			d := render(cfg, featureSnapshot().Family(fam), featureSnapshot().Node)
			for _, c := range allChains(d) {
				for _, text := range c.Rules {
					rules++
					pieces, err := n.ruleExprs(text)
					if err != nil {
						t.Fatalf("%s: %q: %v", c.Name, text, err)
					}
					for _, exprs := range pieces {
						got, err := n.decodeRule(exprs)
						if err != nil {
							t.Fatalf("%s: %q: %v", c.Name, text, err)
						}
						if len(pieces) == 1 && got != text {
							t.Errorf("%s: %q decodes as %q", c.Name, text, got)
						}
						again, err := n.oneRule(got)
						if err != nil || !reflect.DeepEqual(again, exprs) {
							t.Errorf("%s: %q: decoded %q translates differently (%v)", c.Name, text, got, err)
						}
					}
				}
			}
		}
	}
	if rules < 100 {
		t.Fatalf("only %d rules rendered", rules)
	}
}

// TestDecodeRejectsForeignRules: expressions render never emits are an
// error, not a guess.
func TestDecodeRejectsForeignRules(t *testing.T) {
	n := newNetlinkReader(model.IPv4, "kube-proxy")
	for name, exprs := range map[string][]expr.Any{
		"counter":     {&expr.Counter{}},
		"plain masq":  {&expr.Masq{}},
		"log":         {&expr.Log{}},
		"dangling ct": {&expr.Ct{Key: expr.CtKeySTATE, Register: 1}},
		"lookup only": {&expr.Lookup{SourceRegister: reg32First, SetName: "x"}},
	} {
		if text, err := n.decodeRule(exprs); err == nil {
			t.Errorf("%s decodes as %q", name, text)
		}
	}
}

func allChains(d *desired) []*chain {
	out := append([]*chain(nil), d.Chains...)
	for _, ps := range d.Ports {
		out = append(out, ps.Chains...)
	}
	return out
}

// TestPortObjects counts what render writes for each port of the feature
// snapshot: its chains' rules and its elements.
func TestPortObjects(t *testing.T) {
	p, _ := New(dptest.Config())
	snap := featureSnapshot()
	got := p.PortObjects(snap.V4, snap.Node)
	d := render(dptest.Config(), snap.V4, snap.Node)
	for _, sp := range snap.V4.Ports {
		ps := d.Ports[sp.ID]
		want := len(ps.Elems)
		for _, c := range ps.Chains {
			want += len(c.Rules)
		}
		if got[sp.ID] != want || want == 0 {
			t.Errorf("%s: %d objects, render has %d", sp.ID, got[sp.ID], want)
		}
	}
}
