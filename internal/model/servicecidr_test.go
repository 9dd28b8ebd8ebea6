package model

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/kproxy/kproxy/internal/objects"
)

func TestServiceCIDRs(t *testing.T) {
	tests := []struct {
		name     string
		objs     []*objects.ServiceCIDR
		want     []netip.Prefix
		problems []string
	}{
		{name: "none"},
		{
			name: "default dual-stack",
			objs: []*objects.ServiceCIDR{{Name: "kubernetes", CIDRs: []string{"fd00:0:0:ffff::/112", "198.18.128.0/17"}}},
			want: prefixes("198.18.128.0/17", "fd00:0:0:ffff::/112"),
		},
		{
			name: "union of objects, each range once, sorted",
			objs: []*objects.ServiceCIDR{
				{Name: "a", CIDRs: []string{"198.18.200.0/24"}},
				{Name: "b", CIDRs: []string{"198.18.128.0/17", "fd00:0:0:fffe::/112"}},
				{Name: "c", CIDRs: []string{"198.18.200.0/24"}},
			},
			want: prefixes("198.18.128.0/17", "198.18.200.0/24", "fd00:0:0:fffe::/112"),
		},
		{
			name: "host bits masked, sloppy IPv4 read as upstream",
			objs: []*objects.ServiceCIDR{{Name: "a", CIDRs: []string{"198.18.128.7/17", "010.0.0.0/8"}}},
			want: prefixes("10.0.0.0/8", "198.18.128.0/17"),
		},
		{
			name:     "invalid entries are problems",
			objs:     []*objects.ServiceCIDR{{Name: "bad", CIDRs: []string{"nope", "198.18.128.0/17", "fe80::/64%eth0"}}},
			want:     prefixes("198.18.128.0/17"),
			problems: []string{`ServiceCIDR bad: spec.cidrs[0]: invalid CIDR "nope"`, `ServiceCIDR bad: spec.cidrs[2]: invalid CIDR "fe80::/64%eth0"`},
		},
		{
			name: "an IPv4-mapped range is the IPv4 range it maps, as upstream reads it",
			objs: []*objects.ServiceCIDR{{Name: "mapped", CIDRs: []string{"::ffff:198.18.0.0/112"}}},
			want: prefixes("198.18.0.0/16"),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			snap, probs := Build(Input{NodeName: "n", ServiceCIDRs: tc.objs})
			if !slices.Equal(snap.ServiceCIDRs, tc.want) {
				t.Errorf("ServiceCIDRs = %v, want %v", snap.ServiceCIDRs, tc.want)
			}
			var got []string
			for _, p := range probs {
				got = append(got, p.String())
			}
			if !slices.Equal(got, tc.problems) {
				t.Errorf("problems = %q, want %q", got, tc.problems)
			}
		})
	}
}

func TestServiceCIDRsOf(t *testing.T) {
	all := prefixes("198.18.128.0/17", "198.18.200.0/24", "fd00:0:0:ffff::/112")
	if got := ServiceCIDRsOf(all, IPv4); !slices.Equal(got, all[:2]) {
		t.Errorf("IPv4: %v", got)
	}
	if got := ServiceCIDRsOf(all, IPv6); !slices.Equal(got, all[2:]) {
		t.Errorf("IPv6: %v", got)
	}
	if got := ServiceCIDRsOf(all[:2], IPv6); got != nil {
		t.Errorf("no IPv6 range: %v, want nil", got)
	}
}

func TestUpdateServiceCIDRs(t *testing.T) {
	bad := &objects.ServiceCIDR{Name: "bad", CIDRs: []string{"x"}}
	def := &objects.ServiceCIDR{Name: "kubernetes", CIDRs: []string{"198.18.128.0/17"}}
	in := Input{NodeName: "n", ServiceCIDRs: []*objects.ServiceCIDR{bad, def}}
	prev, probs := Build(in)
	if len(probs) != 1 {
		t.Fatalf("Build problems = %v", probs)
	}

	// The same objects: reused, problems not reported again but still listed.
	same, probs := Update(prev, Input{NodeName: "n", ServiceCIDRs: slices.Clone(in.ServiceCIDRs)}, nil)
	if len(probs) != 0 || len(same.Problems()) != 1 || !slices.Equal(same.ServiceCIDRs, prev.ServiceCIDRs) {
		t.Errorf("unchanged: problems %v, listed %v, cidrs %v", probs, same.Problems(), same.ServiceCIDRs)
	}
	if same.V4 != prev.V4 || same.V6 != prev.V6 {
		t.Errorf("a Snapshot with unchanged Services was not shared")
	}

	// Another object: parsed again; the result equals Build.
	extra := &objects.ServiceCIDR{Name: "more", CIDRs: []string{"fd00:0:0:ffff::/112"}}
	next := Input{NodeName: "n", ServiceCIDRs: []*objects.ServiceCIDR{def, extra}}
	got, probs := Update(same, next, nil)
	want, _ := Build(next)
	if len(probs) != 0 || !slices.Equal(got.ServiceCIDRs, prefixes("198.18.128.0/17", "fd00:0:0:ffff::/112")) {
		t.Errorf("changed: problems %v, cidrs %v", probs, got.ServiceCIDRs)
	}
	if !equalSnapshots(got, want) {
		t.Errorf("Update = %+v, want Build's %+v", got, want)
	}

	// All gone.
	none, _ := Update(got, Input{NodeName: "n"}, nil)
	if none.ServiceCIDRs != nil || len(none.Problems()) != 0 {
		t.Errorf("no ServiceCIDRs: %v, problems %v", none.ServiceCIDRs, none.Problems())
	}
}
