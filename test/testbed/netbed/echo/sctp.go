package echo

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// ErrSCTPUnsupported is returned when the kernel has no SCTP (no sctp module).
var ErrSCTPUnsupported = errors.New("echo: kernel does not support SCTP")

// SCTP sockets are one-to-one style (SOCK_STREAM + IPPROTO_SCTP). The Go
// runtime treats such a descriptor like a TCP one (accept, read, write,
// deadlines), which is all the echo protocol needs.

// listenSCTP opens one listener per family: an IPv4 one and an IPv6-only one.
func listenSCTP(port int) ([]net.Listener, error) {
	var out []net.Listener
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		ln, err := listenSCTPFamily(fam, port)
		if err != nil {
			for _, l := range out {
				_ = l.Close()
			}
			return nil, err
		}
		out = append(out, ln)
	}
	return out, nil
}

func listenSCTPFamily(fam, port int) (net.Listener, error) {
	fd, err := sctpSocket(fam)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "sctp-listener")
	defer f.Close() // FileListener dups the descriptor
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
		return nil, fmt.Errorf("sctp SO_REUSEADDR: %w", err)
	}
	var sa unix.Sockaddr = &unix.SockaddrInet4{Port: port}
	if fam == unix.AF_INET6 {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1); err != nil {
			return nil, fmt.Errorf("sctp IPV6_V6ONLY: %w", err)
		}
		sa = &unix.SockaddrInet6{Port: port}
	}
	if err := unix.Bind(fd, sa); err != nil {
		return nil, fmt.Errorf("sctp bind: %w", err)
	}
	if err := unix.Listen(fd, 128); err != nil {
		return nil, fmt.Errorf("sctp listen: %w", err)
	}
	return net.FileListener(f)
}

func sctpSocket(fam int) (int, error) {
	fd, err := unix.Socket(fam, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP)
	if errors.Is(err, unix.EPROTONOSUPPORT) || errors.Is(err, unix.ESOCKTNOSUPPORT) {
		return -1, fmt.Errorf("%w: %w", ErrSCTPUnsupported, err)
	}
	if err != nil {
		return -1, fmt.Errorf("sctp socket: %w", err)
	}
	return fd, nil
}

// dialSCTP connects a one-to-one SCTP socket to dst, from src when src is
// valid (its port may be 0), giving up after timeout. It must run on the
// thread whose network namespace the socket should live in.
func dialSCTP(src, dst netip.AddrPort, timeout time.Duration) (net.Conn, error) {
	fam := unix.AF_INET
	if dst.Addr().Is6() {
		fam = unix.AF_INET6
	}
	fd, err := sctpSocket(fam)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "sctp-conn")
	defer f.Close() // FileConn dups the descriptor
	tv := unix.NsecToTimeval(timeout.Nanoseconds())
	// A blocking connect honours the send timeout, which bounds the handshake.
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv); err != nil {
		return nil, fmt.Errorf("sctp SO_SNDTIMEO: %w", err)
	}
	if src.Addr().IsValid() || src.Port() != 0 {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
			return nil, fmt.Errorf("sctp SO_REUSEADDR: %w", err)
		}
		if err := unix.Bind(fd, sockaddr(fam, src)); err != nil {
			return nil, fmt.Errorf("sctp bind %s: %w", src, err)
		}
	}
	if err := unix.Connect(fd, sockaddr(fam, dst)); err != nil {
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINPROGRESS) {
			err = os.ErrDeadlineExceeded
		}
		return nil, &net.OpError{Op: "dial", Net: "sctp", Err: os.NewSyscallError("connect", err)}
	}
	return net.FileConn(f)
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
