package model

import (
	"net/netip"
	"strings"

	netutils "k8s.io/utils/net"

	"github.com/kproxy/kproxy/internal/objects"
)

// parsePrefix parses a CIDR as upstream does (sloppy, host bits allowed) and
// returns it masked to its network. An IPv4-mapped IPv6 prefix is read as
// upstream's net.IPNet reads it: masked in IPv6 first, then, when the
// mask still covers the ::ffff: part, the IPv4 prefix it maps
// (::ffff:10.0.0.0/104 is 10.0.0.0/8, ::ffff:0:0/96 is 0.0.0.0/0);
// otherwise an IPv6 prefix (::ffff:0:0/80 is ::/80).
func parsePrefix(s string) (netip.Prefix, bool) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		_, n, err := netutils.ParseCIDRSloppy(s)
		if err != nil {
			return netip.Prefix{}, false
		}
		a, ok := netip.AddrFromSlice(n.IP)
		ones, _ := n.Mask.Size()
		if !ok {
			return netip.Prefix{}, false
		}
		p = netip.PrefixFrom(a, ones)
	}
	if p.Addr().Zone() != "" {
		return netip.Prefix{}, false
	}
	p = p.Masked()
	if p.Addr().Is4In6() {
		if p.Bits() < 96 {
			return netip.Prefix{}, false // a masked 4in6 address keeps all of ::ffff:
		}
		p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
	}
	return p, true
}

// ParsePrefix parses a CIDR of the configuration (nodePortAddresses) as
// upstream does: leading zeros and host bits allowed, masked to its network.
func ParsePrefix(s string) (netip.Prefix, bool) { return parsePrefix(strings.TrimSpace(s)) }

// problemList adds the problems of one object to a shared list.
type problemList struct {
	kind string
	key  objects.Key
	uid  string
	list *[]Problem
}

func (p *problemList) add(field, reason string) {
	*p.list = append(*p.list, Problem{Kind: p.kind, Object: p.key, UID: p.uid, Field: field, Reason: reason})
}

// addEvent adds a problem that names its own Event reason.
func (p *problemList) addEvent(field, event, reason string) {
	*p.list = append(*p.list, Problem{Kind: p.kind, Object: p.key, UID: p.uid, Field: field, Reason: reason, Event: event})
}

// addrList parses the non-blank entries of ss, reporting invalid ones as
// problems of field.
func addrList(ss []string, field string, probs *problemList) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		if strings.TrimSpace(s) == "" {
			continue
		}
		a, ok := objects.ParseAddr(s)
		if !ok {
			probs.add(field, "invalid IP address "+quote(s))
			continue
		}
		out = append(out, a)
	}
	return out
}

// NodeInfoOf returns what the proxy uses of this node's Node object (nil:
// not known), without reporting problems; Build and Update report those.
func NodeInfoOf(name string, n *objects.Node) NodeInfo {
	info, _ := makeNodeInfo(name, n)
	return info
}

// makeNodeInfo turns this node's Node object into a NodeInfo. A nil node
// gives a NodeInfo with only the name and Known false.
func makeNodeInfo(name string, n *objects.Node) (NodeInfo, []Problem) {
	info := NodeInfo{Name: name}
	if n == nil {
		return info, nil
	}
	var list []Problem
	probs := &problemList{kind: "Node", key: objects.Key{Name: n.Name}, list: &list}
	info.Known = true
	info.Zone = n.Zone()
	info.Deleting = n.Deleting
	info.ToBeDeleted = n.ToBeDeleted
	for _, s := range n.PodCIDRs {
		if p, ok := parsePrefix(strings.TrimSpace(s)); ok {
			info.PodCIDRs = append(info.PodCIDRs, p)
		} else {
			probs.add("spec.podCIDRs", "invalid CIDR "+quote(s))
		}
	}
	info.InternalIPs = addrList(n.InternalIPs, "status.addresses[InternalIP]", probs)
	info.ExternalIPs = addrList(n.ExternalIPs, "status.addresses[ExternalIP]", probs)
	return info, list
}

// quote shows a bad value in a problem, bounded so a huge value cannot flood
// the log.
func quote(s string) string {
	const maxLen = 64
	if len(s) > maxLen {
		s = s[:maxLen] + "..."
	}
	return `"` + strings.ToValidUTF8(s, "?") + `"`
}
