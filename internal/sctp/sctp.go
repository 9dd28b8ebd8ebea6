// Package sctp opens one-to-one style SCTP sockets (SOCK_STREAM +
// IPPROTO_SCTP) as Go net values. The Go runtime treats such a descriptor
// like a TCP one (accept, read, write, deadlines, shutdown), so a listener
// is a *net.TCPListener and a connection a *net.TCPConn whose addresses
// print as TCP ones. The standard library has no SCTP; this is the least
// it takes. A kernel without SCTP gives ErrUnsupported.
package sctp

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// ErrUnsupported is returned when the kernel has no SCTP (no sctp module).
var ErrUnsupported = errors.New("sctp: the kernel does not support SCTP")

// Supported reports whether the kernel can open an SCTP socket.
func Supported() bool {
	fd, err := socket(unix.AF_INET)
	if err != nil {
		return false
	}
	_ = unix.Close(fd)
	return true
}

// Listen listens on addr (its address may be unspecified, its port 0 is
// not resolved). control, when not nil, runs on the descriptor before
// bind, as net.ListenConfig's Control does. An IPv6 listener is
// IPv6-only.
func Listen(addr netip.AddrPort, control func(fd int) error) (net.Listener, error) {
	fam := family(addr.Addr())
	fd, err := socket(fam)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "sctp-listener")
	defer f.Close() // FileListener dups the descriptor
	if fam == unix.AF_INET6 {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1); err != nil {
			return nil, fmt.Errorf("sctp IPV6_V6ONLY: %w", err)
		}
	}
	if control != nil {
		if err := control(fd); err != nil {
			return nil, err
		}
	}
	if err := unix.Bind(fd, sockaddr(fam, addr)); err != nil {
		return nil, fmt.Errorf("sctp bind %s: %w", addr, err)
	}
	if err := unix.Listen(fd, unix.SOMAXCONN); err != nil {
		return nil, fmt.Errorf("sctp listen %s: %w", addr, err)
	}
	return net.FileListener(f)
}

// Dial connects to dst, from src when src is valid (its port may be 0),
// giving up after timeout. The connect is non-blocking and waited for by
// the runtime's poller, so a slow endpoint holds no thread. The
// connection lives in the network namespace of the calling thread.
func Dial(src, dst netip.AddrPort, timeout time.Duration) (net.Conn, error) {
	fam := family(dst.Addr())
	fd, err := unix.Socket(fam, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.IPPROTO_SCTP)
	if errors.Is(err, unix.EPROTONOSUPPORT) || errors.Is(err, unix.ESOCKTNOSUPPORT) {
		return nil, fmt.Errorf("%w: %w", ErrUnsupported, err)
	}
	if err != nil {
		return nil, fmt.Errorf("sctp socket: %w", err)
	}
	if src.Addr().IsValid() || src.Port() != 0 {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
			_ = unix.Close(fd)
			return nil, fmt.Errorf("sctp SO_REUSEADDR: %w", err)
		}
		if err := unix.Bind(fd, sockaddr(fam, src)); err != nil {
			_ = unix.Close(fd)
			return nil, fmt.Errorf("sctp bind %s: %w", src, err)
		}
	}
	opErr := func(err error) error {
		return &net.OpError{Op: "dial", Net: "sctp", Err: os.NewSyscallError("connect", err)}
	}
	for {
		err = unix.Connect(fd, sockaddr(fam, dst))
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil && !errors.Is(err, unix.EINPROGRESS) {
		_ = unix.Close(fd)
		return nil, opErr(err)
	}
	f := os.NewFile(uintptr(fd), "sctp-conn") // non-blocking: the poller waits on it
	defer f.Close()                           // FileConn dups the descriptor
	if err := f.SetWriteDeadline(time.Now().Add(timeout)); err != nil {
		return nil, err
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	var connErr error
	werr := rc.Write(func(fd uintptr) bool {
		// Writable means the handshake ended; until then, wait.
		soErr, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ERROR)
		if err != nil {
			connErr = err
			return true
		}
		if soErr != 0 {
			connErr = unix.Errno(soErr)
			return true
		}
		if _, err := unix.Getpeername(int(fd)); errors.Is(err, unix.ENOTCONN) {
			return false
		}
		return true
	})
	switch {
	case werr != nil:
		return nil, opErr(werr)
	case connErr != nil:
		return nil, opErr(connErr)
	}
	_ = f.SetWriteDeadline(time.Time{})
	return net.FileConn(f)
}

func socket(fam int) (int, error) {
	fd, err := unix.Socket(fam, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP)
	if errors.Is(err, unix.EPROTONOSUPPORT) || errors.Is(err, unix.ESOCKTNOSUPPORT) {
		return -1, fmt.Errorf("%w: %w", ErrUnsupported, err)
	}
	if err != nil {
		return -1, fmt.Errorf("sctp socket: %w", err)
	}
	return fd, nil
}

func family(a netip.Addr) int {
	if a.Is6() && !a.Is4In6() {
		return unix.AF_INET6
	}
	return unix.AF_INET
}

func sockaddr(fam int, ap netip.AddrPort) unix.Sockaddr {
	if fam == unix.AF_INET6 {
		sa := &unix.SockaddrInet6{Port: int(ap.Port())}
		if ap.Addr().IsValid() {
			sa.Addr = ap.Addr().As16()
		}
		return sa
	}
	sa := &unix.SockaddrInet4{Port: int(ap.Port())}
	if ap.Addr().IsValid() {
		sa.Addr = ap.Addr().Unmap().As4()
	}
	return sa
}
