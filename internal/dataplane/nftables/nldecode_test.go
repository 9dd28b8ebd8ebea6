package nftables

import (
	"fmt"
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
// kernel rule decodes to itself.
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
			rules += checkRoundTrip(t, fam, render(cfg, featureSnapshot().Family(fam), featureSnapshot().Node))
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
		if r, err := n.decodeRule(exprs); err == nil {
			t.Errorf("%s decodes as %q", name, r)
		}
	}
}

// checkRoundTrip encodes every kernel rule of every rule of d as netlink
// expressions and decodes them back: the rule decoded prints as the rule
// written and encodes to the same expressions. It returns the number of
// rules.
func checkRoundTrip(t *testing.T, fam model.Family, d *desired) int {
	t.Helper()
	n := newNetlinkReader(fam, DefaultTableName)
	rules := 0
	for _, c := range allChains(d) {
		for _, r := range c.Rules {
			rules++
			for _, kr := range r.kernelRules() {
				exprs := kr.exprs()
				got, err := n.decodeRule(exprs)
				if err != nil {
					t.Fatalf("%s: %q: %v", c.Name, kr, err)
				}
				if got.String() != kr.String() {
					t.Errorf("%s: %q decodes as %q", c.Name, kr, got)
				}
				if again := got.exprs(); !reflect.DeepEqual(again, exprs) {
					t.Errorf("%s: %q: decoded %q encodes differently", c.Name, kr, got)
				}
			}
		}
	}
	return rules
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
		want := ps.elemCount()
		for _, c := range ps.Chains {
			want += len(c.Rules)
		}
		if got[sp.ID] != want || want == 0 {
			t.Errorf("%s: %d objects, render has %d", sp.ID, got[sp.ID], want)
		}
	}
}

// FuzzRenderDecode renders Services shaped by the fuzzer (protocol,
// endpoints local or not and terminating or not, NodePort, LoadBalancer
// with source ranges, external IPs, traffic policies, affinity), in both
// families and two configurations: every rule translates to netlink
// expressions and decodes back to expressions that translate the same.
func FuzzRenderDecode(f *testing.F) {
	f.Add(uint8(3), uint8(2), uint16(0xffff), uint32(1))
	f.Add(uint8(1), uint8(0), uint16(0), uint32(7))
	f.Add(uint8(5), uint8(9), uint16(0x0f0f), uint32(42))
	f.Fuzz(func(t *testing.T, services, eps uint8, flags uint16, seed uint32) {
		var ports []*model.ServicePort
		for i := range int(services % 8) {
			bit := func(n int) bool { return flags>>((n+i)%16)&1 == 1 }
			var list []*model.Endpoint
			for j := range int(eps % 12) {
				ep := dptest.EP(fmt.Sprintf("198.18.%d.%d", 64+i, 10+j), 8080, (seed>>j)&1 == 1)
				list = append(list, ep)
			}
			opts := []dptest.SvcOpt{dptest.WithEPs(list...)}
			if bit(0) {
				opts = append(opts, dptest.WithNodePort(uint16(30000+i)))
			}
			if bit(1) {
				opts = append(opts, dptest.WithLB(fmt.Sprintf("198.18.1.%d", 10+i)), dptest.WithSourceRanges("198.18.200.0/24", fmt.Sprintf("198.18.9.%d/32", i)))
			}
			if bit(2) {
				opts = append(opts, dptest.WithExternalIPs(fmt.Sprintf("198.18.2.%d", 10+i)))
			}
			if bit(3) {
				opts = append(opts, dptest.WithETPLocal)
			}
			if bit(4) {
				opts = append(opts, dptest.WithITPLocal)
			}
			if bit(5) {
				opts = append(opts, dptest.WithAffinity(int32(60+i)))
			}
			switch seed % 3 {
			case 1:
				opts = append(opts, dptest.WithProto(model.UDP))
			case 2:
				opts = append(opts, dptest.WithProto(model.SCTP))
			}
			ports = append(ports, dptest.Svc("ns", fmt.Sprintf("s%d", i), fmt.Sprintf("198.19.0.%d", 10+i), uint16(80+i), opts...))
		}
		snap := dptest.Snapshot(ports...)
		masqAll := dptest.Config()
		masqAll.MasqueradeAll = true
		for _, cfg := range []dataplane.Config{dptest.Config(), masqAll} {
			for _, fam := range []model.Family{model.IPv4, model.IPv6} {
				checkRoundTrip(t, fam, render(cfg, snap.Family(fam), snap.Node))
			}
		}
	})
}
