package userspace

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"syscall"

	"github.com/vishvananda/netlink"
)

// netlinkLinks keeps Device through rtnetlink.
type netlinkLinks struct{}

func (netlinkLinks) device() (netlink.Link, error) { return netlink.LinkByName(Device) }

// EnsureDevice makes Device a dummy interface, or where the kernel has no
// dummy driver (some VM kernels) a bridge without ports: either only
// holds addresses, and stays down.
func (l netlinkLinks) EnsureDevice() error {
	if _, err := l.device(); err == nil {
		return nil
	}
	attrs := netlink.LinkAttrs{Name: Device}
	err := netlink.LinkAdd(&netlink.Dummy{LinkAttrs: attrs})
	if errors.Is(err, syscall.EOPNOTSUPP) {
		err = netlink.LinkAdd(&netlink.Bridge{LinkAttrs: attrs})
	}
	if err != nil && !errors.Is(err, syscall.EEXIST) {
		return fmt.Errorf("creating %s: %w", Device, err)
	}
	return nil
}

func (l netlinkLinks) DeviceAddrs() ([]netip.Addr, error) {
	link, err := l.device()
	if err != nil {
		return nil, nil //nolint:nilerr // no device: no address
	}
	addrs, err := netlink.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("listing %s's addresses: %w", Device, err)
	}
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out = append(out, ip.Unmap())
		}
	}
	return out, nil
}

// hostAddr is a as Device holds it: a host prefix without duplicate
// address detection (an IPv6 address would stay tentative on a down
// interface, and unusable).
func hostAddr(a netip.Addr) *netlink.Addr {
	return &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}, Flags: syscall.IFA_F_NODAD}
}

func (l netlinkLinks) AddAddr(a netip.Addr) error {
	link, err := l.device()
	if err != nil {
		return fmt.Errorf("binding %s to %s: %w", a, Device, err)
	}
	if err := netlink.AddrReplace(link, hostAddr(a)); err != nil {
		return fmt.Errorf("binding %s to %s: %w", a, Device, err)
	}
	return nil
}

func (l netlinkLinks) DelAddr(a netip.Addr) error {
	link, err := l.device()
	if err != nil {
		return nil //nolint:nilerr // no device: the address is gone
	}
	err = netlink.AddrDel(link, hostAddr(a))
	if err != nil && !errors.Is(err, syscall.EADDRNOTAVAIL) && !errors.Is(err, syscall.ENODEV) {
		return fmt.Errorf("unbinding %s from %s: %w", a, Device, err)
	}
	return nil
}

func (l netlinkLinks) DeleteDevice() error {
	link, err := l.device()
	if err != nil {
		return nil //nolint:nilerr // already gone
	}
	if err := netlink.LinkDel(link); err != nil && !errors.Is(err, syscall.ENODEV) {
		return fmt.Errorf("deleting %s: %w", Device, err)
	}
	return nil
}

// ipvsDevice is IPVS mode's interface of Service addresses (kproxy's and
// upstream's): on a node coming from IPVS mode its addresses are
// ClusterIPs, not node addresses, until the leftovers are cleaned up.
const ipvsDevice = "kube-ipvs0"

// LocalAddrs lists the addresses of every interface but Device and
// ipvsDevice.
func (netlinkLinks) LocalAddrs() ([]netip.Addr, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("listing interfaces: %w", err)
	}
	var out []netip.Addr
	for _, l := range links {
		if name := l.Attrs().Name; name == Device || name == ipvsDevice {
			continue
		}
		addrs, err := netlink.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return nil, fmt.Errorf("listing %s's addresses: %w", l.Attrs().Name, err)
		}
		for _, a := range addrs {
			if ip, ok := netip.AddrFromSlice(a.IP); ok {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out, nil
}

func (netlinkLinks) MigrateRequests() error {
	return os.WriteFile("/proc/sys/net/ipv4/tcp_migrate_req", []byte("1"), 0o644)
}
