package echo

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"time"
)

// Protocols the client speaks.
const (
	ProtoHTTP = "http" // HTTP/1.1 GET over TCP
	ProtoTCP  = "tcp"  // one raw line over TCP
	ProtoUDP  = "udp"  // one datagram
	ProtoSCTP = "sctp" // one message over a one-to-one SCTP association
)

// DefaultTimeout bounds a request whose Timeout is zero.
const DefaultTimeout = 2 * time.Second

// Request is one bounded request.
type Request struct {
	Proto string         // ProtoHTTP, ProtoTCP, ProtoUDP or ProtoSCTP
	Dst   netip.AddrPort // where to send
	// Src optionally fixes the source: a valid address binds it, a non-zero
	// port binds that port (SO_REUSEADDR is set). Zero means kernel's choice.
	Src     netip.AddrPort
	Timeout time.Duration // whole request (connect, send, receive); 0 means DefaultTimeout
}

// ErrKind classifies why a request got no reply.
type ErrKind string

// Error kinds. KindNone means a reply arrived.
const (
	KindNone        ErrKind = ""
	KindRefused     ErrKind = "refused"     // TCP RST to the SYN, or ICMP port unreachable
	KindReset       ErrKind = "reset"       // connection reset after it was established
	KindTimeout     ErrKind = "timeout"     // nothing came back in time (dropped)
	KindUnreachable ErrKind = "unreachable" // ICMP host/net unreachable or prohibited, or no route
	KindUnsupported ErrKind = "unsupported" // the kernel lacks the protocol (SCTP)
	KindOther       ErrKind = "other"       // anything else, see Err
)

// Result is the outcome of one request.
type Result struct {
	Reply   Reply         // valid when Kind is KindNone
	Kind    ErrKind       // why it failed; KindNone on success
	Err     error         // the underlying error; nil on success
	Elapsed time.Duration // wall time spent
}

// OK reports whether a reply arrived.
func (r Result) OK() bool { return r.Kind == KindNone }

func (r Result) String() string {
	if r.OK() {
		return r.Reply.String()
	}
	return fmt.Sprintf("error=%s (%v) after %s", r.Kind, r.Err, r.Elapsed.Round(time.Millisecond))
}

// Send performs one request and waits for its reply. Every socket is created
// on the calling goroutine's thread, so a caller that has switched its thread
// into a network namespace sends from that namespace. Send starts no goroutines.
func Send(ctx context.Context, req Request) Result {
	start := time.Now()
	timeout := req.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	deadline := start.Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	line, err := exchange(req, deadline)
	res := Result{Elapsed: time.Since(start)}
	if err == nil {
		res.Reply, err = ParseReply(line)
	}
	if err != nil {
		res.Err = err
		res.Kind = Classify(err)
	}
	return res
}

func exchange(req Request, deadline time.Time) (string, error) {
	switch req.Proto {
	case ProtoHTTP, ProtoTCP, "":
		return exchangeTCP(req, deadline)
	case ProtoUDP:
		return exchangeUDP(req, deadline)
	case ProtoSCTP:
		conn, err := dialSCTP(req.Src, req.Dst, time.Until(deadline))
		if err != nil {
			return "", err
		}
		defer conn.Close()
		return converse(conn, deadline, "hello\n")
	default:
		return "", fmt.Errorf("echo: unknown protocol %q", req.Proto)
	}
}

func dialer(req Request, deadline time.Time, network string) *net.Dialer {
	d := &net.Dialer{Deadline: deadline}
	if req.Src.Addr().IsValid() || req.Src.Port() != 0 {
		ip := net.IP(nil)
		if req.Src.Addr().IsValid() {
			ip = req.Src.Addr().AsSlice()
		}
		port := int(req.Src.Port())
		if network == "udp" {
			d.LocalAddr = &net.UDPAddr{IP: ip, Port: port}
		} else {
			d.LocalAddr = &net.TCPAddr{IP: ip, Port: port}
		}
		d.Control = func(_, _ string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
			})
			return errors.Join(err, serr)
		}
	}
	return d
}

func exchangeTCP(req Request, deadline time.Time) (string, error) {
	conn, err := dialer(req, deadline, "tcp").Dial("tcp", req.Dst.String())
	if err != nil {
		return "", err
	}
	defer conn.Close()
	if req.Proto != ProtoHTTP {
		return converse(conn, deadline, "hello\n")
	}
	_ = conn.SetDeadline(deadline)
	if _, err := fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", req.Dst); err != nil {
		return "", err
	}
	resp, err := io.ReadAll(io.LimitReader(conn, 64<<10))
	if err != nil {
		return "", err
	}
	head, body, ok := strings.Cut(string(resp), "\r\n\r\n")
	if !ok || !strings.HasPrefix(head, "HTTP/1.1 200") {
		return "", fmt.Errorf("echo: unexpected HTTP response %q", resp)
	}
	return body, nil
}

func exchangeUDP(req Request, deadline time.Time) (string, error) {
	conn, err := dialer(req, deadline, "udp").Dial("udp", req.Dst.String())
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(deadline)
	if _, err := conn.Write([]byte("hello\n")); err != nil {
		return "", err
	}
	buf := make([]byte, 2048)
	n, err := conn.Read(buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// converse writes msg and reads one reply line.
func converse(conn net.Conn, deadline time.Time, msg string) (string, error) {
	_ = conn.SetDeadline(deadline)
	if _, err := io.WriteString(conn, msg); err != nil {
		return "", err
	}
	return bufio.NewReader(conn).ReadString('\n')
}

// Classify maps a dial/read error to an ErrKind.
func Classify(err error) ErrKind {
	var nerr net.Error
	switch {
	case err == nil:
		return KindNone
	case errors.Is(err, ErrSCTPUnsupported):
		return KindUnsupported
	case errors.Is(err, syscall.ECONNREFUSED):
		return KindRefused
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return KindReset
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH),
		errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM), errors.Is(err, syscall.EINVAL):
		return KindUnreachable
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded),
		errors.As(err, &nerr) && nerr.Timeout():
		return KindTimeout
	default:
		return KindOther
	}
}

// KeepAlive is one TCP connection to an echo server kept open across many
// exchanges, as a client with a pooled connection keeps it.
type KeepAlive struct {
	conn net.Conn
	r    *bufio.Reader
	dst  netip.AddrPort
}

// DialKeepAlive connects to dst through do, which runs its function where
// the socket must be created (a network namespace's Netns.Do). The first
// line the server answers with is read (and checked) here.
func DialKeepAlive(do func(func() error) error, dst netip.AddrPort, timeout time.Duration) (*KeepAlive, error) {
	var conn net.Conn
	err := do(func() error {
		var err error
		conn, err = net.DialTimeout("tcp", dst.String(), timeout)
		return err
	})
	if err != nil {
		return nil, err
	}
	k := &KeepAlive{conn: conn, r: bufio.NewReader(conn), dst: dst}
	if res := k.exchange(timeout); !res.OK() {
		conn.Close()
		return nil, res.Err
	}
	return k, nil
}

// Exchange sends one line on the connection and waits up to a second for
// the reply line.
func (k *KeepAlive) Exchange() Result { return k.exchange(time.Second) }

func (k *KeepAlive) exchange(timeout time.Duration) Result {
	start := time.Now()
	_ = k.conn.SetDeadline(start.Add(timeout))
	line, err := "", error(nil)
	if _, err = io.WriteString(k.conn, "hello\n"); err == nil {
		line, err = k.r.ReadString('\n')
	}
	res := Result{Elapsed: time.Since(start)}
	if err == nil {
		res.Reply, err = ParseReply(line)
	}
	if err != nil {
		res.Kind, res.Err = Classify(err), fmt.Errorf("keep-alive exchange with %s: %w", k.dst, err)
	}
	return res
}

// Close closes the connection.
func (k *KeepAlive) Close() error { return k.conn.Close() }

// Reset closes the connection with a TCP reset, so that no side keeps it
// in TIME_WAIT (IPVS forgets a reset connection in seconds, a closed one
// only after two minutes).
func (k *KeepAlive) Reset() error {
	if tc, ok := k.conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	return k.conn.Close()
}
