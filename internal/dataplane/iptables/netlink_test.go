package iptables

import (
	"bytes"
	"errors"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kproxy/kproxy/internal/dataplane/dptest"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/nfnl"
)

// Every rule render writes must translate: a rule that does not would send
// whole syncs back to iptables-restore without anyone noticing.
func TestEveryRenderedRuleTranslates(t *testing.T) {
	for _, v := range configVariants(dptest.Config) {
		name, cfg := v.name, v.cfg
		p, err := New(cfg, v.opts...)
		if err != nil {
			t.Fatal(err)
		}
		snap := featureSnapshot()
		// A UDP Service without endpoints: a bare "-j REJECT".
		snap = dptest.Snapshot(append(append(snap.V4.Ports, snap.V6.Ports...),
			dptest.Svc("ns", "udp-empty", "198.19.0.78", 53, dptest.WithProto(model.UDP)))...)
		for _, fam := range cfg.Families {
			rs := Render(p.params(), snap.Family(fam), snap.Node)
			rules := 0
			for _, w := range rulesetWrites(rs) {
				for _, c := range w.chains {
					rules += len(c.Rules)
				}
			}
			b, err := encodeSections(fam, rulesetWrites(rs), nil)
			if err != nil {
				t.Fatalf("%s %s: %v", name, fam, err)
			}
			if rules < 20 || b.Len() < rules*100 {
				t.Fatalf("%s %s: %d rules in %d bytes", name, fam, rules, b.Len())
			}
		}
	}
}

func TestUntranslatableRules(t *testing.T) {
	long := string(make([]byte, 256))
	for _, r := range []rule{
		rb().comment(long).accept(),
		rb().not().src(prefixAddr(netip.MustParsePrefix("0.0.0.0/0"))).accept(),
		rb().dst(bareAddr(netip.MustParseAddr("fd00::1"))).accept(),
		rb().dnat(netip.MustParseAddrPort("[fd00::1]:80")),
		rb().dnat(netip.MustParseAddrPort("198.18.0.1:0")),
		rb().recent(recentMatch{name: string(make([]byte, 200)), ops: recentSet}).accept(),
	} {
		w := &tableWrite{table: tableNAT, chains: []*Chain{{Name: "KUBE-TEST", Rules: []rule{r}}}}
		if _, err := encodeSections(model.IPv4, []*tableWrite{w}, nil); !errors.Is(err, errNotNetlink) {
			t.Errorf("%q: got %v, want errNotNetlink", r, err)
		}
	}
	w := &tableWrite{table: tableNAT, delRules: []string{"PREROUTING -j KUBE-SERVICES"}}
	if _, err := encodeSections(model.IPv4, []*tableWrite{w}, nil); !errors.Is(err, errNotNetlink) {
		t.Errorf("rule deletion: got %v, want errNotNetlink", err)
	}
}

func TestAllAddressesEncodeNothing(t *testing.T) {
	one := func(r rule) int {
		w := &tableWrite{table: tableNAT, chains: []*Chain{{Name: "KUBE-TEST", Rules: []rule{r}}}}
		b, err := encodeSections(model.IPv4, []*tableWrite{w}, nil)
		if err != nil {
			t.Fatalf("%s: %v", r, err)
		}
		return b.Len()
	}
	if a, b := one(rb().src(prefixAddr(netip.MustParsePrefix("0.0.0.0/0"))).accept()), one(rb().accept()); a != b {
		t.Errorf("-s 0.0.0.0/0 encoded %d bytes, a rule without it %d", a, b)
	}
}

func TestAddrBytes(t *testing.T) {
	for _, tc := range []struct {
		in         addr
		addr, mask string
	}{
		{bareAddr(netip.MustParseAddr("198.18.4.7")), "c6120407", "ffffffff"},
		{prefixAddr(netip.MustParsePrefix("198.18.64.0/18")), "c6124000", "ffffc000"},
		{prefixAddr(netip.MustParsePrefix("198.18.64.1/18")), "c6124000", "ffffc000"},
		{lowBitsAddr(false, 9, 15), "00000009", "0000000f"},
		{lowBitsAddr(true, 0xa7, 0xff), "000000000000000000000000000000a7", "000000000000000000000000000000ff"},
		{prefixAddr(netip.MustParsePrefix("127.0.0.0/8")), "7f000000", "ff000000"},
		{prefixAddr(netip.MustParsePrefix("fd00:10::/64")), "fd000010000000000000000000000000", "ffffffffffffffff0000000000000000"},
	} {
		a, m := (&encoder{}).addrBytes(tc.in)
		if got := hex(a) + "/" + hex(m); got != tc.addr+"/"+tc.mask {
			t.Errorf("%s: got %s, want %s/%s", tc.in.appendText(nil), got, tc.addr, tc.mask)
		}
	}
}

func hex(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = append(out, digits[c>>4], digits[c&15])
	}
	return string(out)
}

// TestReusedEncoderEncodesAsFresh: one encoder reused across rules (as
// encodeSections does) encodes every rule exactly as a fresh one would, in
// either order, so no address of one rule leaks into the next.
func TestReusedEncoderEncodesAsFresh(t *testing.T) {
	var rules []rule
	for _, v := range configVariants(dptest.Config) {
		p, err := New(v.cfg, v.opts...)
		if err != nil {
			t.Fatal(err)
		}
		snap := featureSnapshot()
		rs := Render(p.params(), snap.V4, snap.Node)
		for _, w := range rulesetWrites(rs) {
			for _, c := range w.chains {
				rules = append(rules, c.Rules...)
			}
		}
	}
	encode := func(e *encoder, r *rule) []byte {
		b := nfnl.NewBatch(unix.NFPROTO_IPV4, nil, 0)
		if err := e.addRule(b, tableNAT, "KUBE-TEST", r, true); err != nil {
			t.Fatalf("%s: %v", r, err)
		}
		parts, _, _ := b.Close()
		return bytes.Join(parts, nil)
	}
	for _, order := range []string{"forward", "backward"} {
		var shared encoder
		for i := range rules {
			r := &rules[i]
			if order == "backward" {
				r = &rules[len(rules)-1-i]
			}
			if got, want := encode(&shared, r), encode(&encoder{}, r); !bytes.Equal(got, want) {
				t.Fatalf("%s: %s encodes differently after %d reused rules", order, r, i)
			}
		}
	}
	if len(rules) < 100 {
		t.Fatalf("only %d rules", len(rules))
	}
}
