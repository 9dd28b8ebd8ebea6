package ipvs

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	libipvs "github.com/moby/ipvs"
	"github.com/vishvananda/netlink"

	"github.com/kproxy/kproxy/internal/dataplane/iptables"
	"github.com/kproxy/kproxy/internal/model"
)

// DummyDevice is the interface every Service IP is bound to, upstream's
// name, so that a takeover works in place.
const DummyDevice = "kube-ipvs0"

// kernel is everything IPVS mode does to the kernel: IPVS virtual and real
// servers (netlink, github.com/moby/ipvs), the dummy interface and its
// addresses (netlink), ip sets (the ipset CLI: one `ipset restore` per
// sync), iptables rules (iptables-restore) and sysctls. Tests use a fake.
type kernel interface {
	Services() ([]*libipvs.Service, error)
	Destinations(s *libipvs.Service) ([]*libipvs.Destination, error)
	NewService(s *libipvs.Service) error
	UpdateService(s *libipvs.Service) error
	DelService(s *libipvs.Service) error
	NewDestination(s *libipvs.Service, d *libipvs.Destination) error
	UpdateDestination(s *libipvs.Service, d *libipvs.Destination) error
	DelDestination(s *libipvs.Service, d *libipvs.Destination) error
	SetTimeouts(c *libipvs.Config) error

	// EnsureDummy creates kube-ipvs0 if it is missing.
	EnsureDummy() error
	// DummyAddrs lists kube-ipvs0's addresses (none when it is missing).
	DummyAddrs() ([]netip.Addr, error)
	AddDummyAddr(a netip.Addr) error
	DelDummyAddr(a netip.Addr) error
	DeleteDummy() error
	// LocalAddrs lists the addresses of every interface but kube-ipvs0.
	LocalAddrs() ([]netip.Addr, error)

	// SetMembers returns every KUBE-* set and its members, in ipset's
	// own text (`ipset save`).
	SetMembers() (map[string][]string, error)
	// IPSetRestore runs `ipset restore -exist` with the input.
	IPSetRestore(input string) error

	// IPTablesRestore runs iptables-restore --noflush for the family.
	IPTablesRestore(fam model.Family, input string) error
	// EnsureJump adds the rule at the top of a built-in chain unless
	// it is there.
	EnsureJump(fam model.Family, j jump) error

	WriteSysctl(name string, v int) error
	// KernelRelease returns the running kernel's release
	// (/proc/sys/kernel/osrelease, e.g. "5.4.0-150-generic").
	KernelRelease() (string, error)
	// Has reports whether a /proc or /sys path exists (what the kernel
	// has loaded: /proc/net/ip_vs, /sys/module/ip_set).
	Has(path string) bool
}

// osKernel is the real kernel of this process's network namespace.
type osKernel struct {
	ex      iptables.Exec
	backend iptables.Backend

	once   sync.Once
	handle *libipvs.Handle
	err    error

	// nl keeps its netlink sockets open: the package-level functions of
	// vishvananda/netlink open a socket per request, and a cold start
	// binds one address per Service. dummy is kube-ipvs0, looked up once
	// per full sync (EnsureDummy) and again when it is gone.
	nlOnce sync.Once
	nl     *netlink.Handle
	nlErr  error
	dummy  netlink.Link
}

func newOSKernel() *osKernel { return &osKernel{ex: iptables.OSExec{}} }

func (k *osKernel) nlHandle() (*netlink.Handle, error) {
	k.nlOnce.Do(func() { k.nl, k.nlErr = netlink.NewHandle() })
	return k.nl, k.nlErr
}

// dummyLink returns kube-ipvs0 (cached; looked up when fresh is set or
// nothing is cached).
func (k *osKernel) dummyLink(fresh bool) (*netlink.Handle, netlink.Link, error) {
	h, err := k.nlHandle()
	if err != nil {
		return nil, nil, err
	}
	if fresh || k.dummy == nil {
		if k.dummy, err = h.LinkByName(DummyDevice); err != nil {
			k.dummy = nil
			return h, nil, err
		}
	}
	return h, k.dummy, nil
}

func (k *osKernel) ipvs() (*libipvs.Handle, error) {
	k.once.Do(func() { k.handle, k.err = libipvs.New("") })
	return k.handle, k.err
}

func (k *osKernel) Services() ([]*libipvs.Service, error) {
	h, err := k.ipvs()
	if err != nil {
		return nil, err
	}
	return h.GetServices()
}

func (k *osKernel) Destinations(s *libipvs.Service) ([]*libipvs.Destination, error) {
	h, err := k.ipvs()
	if err != nil {
		return nil, err
	}
	return h.GetDestinations(s)
}

func (k *osKernel) do(f func(h *libipvs.Handle) error) error {
	h, err := k.ipvs()
	if err != nil {
		return err
	}
	return f(h)
}

func (k *osKernel) NewService(s *libipvs.Service) error {
	return k.do(func(h *libipvs.Handle) error { return h.NewService(s) })
}

func (k *osKernel) UpdateService(s *libipvs.Service) error {
	return k.do(func(h *libipvs.Handle) error { return h.UpdateService(s) })
}

func (k *osKernel) DelService(s *libipvs.Service) error {
	return k.do(func(h *libipvs.Handle) error { return h.DelService(s) })
}

func (k *osKernel) NewDestination(s *libipvs.Service, d *libipvs.Destination) error {
	return k.do(func(h *libipvs.Handle) error { return h.NewDestination(s, d) })
}

func (k *osKernel) UpdateDestination(s *libipvs.Service, d *libipvs.Destination) error {
	return k.do(func(h *libipvs.Handle) error { return h.UpdateDestination(s, d) })
}

func (k *osKernel) DelDestination(s *libipvs.Service, d *libipvs.Destination) error {
	return k.do(func(h *libipvs.Handle) error { return h.DelDestination(s, d) })
}

func (k *osKernel) SetTimeouts(c *libipvs.Config) error {
	return k.do(func(h *libipvs.Handle) error { return h.SetConfig(c) })
}

func (k *osKernel) EnsureDummy() error {
	h, _, err := k.dummyLink(true)
	if err == nil {
		return nil
	}
	if h == nil {
		return err
	}
	err = h.LinkAdd(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: DummyDevice}})
	if err != nil && !errors.Is(err, syscall.EEXIST) {
		return fmt.Errorf("creating %s: %w", DummyDevice, err)
	}
	_, _, err = k.dummyLink(true)
	return err
}

func (k *osKernel) DummyAddrs() ([]netip.Addr, error) {
	h, link, err := k.dummyLink(true)
	if err != nil {
		return nil, nil
	}
	addrs, err := h.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("listing %s's addresses: %w", DummyDevice, err)
	}
	return netlinkAddrs(addrs), nil
}

func netlinkAddrs(addrs []netlink.Addr) []netip.Addr {
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out = append(out, ip.Unmap())
		}
	}
	return out
}

// dummyAddr is a as kube-ipvs0 holds it: a host prefix, without duplicate
// address detection (an IPv6 address would stay tentative, and unusable,
// on the interface, which is down).
func dummyAddr(a netip.Addr) *netlink.Addr {
	return &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}, Flags: syscall.IFA_F_NODAD}
}

func (k *osKernel) AddDummyAddr(a netip.Addr) error {
	h, link, err := k.dummyLink(false)
	if err != nil {
		return err
	}
	err = h.AddrReplace(link, dummyAddr(a))
	if errors.Is(err, syscall.ENODEV) {
		// kube-ipvs0 was deleted and made again since the lookup.
		if h, link, err = k.dummyLink(true); err == nil {
			err = h.AddrReplace(link, dummyAddr(a))
		}
	}
	if err != nil {
		return fmt.Errorf("binding %s to %s: %w", a, DummyDevice, err)
	}
	return nil
}

func (k *osKernel) DelDummyAddr(a netip.Addr) error {
	h, link, err := k.dummyLink(false)
	if err != nil {
		return nil
	}
	err = h.AddrDel(link, dummyAddr(a))
	if err != nil && !errors.Is(err, syscall.EADDRNOTAVAIL) && !errors.Is(err, syscall.ENODEV) {
		return fmt.Errorf("unbinding %s from %s: %w", a, DummyDevice, err)
	}
	return nil
}

func (k *osKernel) DeleteDummy() error {
	h, link, err := k.dummyLink(true)
	if err != nil {
		return nil
	}
	k.dummy = nil
	return h.LinkDel(link)
}

func (k *osKernel) LocalAddrs() ([]netip.Addr, error) {
	h, err := k.nlHandle()
	if err != nil {
		return nil, err
	}
	links, err := h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("listing interfaces: %w", err)
	}
	var out []netip.Addr
	for _, l := range links {
		// The userspace mode's interface (kproxy0) holds Service
		// addresses too, on a node coming from that mode.
		if name := l.Attrs().Name; name == DummyDevice || name == "kproxy0" {
			continue
		}
		addrs, err := h.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return nil, fmt.Errorf("listing %s's addresses: %w", l.Attrs().Name, err)
		}
		out = append(out, netlinkAddrs(addrs)...)
	}
	return out, nil
}

func (k *osKernel) SetMembers() (map[string][]string, error) {
	out, err := k.ex.Run(context.Background(), nil, "ipset", "save")
	if err != nil {
		return nil, err
	}
	return parseIPSetSave(string(out)), nil
}

// parseIPSetSave reads the KUBE-* sets of `ipset save` output: every set
// (created) with its members (added).
func parseIPSetSave(out string) map[string][]string {
	sets := map[string][]string{}
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) < 2 || !strings.HasPrefix(f[1], "KUBE-") {
			continue
		}
		switch f[0] {
		case "create":
			if sets[f[1]] == nil {
				sets[f[1]] = []string{}
			}
		case "add":
			if len(f) >= 3 {
				sets[f[1]] = append(sets[f[1]], f[2])
			}
		}
	}
	return sets
}

func (k *osKernel) IPSetRestore(input string) error {
	_, err := k.ex.Run(context.Background(), []byte(input), "ipset", "restore", "-exist")
	return err
}

func (k *osKernel) iptablesBackend() iptables.Backend {
	if k.backend == "" {
		k.backend = iptables.DetectBackend(context.Background(), k.ex)
	}
	return k.backend
}

func (k *osKernel) IPTablesRestore(fam model.Family, input string) error {
	_, err := k.ex.Run(context.Background(), []byte(input), k.iptablesBackend().Command(fam, "-restore"), "--noflush", "--wait")
	return err
}

func (k *osKernel) EnsureJump(fam model.Family, j jump) error {
	cmd := k.iptablesBackend().Command(fam, "")
	args := iptables.SplitArgs(j.rule)
	check := append([]string{"-w", "-t", j.table, "-C", j.chain}, args...)
	if _, err := k.ex.Run(context.Background(), nil, cmd, check...); err == nil {
		return nil
	}
	insert := append([]string{"-w", "-t", j.table, "-I", j.chain, "1"}, args...)
	_, err := k.ex.Run(context.Background(), nil, cmd, insert...)
	return err
}

func (k *osKernel) Has(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func (k *osKernel) KernelRelease() (string, error) {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	return strings.TrimSpace(string(b)), err
}

func (k *osKernel) WriteSysctl(name string, v int) error {
	path := filepath.Join("/proc/sys", strings.ReplaceAll(name, ".", "/"))
	cur, err := os.ReadFile(path)
	if err == nil && strings.TrimSpace(string(cur)) == strconv.Itoa(v) {
		return nil
	}
	return os.WriteFile(path, []byte(strconv.Itoa(v)), 0o644)
}
