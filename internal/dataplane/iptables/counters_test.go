package iptables

import (
	"errors"
	"testing"
)

func TestCountsInto(t *testing.T) {
	const name = "ct_state_invalid_dropped_pkts"
	for _, tc := range []struct {
		saved string
		want  bool
	}{
		{"-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name  ct_state_invalid_dropped_pkts -j DROP\n", true},
		{"-A X -m nfacct --nfacct-name ct_state_invalid_dropped_pkts", true},
		{`-A X -m comment --comment "ct_state_invalid_dropped_pkts" -j ACCEPT`, false},
		{"-A X -m nfacct --nfacct-name  ct_state_invalid_dropped_pkts_more -j DROP", false},
		{"", false},
	} {
		if got := countsInto(tc.saved, name); got != tc.want {
			t.Errorf("countsInto(%q) = %v, want %v", tc.saved, got, tc.want)
		}
	}
}

// TestNFAcctMatch: on nf_tables the kernel is asked for the nfacct match
// (a no, or a failure to ask, leaves the rules without it); the legacy
// backend is not asked.
func TestNFAcctMatch(t *testing.T) {
	for _, tc := range []struct {
		backend Backend
		ok      bool
		err     error
		want    bool // the match is used
		asked   bool
	}{
		{BackendNFT, true, nil, true, true},
		{BackendNFT, false, nil, false, true},
		{BackendNFT, false, errors.New("netlink says no"), false, true},
		{BackendLegacy, false, nil, true, false},
	} {
		asked := false
		p := &Proxier{backend: tc.backend, compat: func(fam byte, name string, rev uint32, target bool) (bool, error) {
			asked = true
			if name != "nfacct" || rev != 1 || target {
				t.Errorf("asked for %s rev %d target %v", name, rev, target)
			}
			return tc.ok, tc.err
		}}
		if err := p.nfacctMatch(); (err == nil) != tc.want || asked != tc.asked {
			t.Errorf("%s, compat (%v, %v): err %v, asked %v; want the match %v, asked %v", tc.backend, tc.ok, tc.err, err, asked, tc.want, tc.asked)
		}
	}
}
