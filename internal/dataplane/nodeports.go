package dataplane

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/kproxy/kproxy/internal/model"
)

// NodePortAddrs are the addresses of family fam among addrs (the node's
// local addresses) that take NodePorts in the modes that bind them to
// addresses (IPVS, userspace): those within cfg.NodePortAddresses, or all
// of them when it is empty; never a loopback or IPv6 link-local one, as
// upstream's IPVS mode never serves a NodePort on 127.0.0.1. Sorted, each
// once.
func NodePortAddrs(cfg Config, fam model.Family, addrs []netip.Addr) []netip.Addr {
	var cidrs []netip.Prefix
	for _, s := range cfg.NodePortAddresses {
		if p, err := netip.ParsePrefix(strings.TrimSpace(s)); err == nil && model.FamilyOf(p.Addr()) == fam {
			cidrs = append(cidrs, p.Masked())
		}
	}
	var out []netip.Addr
	for _, a := range addrs {
		a = a.Unmap()
		if model.FamilyOf(a) != fam || a.IsLoopback() || (a.Is6() && a.IsLinkLocalUnicast()) {
			continue
		}
		if len(cfg.NodePortAddresses) > 0 && !slices.ContainsFunc(cidrs, func(p netip.Prefix) bool { return p.Contains(a) }) {
			continue
		}
		out = append(out, a)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}
