package userspace

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

// UDP relaying: one socket per Service address and port receives every
// client's datagrams; each client (address and port) gets a session, a
// socket connected to the endpoint picked for it, which relays the
// endpoint's answers back from the Service address. A session ends after
// udpIdle without traffic either way.
const (
	udpIdle        = 60 * time.Second
	maxUDPSessions = 1 << 14 // per frontend; past it new clients are dropped
	udpBuffer      = 64 << 10
)

type udpFrontend struct {
	addr   netip.AddrPort
	conn   *net.UDPConn
	pool   atomic.Pointer[pool]
	logger klog.Logger
	base   time.Duration

	mu       sync.Mutex
	sessions map[netip.AddrPort]*udpSession
	closed   bool
}

type udpSession struct {
	client netip.AddrPort
	up     *net.UDPConn
	to     *backend
	last   atomic.Int64 // unix nanoseconds of the last datagram either way
}

func listenUDP(addr netip.AddrPort) (*net.UDPConn, error) {
	network := "udp4"
	if addr.Addr().Is6() {
		network = "udp6"
	}
	lc := net.ListenConfig{Control: listenControl}
	c, err := lc.ListenPacket(context.Background(), network, addr.String())
	if err != nil {
		return nil, err
	}
	return c.(*net.UDPConn), nil
}

// serve reads client datagrams until the socket is closed.
func (f *udpFrontend) serve() {
	buf := make([]byte, udpBuffer)
	for {
		n, client, err := f.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		if !f.pool.Load().forClient(client.Addr().Unmap()).admits(client.Addr().Unmap()) {
			continue // dropped, as upstream drops it
		}
		s := f.session(client)
		if s == nil {
			continue
		}
		s.last.Store(time.Now().UnixNano())
		s.to.bytesIn.Add(uint64(n))
		if _, err := s.up.Write(buf[:n]); err != nil {
			f.logger.V(4).Info("Relaying a datagram failed", "frontend", f.addr, "endpoint", s.to.addr, "err", err)
		}
	}
}

// session returns the client's session, making one (nil when there is no
// endpoint or too many sessions).
func (f *udpFrontend) session(client netip.AddrPort) *udpSession {
	f.mu.Lock()
	defer f.mu.Unlock()
	if s, ok := f.sessions[client]; ok || f.closed {
		return s
	}
	if len(f.sessions) >= maxUDPSessions {
		return nil
	}
	p := f.pool.Load().forClient(client.Addr().Unmap())
	now := time.Now()
	retried := false
	for _, b := range p.pick(client.Addr().Unmap(), now) {
		up, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(b.addr))
		if err != nil {
			b.failed(now, f.base)
			b.connectErrors.Add(1)
			retried = true
			continue
		}
		if p.affinity != nil {
			p.affinity.set(client.Addr().Unmap(), b.addr, now)
		}
		s := &udpSession{client: client, up: up, to: b}
		s.last.Store(now.UnixNano())
		f.sessions[client] = s
		b.active.Add(1)
		b.total.Add(1)
		if retried {
			b.retries.Add(1)
		}
		go f.back(s)
		return s
	}
	return nil
}

// back relays the endpoint's datagrams to the client until the session
// is idle for udpIdle (or the endpoint refuses: an ICMP error ends it).
func (f *udpFrontend) back(s *udpSession) {
	defer func() {
		f.mu.Lock()
		if f.sessions[s.client] == s {
			delete(f.sessions, s.client)
		}
		f.mu.Unlock()
		s.up.Close()
		s.to.active.Add(-1)
	}()
	buf := make([]byte, udpBuffer)
	for {
		_ = s.up.SetReadDeadline(time.Unix(0, s.last.Load()).Add(udpIdle))
		n, err := s.up.Read(buf)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && time.Since(time.Unix(0, s.last.Load())) < udpIdle {
				continue // traffic from the client moved the deadline on
			}
			if errors.Is(err, syscall.ECONNREFUSED) {
				// The endpoint answered port unreachable: back it off;
				// the client's next datagram starts a session elsewhere.
				s.to.failed(time.Now(), f.base)
				s.to.connectErrors.Add(1)
			}
			return
		}
		s.last.Store(time.Now().UnixNano())
		s.to.bytesOut.Add(uint64(n))
		if _, err := f.conn.WriteToUDPAddrPort(buf[:n], s.client); err != nil && errors.Is(err, net.ErrClosed) {
			return
		}
	}
}

// endStale ends the sessions whose endpoint p no longer has, as upstream
// deletes the conntrack entries of a removed UDP endpoint: the client's
// next datagram starts a session with a current endpoint.
func (f *udpFrontend) endStale(p *pool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.sessions) == 0 {
		return // the common case: nothing to build a set for
	}
	keep := map[netip.AddrPort]bool{}
	for _, q := range []*pool{p, p.cluster} {
		if q != nil {
			for _, b := range q.backends {
				keep[b.addr] = true
			}
		}
	}
	for client, s := range f.sessions {
		if !keep[s.to.addr] {
			delete(f.sessions, client)
			s.up.Close() // back returns and counts the session out
		}
	}
}

// close stops taking datagrams; sessions end by themselves when idle.
func (f *udpFrontend) close() {
	f.mu.Lock()
	f.closed = true
	f.mu.Unlock()
	_ = f.conn.Close()
}
