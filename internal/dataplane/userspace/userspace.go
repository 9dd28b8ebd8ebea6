// Package userspace is kproxy's userspace mode (--proxy-mode userspace):
// kproxy accepts each connection to a Service itself and relays it to an
// endpoint. Service addresses (ClusterIPs, external IPs, load-balancer
// IPs) are bound to a dummy interface, so the kernel delivers their
// traffic to kproxy's sockets like any local traffic: no NAT, no
// conntrack entry per connection, no netfilter rule at all, and kproxy
// sees the client's own address (for affinity, source-hash and the
// traffic policies). NodePorts are sockets on the node's NodePort
// addresses.
package userspace

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/sctp"
)

// Device is the dummy interface holding the Service addresses.
const Device = "kproxy0"

// Defaults of the relay.
const (
	dialTimeout = time.Second
	backoffBase = 2 * time.Second
)

// links is what the proxier needs of the kernel's interfaces (a fake in
// unit tests).
type links interface {
	EnsureDevice() error
	DeviceAddrs() ([]netip.Addr, error) // nil, nil when the device is gone
	AddAddr(a netip.Addr) error
	DelAddr(a netip.Addr) error
	DeleteDevice() error
	// LocalAddrs lists the addresses of the node's other interfaces.
	LocalAddrs() ([]netip.Addr, error)
	// MigrateRequests sets net.ipv4.tcp_migrate_req in the namespace.
	MigrateRequests() error
}

// Proxier is the userspace dataplane.
type Proxier struct {
	cfg    dataplane.Config
	links  links
	logger klog.Logger

	mu     sync.Mutex
	fronts map[frontKey]frontend
	addrs  map[netip.Addr]bool // held on Device
	relays sync.WaitGroup
	// serving counts the sockets' serve loops (which add relays).
	serving sync.WaitGroup
	// listenErrs are the sockets that could not listen, with the error
	// last logged.
	listenErrs map[frontKey]string
	// sctp: the kernel has SCTP (known once the first SCTP port comes).
	sctpOnce sync.Once
	sctp     bool
	// sysctlDone: the first Sync set net.ipv4.tcp_migrate_req.
	sysctlDone bool
}

// New returns a userspace proxier; it touches nothing until Sync.
func New(cfg dataplane.Config) (*Proxier, error) {
	return newProxier(cfg, netlinkLinks{})
}

func newProxier(cfg dataplane.Config, l links) (*Proxier, error) {
	return &Proxier{cfg: cfg, links: l, logger: klog.Background().WithName("userspace"),
		fronts: map[frontKey]frontend{}, addrs: map[netip.Addr]bool{}, listenErrs: map[frontKey]string{}}, nil
}

// Name implements dataplane.Dataplane.
func (p *Proxier) Name() string { return "userspace" }

// frontKey names a socket: protocol, address and port.
type frontKey struct {
	proto model.Protocol
	addr  netip.AddrPort
}

// frontend is a socket taking a Service's traffic.
type frontend interface {
	current() *pool
	setPool(p *pool)
	close()
}

func (f *tcpFrontend) current() *pool  { return f.pool.Load() }
func (f *tcpFrontend) setPool(p *pool) { f.pool.Store(p) }
func (f *tcpFrontend) close()          { _ = f.ln.Close() }
func (f *udpFrontend) current() *pool  { return f.pool.Load() }
func (f *udpFrontend) setPool(p *pool) {
	f.pool.Store(p)
	f.endStale(p)
}

// frontendSpec is one socket a port needs, the endpoints behind it, and
// which clients it takes: none with drop (a Local policy without a local
// endpoint, which upstream drops), those in ranges (the load-balancer
// source ranges; nil: every client). Under externalTrafficPolicy Local,
// clients nearby says are the node itself or its pods go to cluster
// instead, every usable endpoint, as upstream short-circuits them.
type frontendSpec struct {
	sp      *model.ServicePort
	eps     []*model.Endpoint
	drop    bool
	ranges  []netip.Prefix
	cluster []*model.Endpoint
	nearby  func(netip.Addr) bool
}

// endpointsFor returns the endpoints of a frontend under a policy, and
// whether it drops: with no endpoint at all, or none under the Cluster
// policy, there is no socket (ok false: the kernel refuses, as
// upstream's reject); under the Local policy without a local endpoint,
// a socket that drops everything.
func endpointsFor(sp *model.ServicePort, local bool) (eps []*model.Endpoint, drop, ok bool) {
	switch {
	case !sp.HasEndpoints, !local && len(sp.ClusterEndpoints) == 0:
		return nil, false, false
	case local && len(sp.LocalEndpoints) == 0:
		return nil, true, true
	case local:
		return sp.LocalEndpoints, false, true
	}
	return sp.ClusterEndpoints, false, true
}

// desired lists the sockets of snap and the addresses Device must hold.
// local are the addresses of the node's other interfaces.
func (p *Proxier) desired(snap *model.Snapshot, local []netip.Addr) (map[frontKey]frontendSpec, map[netip.Addr]bool) {
	fronts := map[frontKey]frontendSpec{}
	addrs := map[netip.Addr]bool{}
	for _, f := range p.cfg.Families {
		for _, sp := range snap.Family(f).Ports {
			if p.relayed(sp.Protocol) {
				addrs[sp.ClusterIP] = true
				for _, a := range append(slices.Clip(sp.ExternalIPs), sp.LoadBalancerIPs...) {
					addrs[a] = true
				}
			}
		}
	}
	nearby := p.nearby(snap, local, addrs)
	for _, f := range p.cfg.Families {
		nodePorts := dataplane.NodePortAddrs(p.cfg, f, local)
		for _, sp := range snap.Family(f).Ports {
			if !p.relayed(sp.Protocol) {
				continue
			}
			key := func(a netip.Addr, port uint16) frontKey {
				return frontKey{sp.Protocol, netip.AddrPortFrom(a, port)}
			}
			if eps, drop, ok := endpointsFor(sp, sp.InternalPolicyLocal); ok {
				fronts[key(sp.ClusterIP, sp.Port)] = frontendSpec{sp: sp, eps: eps, drop: drop}
			}
			eps, drop, ok := endpointsFor(sp, sp.ExternalPolicyLocal)
			if !ok {
				continue
			}
			ext := frontendSpec{sp: sp, eps: eps, drop: drop}
			if sp.ExternalPolicyLocal && len(sp.ClusterEndpoints) > 0 {
				ext.cluster, ext.nearby = sp.ClusterEndpoints, nearby
			}
			for _, a := range sp.ExternalIPs {
				fronts[key(a, sp.Port)] = ext
			}
			lb := ext
			lb.ranges = sp.SourceRanges
			for _, a := range sp.LoadBalancerIPs {
				fronts[key(a, sp.Port)] = lb
			}
			if sp.NodePort != 0 {
				for _, a := range nodePorts {
					fronts[key(a, sp.NodePort)] = ext
				}
			}
		}
	}
	return fronts, addrs
}

// nearby says which clients are the node itself (any of its addresses,
// Device's included: the node reaching a Service address there speaks
// from it) or, as detectLocalMode tells, its pods. The interface modes
// cannot be told from a socket, so there only the node itself is.
func (p *Proxier) nearby(snap *model.Snapshot, local []netip.Addr, device map[netip.Addr]bool) func(netip.Addr) bool {
	own := make(map[netip.Addr]bool, len(local)+len(device))
	for _, a := range local {
		own[a.Unmap()] = true
	}
	for a := range device {
		own[a] = true
	}
	var pods []netip.Prefix
	switch p.cfg.LocalMode {
	case dataplane.LocalClusterCIDR:
		pods = p.cfg.ClusterCIDRs
	case dataplane.LocalNodeCIDR:
		pods = snap.Node.PodCIDRs
	}
	return func(a netip.Addr) bool {
		return own[a] || slices.ContainsFunc(pods, func(p netip.Prefix) bool { return p.Contains(a) })
	}
}

// Sync implements dataplane.Dataplane: the addresses first (so a new
// socket's address is local when it starts accepting), then the sockets;
// a frontend that stays gets its new endpoints at once, with its open
// relays untouched; a frontend that goes stops accepting and lets its
// relays finish.
func (p *Proxier) Sync(ctx context.Context, snap *model.Snapshot, req dataplane.SyncRequest) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	local, err := p.links.LocalAddrs()
	if err != nil {
		return err
	}
	fronts, addrs := p.desired(snap, local)
	if req.Full || len(p.addrs) == 0 {
		if err := p.readAddrs(); err != nil {
			return err
		}
	}
	if !p.sysctlDone {
		p.sysctlDone = true
		// A kproxy that stops listening hands the connections its
		// listeners had queued to the listeners of another kproxy on the
		// same addresses (SO_REUSEPORT), so a rolling update with
		// overlapping processes refuses nothing (Linux 5.14+).
		if err := p.links.MigrateRequests(); err != nil {
			p.logger.Info("Cannot set net.ipv4.tcp_migrate_req; a restart may reset connections still queued", "err", err)
		}
	}
	var errs []error
	for a := range addrs {
		if !p.addrs[a] {
			if err := p.links.AddAddr(a); err != nil {
				errs = append(errs, err)
				continue
			}
			p.addrs[a] = true
		}
	}
	for key, spec := range fronts {
		fr, ok := p.fronts[key]
		if ok {
			fr.setPool(newPool(spec, fr.current()))
		} else {
			var err error
			if fr, err = p.open(key, spec); err != nil {
				// One socket that cannot bind (a host process holding
				// the port) must not fail the sync of every other
				// Service, as upstream only logs a port it cannot
				// open; the next sync tries again.
				if p.listenErrs[key] != err.Error() {
					p.logger.Error(err, "Cannot listen for a Service port; retried at each sync", "address", key.addr, "protocol", key.proto, "service", spec.sp.ID)
					p.listenErrs[key] = err.Error()
				}
				continue
			}
			delete(p.listenErrs, key)
			p.fronts[key] = fr
		}
	}
	for key := range p.listenErrs {
		if _, ok := fronts[key]; !ok {
			delete(p.listenErrs, key)
		}
	}
	for key, fr := range p.fronts {
		if _, ok := fronts[key]; !ok {
			fr.close()
			delete(p.fronts, key)
		}
	}
	for a := range p.addrs {
		if !addrs[a] {
			if err := p.links.DelAddr(a); err != nil {
				errs = append(errs, err)
				continue
			}
			delete(p.addrs, a)
		}
	}
	return errors.Join(errs...)
}

// relayed says whether the mode relays proto: TCP and UDP, and SCTP where
// the kernel has it (a kernel without it is said once in the log).
func (p *Proxier) relayed(proto model.Protocol) bool {
	if proto != model.SCTP {
		return true
	}
	p.sctpOnce.Do(func() {
		p.sctp = sctp.Supported()
		if !p.sctp {
			p.logger.Info("This kernel has no SCTP; SCTP Service ports are not relayed")
		}
	})
	return p.sctp
}

// open makes the socket of key and starts serving it.
func (p *Proxier) open(key frontKey, spec frontendSpec) (frontend, error) {
	first := newPool(spec, nil)
	if key.proto == model.UDP {
		c, err := listenUDP(key.addr)
		if err != nil {
			return nil, err
		}
		fr := &udpFrontend{addr: key.addr, conn: c, logger: p.logger, base: backoffBase, sessions: map[netip.AddrPort]*udpSession{}}
		fr.pool.Store(first)
		p.serving.Go(fr.serve)
		return fr, nil
	}
	listen, dial := listenTCP, dialTCP
	if key.proto == model.SCTP {
		listen, dial = listenSCTP, dialSCTP
	}
	ln, err := listen(key.addr)
	if err != nil {
		return nil, err
	}
	fr := &tcpFrontend{addr: key.addr, ln: ln, dial: dial, timeout: dialTimeout, base: backoffBase, logger: p.logger, relays: &p.relays}
	fr.pool.Store(first)
	p.serving.Go(fr.serve)
	return fr, nil
}

// readAddrs makes sure Device exists and reads what it holds.
func (p *Proxier) readAddrs() error {
	if err := p.links.EnsureDevice(); err != nil {
		return err
	}
	have, err := p.links.DeviceAddrs()
	if err != nil {
		return err
	}
	p.addrs = map[netip.Addr]bool{}
	for _, a := range have {
		if a.IsLinkLocalUnicast() {
			continue
		}
		p.addrs[a] = true
	}
	return nil
}

// Drifted implements dataplane.Dataplane: Device must still hold every
// address kproxy put there.
func (p *Proxier) Drifted(ctx context.Context) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	have, err := p.links.DeviceAddrs()
	if err != nil {
		return false, err
	}
	if have == nil && len(p.addrs) > 0 {
		return true, nil
	}
	set := map[netip.Addr]bool{}
	for _, a := range have {
		set[a] = true
	}
	for a := range p.addrs {
		if !set[a] {
			klog.FromContext(ctx).Info("A Service address is gone from the userspace mode's interface; the next sync repairs it", "address", a, "interface", Device)
			return true, nil
		}
	}
	return false, nil
}

// Drain implements dataplane.Drainer: every socket closes, so another
// kproxy listening on the same addresses (SO_REUSEPORT) takes each new
// connection, and with net.ipv4.tcp_migrate_req the ones still queued
// here; the open TCP relays get until ctx ends to finish. Device and its
// addresses stay for the next kproxy.
func (p *Proxier) Drain(ctx context.Context) {
	p.mu.Lock()
	for key, fr := range p.fronts {
		fr.close()
		delete(p.fronts, key)
	}
	p.mu.Unlock()
	done := make(chan struct{})
	go func() {
		p.serving.Wait() // no relay starts after this
		p.relays.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// Cleanup implements dataplane.Dataplane: the sockets close and Device
// goes, with every address on it.
func (p *Proxier) Cleanup(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for key, fr := range p.fronts {
		fr.close()
		delete(p.fronts, key)
	}
	p.addrs = map[netip.Addr]bool{}
	return p.links.DeleteDevice()
}

// Stat is what the relays of one endpoint of one Service port counted,
// over every frontend of the port.
type Stat struct {
	Port     model.PortID
	Family   model.Family
	Endpoint netip.AddrPort
	// Active is the relays open now (TCP connections, UDP sessions).
	Active int64
	// Total relays opened, Retries those opened after another endpoint's
	// connect failed, ConnectErrors failed connects to this endpoint.
	Total, Retries, ConnectErrors uint64
	// BytesIn went to the endpoint, BytesOut came from it.
	BytesIn, BytesOut uint64
}

// Stats returns every current endpoint's counters, sorted by port and
// endpoint. An endpoint that leaves a port takes its counters with it.
func (p *Proxier) Stats() []Stat {
	p.mu.Lock()
	defer p.mu.Unlock()
	type key struct {
		port model.PortID
		fam  model.Family
		ep   netip.AddrPort
	}
	sums := map[key]*Stat{}
	for _, fr := range p.fronts {
		pl := fr.current()
		backends := pl.backends
		if pl.cluster != nil {
			backends = append(slices.Clip(backends), pl.cluster.backends...)
		}
		for _, b := range backends {
			k := key{pl.sp.ID, pl.sp.Family, b.addr}
			s := sums[k]
			if s == nil {
				s = &Stat{Port: k.port, Family: k.fam, Endpoint: k.ep}
				sums[k] = s
			}
			s.Active += b.active.Load()
			s.Total += b.total.Load()
			s.Retries += b.retries.Load()
			s.ConnectErrors += b.connectErrors.Load()
			s.BytesIn += b.bytesIn.Load()
			s.BytesOut += b.bytesOut.Load()
		}
	}
	out := make([]Stat, 0, len(sums))
	for _, s := range sums {
		out = append(out, *s)
	}
	slices.SortFunc(out, func(a, b Stat) int {
		if a.Port != b.Port {
			if a.Port.Less(b.Port) {
				return -1
			}
			return 1
		}
		if a.Family != b.Family {
			return int(a.Family) - int(b.Family)
		}
		return a.Endpoint.Compare(b.Endpoint)
	})
	return out
}
