package model

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/kproxy/kproxy/internal/objects"
)

// serviceCIDRs is the parsed union of the ServiceCIDR objects' ranges, with
// the objects it was made from (so Update can reuse it) and their problems.
type serviceCIDRs struct {
	objs     []*objects.ServiceCIDR
	prefixes []netip.Prefix
	problems []Problem
}

// parseServiceCIDRs parses spec.cidrs of every object: each valid range,
// masked to its network, once, IPv4 before IPv6 and then by address and
// length (nil when there is none). Invalid entries are problems and left out.
func parseServiceCIDRs(objs []*objects.ServiceCIDR) serviceCIDRs {
	out := serviceCIDRs{objs: objs}
	for _, c := range objs {
		probs := &problemList{kind: "ServiceCIDR", key: c.Key(), list: &out.problems}
		for i, s := range c.CIDRs {
			p, ok := parsePrefix(strings.TrimSpace(s))
			if !ok {
				probs.add("spec.cidrs["+strconv.Itoa(i)+"]", "invalid CIDR "+quote(s))
				continue
			}
			out.prefixes = append(out.prefixes, p)
		}
	}
	slices.SortFunc(out.prefixes, comparePrefixes)
	out.prefixes = slices.Compact(out.prefixes)
	return out
}

// updateServiceCIDRs reuses prev when objs holds the same objects (by
// pointer: the tracker replaces an object when it changes). The bool is true
// when it parsed objs anew.
func updateServiceCIDRs(prev serviceCIDRs, objs []*objects.ServiceCIDR) (serviceCIDRs, bool) {
	if slices.Equal(prev.objs, objs) {
		return prev, false
	}
	return parseServiceCIDRs(objs), true
}

// comparePrefixes orders IPv4 before IPv6, then by address, then shorter
// first.
func comparePrefixes(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

// ServiceCIDRsOf returns the ranges of family f in cidrs, in order (nil when
// none).
func ServiceCIDRsOf(cidrs []netip.Prefix, f Family) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range cidrs {
		if FamilyOf(p.Addr()) == f {
			out = append(out, p)
		}
	}
	return out
}
