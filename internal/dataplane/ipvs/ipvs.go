// Package ipvs is kproxy's IPVS dataplane (--proxy-mode ipvs): a virtual
// server per Service frontend with the endpoints as real servers (NAT
// forwarding), Service IPs bound to the dummy kube-ipvs0, and upstream
// kube-proxy's ip sets and small iptables rule set around them for
// masquerading, NodePorts, source ranges and rejecting unknown ports.
package ipvs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"

	libipvs "github.com/moby/ipvs"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/model"
)

// Proxier is the IPVS Dataplane. Calls are serialised by a mutex.
type Proxier struct {
	cfg dataplane.Config
	k   kernel

	mu sync.Mutex
	// ready is false until the kernel was read (and after a failed sync):
	// the next sync reads IPVS, kube-ipvs0 and the ip sets again.
	ready bool
	// mirror of the kernel, kept between syncs.
	servers map[vsKey]*kernelServer
	bound   map[netip.Addr]bool
	members map[string]map[string]bool // full set name -> members
	rules   map[model.Family]string    // iptables input last written
}

// kernelServer is a virtual server as the kernel has it.
type kernelServer struct {
	svc   *libipvs.Service
	dests map[netip.AddrPort]*libipvs.Destination
}

var (
	_ dataplane.Dataplane = (*Proxier)(nil)
	_ dataplane.DryRunner = (*Proxier)(nil)
)

// Option customises a Proxier.
type Option func(*Proxier)

// withKernel replaces the kernel (tests).
func withKernel(k kernel) Option { return func(p *Proxier) { p.k = k } }

// New returns an IPVS dataplane for cfg. It has no side effects.
func New(cfg dataplane.Config, opts ...Option) (*Proxier, error) {
	if cfg.MasqueradeBit < 0 || cfg.MasqueradeBit > 31 {
		return nil, fmt.Errorf("masqueradeBit %d is not in 0-31", cfg.MasqueradeBit)
	}
	if len(cfg.Families) == 0 {
		cfg.Families = []model.Family{model.IPv4}
	}
	p := &Proxier{cfg: cfg}
	for _, o := range opts {
		o(p)
	}
	if p.k == nil {
		p.k = newOSKernel()
	}
	return p, nil
}

// Name implements dataplane.Dataplane.
func (p *Proxier) Name() string { return "ipvs" }

// Sync implements dataplane.Dataplane. Every sync renders every port (the
// rendering is cheap) and diffs it against the kernel mirror, so a change
// touches only the virtual servers, real servers, addresses and set
// members it concerns; a full sync (and the first one) reads the kernel
// again first, so a restart changes nothing that is already right.
func (p *Proxier) Sync(ctx context.Context, snap *model.Snapshot, req dataplane.SyncRequest) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	full := req.Full || !p.ready
	if full {
		if err := p.setup(ctx); err != nil {
			return err
		}
		if err := p.readKernel(); err != nil {
			return err
		}
	}
	local, err := p.k.LocalAddrs()
	if err != nil {
		return err
	}
	want := make([]*desired, 0, len(p.cfg.Families))
	for _, f := range p.cfg.Families {
		want = append(want, render(p.cfg, snap.Family(f), snap.Node, local))
	}
	if err := p.apply(ctx, want, full); err != nil {
		p.ready = false
		return err
	}
	return nil
}

type sysctl struct {
	name string
	v    int
}

// setup is done at every full sync: the node settings IPVS mode needs
// (nodeSettings) and the dummy interface.
func (p *Proxier) setup(ctx context.Context) error {
	errs := p.nodeSettings()
	if err := p.k.EnsureDummy(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		klog.FromContext(ctx).Error(err, "Setting up IPVS mode")
		return err
	}
	return nil
}

// InitNode is --init-only in IPVS mode: the node settings, as upstream's
// proxier makes them before its init-only return (the dummy interface and
// the rules wait for the proxy, as upstream's do). A proxy container
// without write access to /proc/sys then finds them in place: a sysctl
// already at its value is not written.
func (p *Proxier) InitNode(ctx context.Context) error {
	if err := errors.Join(p.nodeSettings()...); err != nil {
		return fmt.Errorf("setting up IPVS mode: %w", err)
	}
	klog.FromContext(ctx).V(2).Info("Set IPVS mode's sysctls and timeouts")
	return nil
}

// nodeSettings sets the sysctls IPVS mode needs and IPVS's timeouts (those
// configured), returning every failure.
func (p *Proxier) nodeSettings() []error {
	sysctls := []sysctl{
		// Conntrack entries for IPVS connections, which the masquerade
		// rules need.
		{"net.ipv4.vs.conntrack", 1},
		// Connections to a deleted real server are dropped at once, and
		// persistence templates of quiesced ones expire.
		{"net.ipv4.vs.expire_nodest_conn", 1},
		{"net.ipv4.vs.expire_quiescent_template", 1},
		{"net.ipv4.ip_forward", 1},
	}
	if p.cfg.IPVS.StrictARP {
		sysctls = append(sysctls, sysctl{"net.ipv4.conf.all.arp_ignore", 1}, sysctl{"net.ipv4.conf.all.arp_announce", 2})
	}
	var errs []error
	switch rel, err := p.k.KernelRelease(); {
	case err != nil:
		errs = append(errs, fmt.Errorf("reading the kernel release: %w", err))
	case connReuseModeZero(rel):
		// Kernels 4.1 to 5.8 with conntrack on delay a new connection
		// that reuses the ports of one in TIME_WAIT by a second
		// (kubernetes#81775); upstream sets the mode to 0 there.
		sysctls = append(sysctls, sysctl{"net.ipv4.vs.conn_reuse_mode", 0})
	}
	for _, s := range sysctls {
		if err := p.k.WriteSysctl(s.name, s.v); err != nil {
			errs = append(errs, fmt.Errorf("sysctl %s=%d: %w", s.name, s.v, err))
		}
	}
	c := p.cfg.IPVS
	if c.TCPTimeout > 0 || c.TCPFinTimeout > 0 || c.UDPTimeout > 0 {
		if err := p.k.SetTimeouts(&libipvs.Config{TimeoutTCP: c.TCPTimeout, TimeoutTCPFin: c.TCPFinTimeout, TimeoutUDP: c.UDPTimeout}); err != nil {
			errs = append(errs, fmt.Errorf("setting IPVS timeouts: %w", err))
		}
	}
	return errs
}

// connReuseModeZero reports whether a kernel of release rel needs
// net.ipv4.vs.conn_reuse_mode=0, as upstream sets it: from 4.1 (which has
// the sysctl) to before 5.9 (which fixed the delay). An unparsable release
// is left alone.
func connReuseModeZero(rel string) bool {
	v, err := utilversion.ParseGeneric(rel)
	return err == nil && v.AtLeast(connReuseModeFrom) && v.LessThan(connReuseModeFixed)
}

var (
	connReuseModeFrom  = utilversion.MustParseGeneric("4.1")
	connReuseModeFixed = utilversion.MustParseGeneric("5.9")
)

// readKernel rebuilds the mirror from the kernel.
func (p *Proxier) readKernel() error {
	svcs, err := p.k.Services()
	if err != nil {
		return fmt.Errorf("listing IPVS virtual servers: %w", err)
	}
	p.servers = make(map[vsKey]*kernelServer, len(svcs))
	for _, s := range svcs {
		k, ok := keyOf(s)
		if !ok {
			continue // a firewall-mark service: not ours
		}
		dests, err := p.k.Destinations(s)
		if err != nil {
			return fmt.Errorf("listing the real servers of %s: %w", k, err)
		}
		p.servers[k] = &kernelServer{svc: s, dests: destMap(dests)}
	}
	addrs, err := p.k.DummyAddrs()
	if err != nil {
		return err
	}
	p.bound = map[netip.Addr]bool{}
	for _, a := range addrs {
		p.bound[a] = true
	}
	sets, err := p.k.SetMembers()
	if err != nil {
		return fmt.Errorf("listing ip sets: %w", err)
	}
	p.members = map[string]map[string]bool{}
	for name, ms := range sets {
		p.members[name] = map[string]bool{}
		for _, m := range ms {
			p.members[name][m] = true
		}
	}
	p.rules = map[model.Family]string{}
	p.ready = true
	return nil
}

func destMap(dests []*libipvs.Destination) map[netip.AddrPort]*libipvs.Destination {
	m := make(map[netip.AddrPort]*libipvs.Destination, len(dests))
	for _, d := range dests {
		if a, ok := netip.AddrFromSlice(d.Address); ok {
			m[netip.AddrPortFrom(a.Unmap(), d.Port)] = d
		}
	}
	return m
}

// Drifted implements dataplane.Dataplane: kube-ipvs0 must still hold every
// Service IP kproxy bound (one netlink dump of its addresses; deleting
// the interface or its addresses takes every ClusterIP away). A drift
// makes the next sync full: it reads the kernel again and repairs.
func (p *Proxier) Drifted(ctx context.Context) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.ready || len(p.bound) == 0 {
		return false, nil
	}
	addrs, err := p.k.DummyAddrs()
	if err != nil {
		return false, err
	}
	have := map[netip.Addr]bool{}
	for _, a := range addrs {
		have[a] = true
	}
	for a := range p.bound {
		if !have[a] {
			klog.FromContext(ctx).Info("A Service IP is gone from kube-ipvs0; the next sync repairs it", "address", a, "interface", DummyDevice)
			p.ready = false
			return true, nil
		}
	}
	return false, nil
}

// Cleanup implements dataplane.Dataplane: it deletes every IPVS virtual
// server (but those in excludeCIDRs), kube-ipvs0 and the KUBE-* ip sets,
// kproxy's and upstream kube-proxy's. The iptables rules that refer to the
// sets are the iptables backend's Cleanup (which runs before this one).
// A kernel without IPVS (or ip sets) is left alone: nothing is loaded to
// look. Sets still referenced by iptables rules stay (logged at V(2)).
func (p *Proxier) Cleanup(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ready = false
	var errs []error
	if p.k.Has("/proc/net/ip_vs") {
		svcs, err := p.k.Services()
		errs = append(errs, err)
		for _, s := range svcs {
			if k, ok := keyOf(s); ok && p.excluded(k.addr) {
				continue
			}
			errs = append(errs, p.k.DelService(s))
		}
	}
	errs = append(errs, p.k.DeleteDummy())
	// Without the ip_set module there are no sets, and ipset is not run.
	if !p.k.Has("/sys/module/ip_set") {
		return errors.Join(errs...)
	}
	if sets, err := p.k.SetMembers(); err == nil {
		for _, name := range slices.Sorted(maps.Keys(sets)) {
			if err := p.k.IPSetRestore("destroy " + name + "\n"); err != nil {
				klog.FromContext(ctx).V(2).Info("Could not destroy ip set", "set", name, "err", err)
			}
		}
	}
	return errors.Join(errs...)
}

// excluded reports whether addr is in excludeCIDRs.
func (p *Proxier) excluded(addr netip.Addr) bool {
	return slices.ContainsFunc(p.cfg.IPVS.ExcludeCIDRs, func(c netip.Prefix) bool { return c.Contains(addr) })
}

// Render implements dataplane.DryRunner: per family, the virtual servers
// (as ipvsadm --save writes them), the addresses of kube-ipvs0, the ip set
// members (ipset restore input) and the iptables rules.
func (p *Proxier) Render(w io.Writer, snap *model.Snapshot) error {
	for _, f := range p.cfg.Families {
		d := render(p.cfg, snap.Family(f), snap.Node, p.cfg.NodeIPs)
		if _, err := io.WriteString(w, dryRunText(d)); err != nil {
			return err
		}
	}
	return nil
}

// dryRunText prints d for --dry-run and golden tests.
func dryRunText(d *desired) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# %s: IPVS (ipvsadm --save)\n", d.fam)
	for _, vs := range d.sortedServers() {
		flag := "-t"
		switch vs.key.proto {
		case model.UDP:
			flag = "-u"
		case model.SCTP:
			flag = "--sctp-service"
		}
		addr := netip.AddrPortFrom(vs.key.addr, vs.key.port).String()
		fmt.Fprintf(&b, "-A %s %s -s %s", flag, addr, vs.scheduler)
		if _, name := vs.mhFlag(); name != "" {
			b.WriteString(" -b " + name)
		}
		if vs.timeout > 0 {
			fmt.Fprintf(&b, " -p %d", vs.timeout)
		}
		b.WriteString("\n")
		for _, r := range vs.reals {
			fmt.Fprintf(&b, "-a %s %s -r %s -m -w 1\n", flag, addr, r)
		}
	}
	fmt.Fprintf(&b, "# %s: %s addresses\n", d.fam, DummyDevice)
	for _, a := range slices.SortedFunc(maps.Keys(d.bound), netip.Addr.Compare) {
		b.WriteString(a.String() + "\n")
	}
	fmt.Fprintf(&b, "# %s: ip sets (ipset restore)\n", d.fam)
	b.WriteString(setRestore(merge([]*desired{d}), nil, true))
	fmt.Fprintf(&b, "# %s: iptables-restore --noflush\n", d.fam)
	b.WriteString(d.rules)
	return b.String()
}
