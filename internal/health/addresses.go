package health

import (
	"net"
	"net/netip"
	"slices"

	"github.com/kproxy/kproxy/internal/model"
)

// listenAddrs returns, computed once, the addresses each health-check port
// listens on.
func (s *ServiceHealthServer) listenAddrs() []netip.Addr {
	s.addrsOnce.Do(func() {
		s.addrs = s.resolveAddrs()
	})
	return s.addrs
}

func (s *ServiceHealthServer) resolveAddrs() []netip.Addr {
	prefixes, all := familyPrefixes(s.cfg.NodePortAddresses, s.cfg.Family)
	if all {
		return []netip.Addr{unspecified(s.cfg.Family)}
	}
	addrs, err := s.cfg.InterfaceAddrs()
	if err != nil {
		s.logger.Error(err, "Failed to get node ip address matching node port addresses, health check port will listen to all node addresses",
			"nodePortAddresses", s.cfg.NodePortAddresses)
		return []netip.Addr{unspecified(s.cfg.Family)}
	}
	return matchingAddrs(addrs, prefixes)
}

// familyPrefixes returns the CIDRs of family f among cidrs, and whether they
// mean "all addresses": none of the family, or a zero-length one. Entries
// that do not parse are skipped (validation reports them).
func familyPrefixes(cidrs []string, f model.Family) (prefixes []netip.Prefix, all bool) {
	for _, c := range cidrs {
		p, err := netip.ParsePrefix(c)
		if err != nil || model.FamilyOf(p.Addr()) != f {
			continue
		}
		if p.Bits() == 0 {
			return nil, true
		}
		prefixes = append(prefixes, p.Masked())
	}
	return prefixes, len(prefixes) == 0
}

// matchingAddrs returns the distinct addresses inside any prefix, sorted.
// The result may be empty: then no port listens, as upstream.
func matchingAddrs(addrs []netip.Addr, prefixes []netip.Prefix) []netip.Addr {
	var out []netip.Addr
	for _, a := range addrs {
		a = a.Unmap()
		for _, p := range prefixes {
			if p.Contains(a) && !slices.Contains(out, a) {
				out = append(out, a)
			}
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

func unspecified(f model.Family) netip.Addr {
	if f == model.IPv6 {
		return netip.IPv6Unspecified()
	}
	return netip.IPv4Unspecified()
}

// InterfaceAddrs lists the addresses of the host's interfaces.
func InterfaceAddrs() ([]netip.Addr, error) {
	ifAddrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range ifAddrs {
		var ip net.IP
		switch v := a.(type) {
		case *net.IPNet:
			ip = v.IP
		case *net.IPAddr:
			ip = v.IP
		}
		if addr, ok := netip.AddrFromSlice(ip); ok {
			out = append(out, addr.Unmap())
		}
	}
	return out, nil
}
