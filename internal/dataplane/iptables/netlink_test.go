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
	for _, rule := range []string{
		"-m multiport --dports 80,443 -j ACCEPT",
		"-m sctp -p sctp --sport 80 -j ACCEPT",
		"-p icmp -j ACCEPT",
		"-m tcp -p tcp --sport 80 -j ACCEPT",
		"-j SNAT --to-source 198.18.0.1",
		"-j CT --notrack",
		"-d 198.18.0.300 -j ACCEPT",
		"-m comment --comment",
		"-m statistic --mode nth --every 2 -j ACCEPT",
		"-m conntrack --ctstate BOGUS -j ACCEPT",
		"-j DNAT --to-destination 198.18.0.1",
		"-g ACCEPT",
		"--dport 80",
		"! -s 0.0.0.0/0 -j ACCEPT",
	} {
		b := nfnl.NewBatch(unix.NFPROTO_IPV4, nil, 0)
		if err := addRule(b, &xtRule{}, model.IPv4, tableNAT, "KUBE-TEST", rule, true); !errors.Is(err, errNotNetlink) {
			t.Errorf("%q: got %v, want errNotNetlink", rule, err)
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

func TestParseAddr(t *testing.T) {
	for _, tc := range []struct {
		fam        model.Family
		in         string
		addr, mask string
	}{
		{model.IPv4, "198.18.4.7", "c6120407", "ffffffff"},
		{model.IPv4, "198.18.64.0/18", "c6124000", "ffffc000"},
		{model.IPv4, "198.18.4.9/0.0.0.15", "00000009", "0000000f"},
		{model.IPv4, "127.0.0.0/8", "7f000000", "ff000000"},
		{model.IPv6, "fd00:10::/64", "fd000010000000000000000000000000", "ffffffffffffffff0000000000000000"},
	} {
		a, m, err := parseAddr(new([2][16]byte), tc.fam, tc.in)
		if err != nil {
			t.Fatalf("%s: %v", tc.in, err)
		}
		if got := hex(a) + "/" + hex(m); got != tc.addr+"/"+tc.mask {
			t.Errorf("%s: got %s, want %s/%s", tc.in, got, tc.addr, tc.mask)
		}
	}
	if _, _, err := parseAddr(new([2][16]byte), model.IPv4, "fd00::1"); err == nil {
		t.Error("an IPv6 address in an IPv4 rule was accepted")
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

// TestReusedRuleEncodesAsFresh: one xtRule reused across rules (as
// encodeSections does) encodes every rule exactly as a fresh one would, in
// either order, so no option, address or match of one rule leaks into the
// next.
func TestReusedRuleEncodesAsFresh(t *testing.T) {
	var rules []string
	for _, v := range configVariants(dptest.Config) {
		p, err := New(v.cfg, v.opts...)
		if err != nil {
			t.Fatal(err)
		}
		snap := featureSnapshot()
		rs := Render(p.params(), snap.V4, snap.Node)
		for _, w := range rulesetWrites(rs) {
			for _, c := range w.chains {
				rules = append(rules, ruleTexts(c.Rules)...)
			}
		}
	}
	encode := func(r *xtRule, rule string) []byte {
		b := nfnl.NewBatch(unix.NFPROTO_IPV4, nil, 0)
		if err := addRule(b, r, model.IPv4, tableNAT, "KUBE-TEST", rule, true); err != nil {
			t.Fatalf("%q: %v", rule, err)
		}
		parts, _, _ := b.Close()
		return bytes.Join(parts, nil)
	}
	for _, order := range []string{"forward", "backward"} {
		var shared xtRule
		for i := range rules {
			rule := rules[i]
			if order == "backward" {
				rule = rules[len(rules)-1-i]
			}
			if got, want := encode(&shared, rule), encode(&xtRule{}, rule); !bytes.Equal(got, want) {
				t.Fatalf("%s: %q encodes differently after %d reused rules", order, rule, i)
			}
		}
	}
	if len(rules) < 100 {
		t.Fatalf("only %d rules", len(rules))
	}
}
