package echo

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"
)

func TestReplyRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		peer net.Addr
		want string
	}{
		{&net.TCPAddr{IP: net.ParseIP("198.18.1.10"), Port: 4000}, "pod=p src=198.18.1.10:4000\n"},
		{&net.UDPAddr{IP: net.ParseIP("::ffff:198.18.1.10"), Port: 53}, "pod=p src=198.18.1.10:53\n"},
		{&net.TCPAddr{IP: net.ParseIP("fd00::1"), Port: 80}, "pod=p src=[fd00::1]:80\n"},
	} {
		got := FormatReply("p", tc.peer)
		if got != tc.want {
			t.Errorf("FormatReply(%v) = %q, want %q", tc.peer, got, tc.want)
		}
		r, err := ParseReply(got)
		if err != nil || r.Pod != "p" || r.String()+"\n" != got {
			t.Errorf("ParseReply(%q) = %+v, %v", got, r, err)
		}
	}
	for _, bad := range []string{"", "pod=x", "src=1.2.3.4:5 pod=x", "pod=x src=nope"} {
		if _, err := ParseReply(bad); err == nil {
			t.Errorf("ParseReply(%q) succeeded", bad)
		}
	}
}

func TestClassify(t *testing.T) {
	op := func(err error) error { return &net.OpError{Op: "dial", Err: os.NewSyscallError("connect", err)} }
	for _, tc := range []struct {
		err  error
		want ErrKind
	}{
		{nil, KindNone},
		{op(syscall.ECONNREFUSED), KindRefused},
		{op(syscall.ECONNRESET), KindReset},
		{op(syscall.EHOSTUNREACH), KindUnreachable},
		{op(syscall.ENETUNREACH), KindUnreachable},
		{op(os.ErrDeadlineExceeded), KindTimeout},
		{fmt.Errorf("x: %w", ErrSCTPUnsupported), KindUnsupported},
		{errors.New("boom"), KindOther},
	} {
		if got := Classify(tc.err); got != tc.want {
			t.Errorf("Classify(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}

// TestServeAndSend runs the server on loopback (no privileges needed).
func TestServeAndSend(t *testing.T) {
	port := freePort(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Serve(ctx, ServerConfig{Name: "me", TCPPorts: []int{port}, UDPPorts: []int{port}, SCTPPorts: []int{port}})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	dst4 := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(port))
	dst6 := netip.AddrPortFrom(netip.MustParseAddr("::1"), uint16(port))
	waitUp(t, dst4)
	for _, proto := range []string{ProtoHTTP, ProtoTCP, ProtoUDP} {
		for _, dst := range []netip.AddrPort{dst4, dst6} {
			res := Send(ctx, Request{Proto: proto, Dst: dst, Timeout: time.Second})
			if !res.OK() || res.Reply.Pod != "me" || res.Reply.Source.Addr() != dst.Addr() {
				t.Errorf("%s to %s: %s", proto, dst, res)
			}
		}
	}
	src := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(freePort(t)))
	if res := Send(ctx, Request{Proto: ProtoTCP, Dst: dst4, Src: src}); res.Reply.Source != src {
		t.Errorf("fixed source %s: %s", src, res)
	}
	closed := netip.AddrPortFrom(dst4.Addr(), uint16(freePort(t)))
	for _, proto := range []string{ProtoTCP, ProtoUDP} {
		if res := Send(ctx, Request{Proto: proto, Dst: closed, Timeout: time.Second}); res.Kind != KindRefused {
			t.Errorf("%s to closed port: %s, want refused", proto, res)
		}
	}
	if res := Send(ctx, Request{Proto: ProtoSCTP, Dst: dst4, Timeout: time.Second}); !res.OK() && res.Kind != KindUnsupported {
		t.Errorf("sctp: %s", res)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func waitUp(t *testing.T, dst netip.AddrPort) {
	t.Helper()
	for range 100 {
		if Send(context.Background(), Request{Proto: ProtoTCP, Dst: dst, Timeout: 100 * time.Millisecond}).OK() {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("server on %s did not come up", dst)
}
