package userspace

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/sctp"
)

// tcpFrontend accepts the connections of one Service address and port and
// relays each to an endpoint of its pool: TCP, or SCTP associations (one-
// to-one sockets, which Go serves as TCP connections).
type tcpFrontend struct {
	addr    netip.AddrPort
	ln      net.Listener
	pool    atomic.Pointer[pool]
	dial    func(to netip.AddrPort, timeout time.Duration) (net.Conn, error)
	timeout time.Duration // connect timeout per endpoint
	base    time.Duration // first backoff of a failed endpoint
	logger  klog.Logger
	relays  *sync.WaitGroup
}

// listenControl sets what every listener needs: SO_REUSEADDR and
// SO_REUSEPORT, so that a restarted kproxy binds the same addresses while
// the old one still listens (with net.ipv4.tcp_migrate_req the kernel
// hands the old listener's queued connections to the new one), and
// IP_FREEBIND, so that binding does not wait for the address.
func listenControl(network, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) { serr = socketOptions(network, int(fd)) })
	if err != nil {
		return err
	}
	return serr
}

// socketOptions sets listenControl's options on fd, a socket of network
// ("tcp4", "udp6", "sctp4", …).
func socketOptions(network string, fd int) error {
	for _, o := range [][2]int{{unix.SOL_SOCKET, unix.SO_REUSEADDR}, {unix.SOL_SOCKET, unix.SO_REUSEPORT}} {
		if err := unix.SetsockoptInt(fd, o[0], o[1], 1); err != nil {
			return err
		}
	}
	if strings.HasSuffix(network, "6") {
		return unix.SetsockoptInt(fd, unix.SOL_IPV6, unix.IPV6_FREEBIND, 1)
	}
	return unix.SetsockoptInt(fd, unix.SOL_IP, unix.IP_FREEBIND, 1)
}

func dialTCP(to netip.AddrPort, timeout time.Duration) (net.Conn, error) {
	return net.DialTimeout("tcp", to.String(), timeout)
}

// listenSCTP is listenTCP for SCTP, with the same socket options.
func listenSCTP(addr netip.AddrPort) (net.Listener, error) {
	network := "sctp4"
	if addr.Addr().Is6() {
		network = "sctp6"
	}
	return sctp.Listen(addr, func(fd int) error { return socketOptions(network, fd) })
}

func dialSCTP(to netip.AddrPort, timeout time.Duration) (net.Conn, error) {
	return sctp.Dial(netip.AddrPort{}, to, timeout)
}

func listenTCP(addr netip.AddrPort) (net.Listener, error) {
	network := "tcp4"
	if addr.Addr().Is6() {
		network = "tcp6"
	}
	lc := net.ListenConfig{Control: listenControl}
	return lc.Listen(context.Background(), network, addr.String())
}

// serve accepts until the listener is closed.
func (f *tcpFrontend) serve() {
	for {
		c, err := f.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			f.logger.V(2).Info("Accept failed", "frontend", f.addr, "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		f.relays.Add(1)
		go func() {
			defer f.relays.Done()
			f.relay(c.(*net.TCPConn))
		}()
	}
}

// relay connects the client to an endpoint (the pool's pick, then the
// others: a refused or timed-out connect marks the endpoint down for a
// backoff and moves on) and copies both ways until both sides are done.
// With no endpoint to reach, the client's connection is reset.
func (f *tcpFrontend) relay(client *net.TCPConn) {
	defer client.Close()
	src, _ := netip.ParseAddrPort(client.RemoteAddr().String())
	p := f.pool.Load().forClient(src.Addr().Unmap())
	if !p.admits(src.Addr().Unmap()) {
		// Upstream drops such a client's SYN; a socket can only refuse
		// it once the handshake is done: a reset.
		_ = client.SetLinger(0)
		return
	}
	now := time.Now()
	var up *net.TCPConn
	var to *backend
	retried := false
	for _, b := range p.pick(src.Addr().Unmap(), now) {
		c, err := f.dial(b.addr, f.timeout)
		if err != nil {
			b.failed(time.Now(), f.base)
			if p.sp.Balancing == model.BalanceRoundRobin {
				p.next.Add(1) // the failed endpoint's turn is taken
			}
			b.connectErrors.Add(1)
			retried = true
			f.logger.V(4).Info("Endpoint connect failed; trying another", "frontend", f.addr, "endpoint", b.addr, "err", err)
			continue
		}
		b.succeeded()
		up, to = c.(*net.TCPConn), b
		break
	}
	if up == nil {
		_ = client.SetLinger(0)
		return
	}
	defer up.Close()
	if p.affinity != nil {
		p.affinity.set(src.Addr().Unmap(), to.addr, now)
	}
	to.active.Add(1)
	defer to.active.Add(-1)
	to.total.Add(1)
	if retried {
		to.retries.Add(1)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		// TCPConn.ReadFrom a TCPConn splices: the bytes stay in the kernel.
		n, _ := io.Copy(up, client)
		to.bytesIn.Add(uint64(n))
		_ = up.CloseWrite()
	}()
	n, _ := io.Copy(client, up)
	to.bytesOut.Add(uint64(n))
	_ = client.CloseWrite()
	wg.Wait()
}
