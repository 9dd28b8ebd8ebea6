package echo

import (
	"net"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kproxy/kproxy/internal/sctp"
)

// ErrSCTPUnsupported is returned when the kernel has no SCTP (no sctp module).
var ErrSCTPUnsupported = sctp.ErrUnsupported

// listenSCTP opens one listener per family on port: an IPv4 one and an
// IPv6-only one.
func listenSCTP(port int) ([]net.Listener, error) {
	var out []net.Listener
	for _, all := range []netip.Addr{netip.IPv4Unspecified(), netip.IPv6Unspecified()} {
		ln, err := sctp.Listen(netip.AddrPortFrom(all, uint16(port)), func(fd int) error {
			return unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
		})
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

// dialSCTP connects a one-to-one SCTP association to dst, from src when
// src is valid (its port may be 0), giving up after timeout. It must run
// on the thread whose network namespace the socket should live in.
func dialSCTP(src, dst netip.AddrPort, timeout time.Duration) (net.Conn, error) {
	return sctp.Dial(src, dst, timeout)
}
