package echo

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"strings"
	"sync"
	"time"
)

// ServerConfig says what one echo server listens on. Every listener binds the
// wildcard address of both families.
type ServerConfig struct {
	Name      string // the pod name put in every reply
	TCPPorts  []int  // TCP: HTTP/1.x requests or raw lines, detected per connection
	UDPPorts  []int  // UDP: every datagram is answered with one reply datagram
	SCTPPorts []int  // SCTP (one-to-one style): every message is answered
	// Logger receives one line per problem; nil discards.
	Logger *log.Logger
}

// idleTimeout bounds how long a quiet connection is kept.
const idleTimeout = 30 * time.Second

// Serve listens on every configured port and answers until ctx is done. It
// returns an error only when a listener cannot be opened; SCTP listeners that
// the kernel does not support are reported to the logger and skipped.
func Serve(ctx context.Context, cfg ServerConfig) error {
	logf := func(format string, args ...any) {
		if cfg.Logger != nil {
			cfg.Logger.Printf(format, args...)
		}
	}
	var closers []io.Closer
	var wg sync.WaitGroup
	closeAll := func() {
		for _, c := range closers {
			_ = c.Close()
		}
	}
	for _, p := range cfg.TCPPorts {
		ln, err := net.Listen("tcp", fmt.Sprintf(":%d", p))
		if err != nil {
			closeAll()
			return fmt.Errorf("echo: tcp port %d: %w", p, err)
		}
		closers = append(closers, ln)
		wg.Go(func() { acceptLoop(ln, func(c net.Conn) { serveTCP(c, cfg.Name) }, logf) })
	}
	for _, p := range cfg.UDPPorts {
		pc, err := net.ListenPacket("udp", fmt.Sprintf(":%d", p))
		if err != nil {
			closeAll()
			return fmt.Errorf("echo: udp port %d: %w", p, err)
		}
		closers = append(closers, pc)
		wg.Go(func() { serveUDP(pc, cfg.Name, logf) })
	}
	for _, p := range cfg.SCTPPorts {
		lns, err := listenSCTP(p)
		if errors.Is(err, ErrSCTPUnsupported) {
			logf("echo: sctp port %d skipped: %v", p, err)
			continue
		}
		if err != nil {
			closeAll()
			return fmt.Errorf("echo: sctp port %d: %w", p, err)
		}
		for _, ln := range lns {
			closers = append(closers, ln)
			wg.Go(func() { acceptLoop(ln, func(c net.Conn) { serveLines(c, bufio.NewReader(c), cfg.Name) }, logf) })
		}
	}
	<-ctx.Done()
	closeAll()
	wg.Wait()
	return nil
}

func acceptLoop(ln net.Listener, handle func(net.Conn), logf func(string, ...any)) {
	for {
		c, err := ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			logf("echo: accept on %s: %v", ln.Addr(), err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		go func() {
			defer c.Close()
			handle(c)
		}()
	}
}

// serveTCP answers an HTTP request (when the first line looks like one) or
// raw lines until the peer closes.
func serveTCP(c net.Conn, name string) {
	_ = c.SetDeadline(time.Now().Add(idleTimeout))
	r := bufio.NewReader(c)
	first, err := r.ReadString('\n')
	if err != nil && first == "" {
		return
	}
	if isHTTPRequestLine(first) {
		serveHTTP(c, r, name)
		return
	}
	if _, err := io.WriteString(c, FormatReply(name, c.RemoteAddr())); err != nil {
		return
	}
	serveLines(c, r, name)
}

func isHTTPRequestLine(line string) bool {
	f := strings.Fields(line)
	return len(f) == 3 && strings.HasPrefix(f[2], "HTTP/1.")
}

// serveHTTP skips the request headers and answers with the reply line as the
// body, closing the connection afterwards.
func serveHTTP(c net.Conn, r *bufio.Reader, name string) {
	for {
		h, err := r.ReadString('\n')
		if err != nil || strings.TrimSpace(h) == "" {
			break
		}
	}
	body := FormatReply(name, c.RemoteAddr())
	fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
}

// serveLines answers every line (or message) read from r until EOF.
func serveLines(c net.Conn, r *bufio.Reader, name string) {
	reply := FormatReply(name, c.RemoteAddr())
	for {
		_ = c.SetDeadline(time.Now().Add(idleTimeout))
		if _, err := r.ReadString('\n'); err != nil {
			return
		}
		if _, err := io.WriteString(c, reply); err != nil {
			return
		}
	}
}

func serveUDP(pc net.PacketConn, name string, logf func(string, ...any)) {
	buf := make([]byte, 2048)
	for {
		_, peer, err := pc.ReadFrom(buf)
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			logf("echo: udp read on %s: %v", pc.LocalAddr(), err)
			continue
		}
		if _, err := pc.WriteTo([]byte(FormatReply(name, peer)), peer); err != nil {
			logf("echo: udp reply to %s: %v", peer, err)
		}
	}
}
