package objects

import (
	"net/netip"

	netutils "k8s.io/utils/net"
)

// ParseAddr parses an IP address the way upstream's sloppy parser reads API
// objects: IPv4 octets with leading zeros are decimal, an IPv4-mapped IPv6
// address is IPv4, and zones are refused. It never panics.
func ParseAddr(s string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(s); err == nil {
		if a.Zone() != "" {
			return netip.Addr{}, false
		}
		return a.Unmap(), true
	}
	// Rare: the legacy form with leading zeros ("010.0.0.1").
	ip := netutils.ParseIPSloppy(s)
	if ip == nil {
		return netip.Addr{}, false
	}
	a, ok := netip.AddrFromSlice(ip)
	return a.Unmap(), ok
}
