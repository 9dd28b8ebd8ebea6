package model

import (
	"net/netip"
	"testing"
)

// TestParsePrefix: CIDRs read as upstream reads them (net.ParseCIDR after
// its sloppy parser, then the family of the masked address): leading
// zeros and host bits allowed, IPv4-mapped prefixes as the IPv4 prefix
// they map when the mask covers ::ffff:, zones refused.
func TestParsePrefix(t *testing.T) {
	for _, c := range []struct {
		in, want string // want "" when refused
	}{
		{"198.18.0.5/15", "198.18.0.0/15"},
		{"198.018.0.0/15", "198.18.0.0/15"},
		{"fd00::5/64", "fd00::/64"},
		{"::ffff:10.0.0.0/104", "10.0.0.0/8"},
		{"::ffff:198.18.1.2/128", "198.18.1.2/32"},
		{"::ffff:0:0/96", "0.0.0.0/0"},
		{"::ffff:0:0/80", "::/80"},
		{"fe80::1%eth0/64", ""},
		{"198.18.0.0/33", ""},
		{"nonsense", ""},
	} {
		p, ok := parsePrefix(c.in)
		got := ""
		if ok {
			got = p.String()
		}
		if got != c.want {
			t.Errorf("parsePrefix(%q) = %q, want %q", c.in, got, c.want)
		}
		if ok && p != p.Masked() {
			t.Errorf("parsePrefix(%q) = %s, not masked", c.in, p)
		}
	}
	if p, _ := parsePrefix("::ffff:10.0.0.0/104"); FamilyOf(p.Addr()) != IPv4 || !p.Contains(netip.MustParseAddr("10.1.2.3")) {
		t.Errorf("::ffff:10.0.0.0/104 is %s, want IPv4 10.0.0.0/8", p)
	}
}
