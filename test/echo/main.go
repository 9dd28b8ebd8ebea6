// Command kproxy-echo is the testbed's echo server and client.
//
//	kproxy-echo serve --name pod-a --tcp 8080,80 --udp 8080 --sctp 8080
//	kproxy-echo send --proto http --dst 198.18.128.10:80 [--src :40000] [--count 10] [--timeout 2s]
//
// The server answers every request with "pod=<name> src=<ip>:<port>", the
// source it saw. The client prints one line per request: the reply, or
// "error=<kind> ..." (refused, reset, timeout, unreachable, unsupported,
// other). Its exit status is 0 when every request got a reply, 1 otherwise.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/kproxy/kproxy/test/testbed/netbed/echo"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:])
	case "send":
		err = send(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kproxy-echo:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: kproxy-echo serve|send [flags] (-h for flags)")
	os.Exit(2)
}

func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	name := fs.String("name", hostname(), "pod name put in every reply")
	tcp := fs.String("tcp", "8080", "comma-separated TCP ports (HTTP or raw lines)")
	udp := fs.String("udp", "8080", "comma-separated UDP ports")
	sctp := fs.String("sctp", "8080", "comma-separated SCTP ports (skipped when the kernel lacks SCTP)")
	_ = fs.Parse(args)
	cfg := echo.ServerConfig{Name: *name, Logger: log.New(os.Stderr, "", log.LstdFlags)}
	var err error
	if cfg.TCPPorts, err = ports(*tcp); err != nil {
		return err
	}
	if cfg.UDPPorts, err = ports(*udp); err != nil {
		return err
	}
	if cfg.SCTPPorts, err = ports(*sctp); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	cfg.Logger.Printf("serving name=%s tcp=%v udp=%v sctp=%v", cfg.Name, cfg.TCPPorts, cfg.UDPPorts, cfg.SCTPPorts)
	return echo.Serve(ctx, cfg)
}

func send(args []string) error {
	fs := flag.NewFlagSet("send", flag.ExitOnError)
	proto := fs.String("proto", echo.ProtoHTTP, "http, tcp, udp or sctp")
	dst := fs.String("dst", "", "destination ip:port (IPv6 in brackets)")
	src := fs.String("src", "", "optional source ip:port, [::]:port or :port (port 0: random)")
	count := fs.Int("count", 1, "number of requests (at most 10000)")
	timeout := fs.Duration("timeout", echo.DefaultTimeout, "timeout per request")
	_ = fs.Parse(args)
	req := echo.Request{Proto: *proto, Timeout: *timeout}
	var err error
	if req.Dst, err = netip.ParseAddrPort(*dst); err != nil {
		return fmt.Errorf("--dst: %w", err)
	}
	if req.Src, err = parseSrc(*src); err != nil {
		return fmt.Errorf("--src: %w", err)
	}
	if *count < 1 || *count > 10000 {
		return fmt.Errorf("--count must be in 1..10000")
	}
	failed := 0
	for range *count {
		res := echo.Send(context.Background(), req)
		fmt.Println(res)
		if !res.OK() {
			failed++
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d requests failed", failed, *count)
	}
	return nil
}

func parseSrc(s string) (netip.AddrPort, error) {
	if s == "" {
		return netip.AddrPort{}, nil
	}
	if p, ok := strings.CutPrefix(s, ":"); ok {
		n, err := strconv.ParseUint(p, 10, 16)
		return netip.AddrPortFrom(netip.Addr{}, uint16(n)), err
	}
	return netip.ParseAddrPort(s)
}

func ports(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		p, err := strconv.Atoi(f)
		if err != nil || p < 1 || p > 65535 {
			return nil, fmt.Errorf("bad port %q", f)
		}
		out = append(out, p)
	}
	return out, nil
}

func hostname() string {
	h, _ := os.Hostname()
	return h
}
