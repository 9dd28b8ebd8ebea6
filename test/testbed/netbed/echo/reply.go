// Package echo is the testbed's echo protocol: a server that answers every
// request with the name of the pod it runs in and the source address it saw,
// and a bounded client that sends one request and classifies the outcome.
//
// The wire format is one text line, "pod=<name> src=<ip>:<port>\n" (IPv6
// addresses in brackets, as net.JoinHostPort writes them). Over HTTP the same
// line is the response body.
package echo

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// Reply is what the server answered: who answered and whom it saw.
type Reply struct {
	Pod    string         // the server's --name
	Source netip.AddrPort // the peer address the server saw
}

// String renders the reply in wire format, without the trailing newline.
func (r Reply) String() string {
	return fmt.Sprintf("pod=%s src=%s", r.Pod, r.Source)
}

// FormatReply renders a reply line for the given pod and peer address.
// IPv4-mapped IPv6 peers are shown as plain IPv4.
func FormatReply(pod string, peer net.Addr) string {
	return Reply{Pod: pod, Source: addrPortOf(peer)}.String() + "\n"
}

// ParseReply parses one reply line ("pod=... src=..."); surrounding space is ignored.
func ParseReply(line string) (Reply, error) {
	var r Reply
	fields := strings.Fields(strings.TrimSpace(line))
	if len(fields) != 2 || !strings.HasPrefix(fields[0], "pod=") || !strings.HasPrefix(fields[1], "src=") {
		return r, fmt.Errorf("echo: malformed reply %q", line)
	}
	src, err := netip.ParseAddrPort(strings.TrimPrefix(fields[1], "src="))
	if err != nil {
		return r, fmt.Errorf("echo: malformed source in reply %q: %w", line, err)
	}
	r.Pod = strings.TrimPrefix(fields[0], "pod=")
	r.Source = src
	return r, nil
}

// addrPortOf extracts an unmapped address and port from a TCP, UDP or
// generic net.Addr; the zero value when it cannot.
func addrPortOf(a net.Addr) netip.AddrPort {
	var ap netip.AddrPort
	switch v := a.(type) {
	case *net.TCPAddr:
		ap = v.AddrPort()
	case *net.UDPAddr:
		ap = v.AddrPort()
	default:
		if a != nil {
			ap, _ = netip.ParseAddrPort(a.String())
		}
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}
