// Command kproxy-demo runs kproxy for real in a throwaway sandbox: one node
// namespace, three echo pods and a client, all built by netbed. kproxy reads
// its Services from a file (--source-file, no API server), the demo sends
// bounded traffic to a ClusterIP and a NodePort, prints which pods answered
// and the programmed ruleset, and removes everything it made, also on
// failure or ^C. Run it through `sudo make demo` (test/demo/demo.sh).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/kproxy/kproxy/test/testbed/netbed"
	"github.com/kproxy/kproxy/test/testbed/netbed/echo"
)

// The sandbox plan; examples/demo.yaml holds the matching objects.
const (
	nodeName = "demo-node"
	nodePort = 30080
)

var (
	clusterIP4 = netip.MustParseAddr("198.18.128.10")
	clusterIP6 = netip.MustParseAddr("fd00:0:0:ffff::10")
	podNames   = []string{"pod-a", "pod-b", "pod-c"}
)

type options struct {
	kproxy, echo, source, prefix, mode string
	requests                           int
	keepLogs                           bool
}

func main() {
	var o options
	flag.StringVar(&o.kproxy, "kproxy", "bin/kproxy", "kproxy binary")
	flag.StringVar(&o.echo, "echo", "bin/kproxy-echo", "echo server binary")
	flag.StringVar(&o.source, "source", "examples/demo.yaml", "objects for --source-file")
	flag.StringVar(&o.prefix, "prefix", fmt.Sprintf("kptd%d-", os.Getpid()), "name prefix of the sandbox")
	flag.StringVar(&o.mode, "proxy-mode", "nftables", "kproxy --proxy-mode")
	flag.IntVar(&o.requests, "requests", 30, "requests per target (at most 1000)")
	flag.BoolVar(&o.keepLogs, "keep-logs", false, "keep the process logs")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "demo: FAILED:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	if os.Geteuid() != 0 {
		return errors.New("needs root (sudo make demo)")
	}
	o.requests = min(max(o.requests, 1), 1000)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	bed := netbed.New(netbed.Options{Prefix: o.prefix, Layout: sandboxLayout(), EchoBinary: o.echo,
		Logf: func(f string, a ...any) { fmt.Printf("  "+f+"\n", a...) }})
	failed := true
	defer func() {
		fmt.Println("== cleaning up", bed.Prefix()+"*")
		if failed {
			bed.DumpLogs(func(f string, a ...any) { fmt.Printf(f+"\n", a...) })
		}
		if err := bed.Teardown(); err != nil {
			fmt.Fprintln(os.Stderr, "demo: teardown:", err)
		}
		if !o.keepLogs {
			_ = bed.RemoveLogs()
		}
	}()
	if err := demo(ctx, bed, o); err != nil {
		return err
	}
	failed = false
	return nil
}

// debugAddr is kproxy's debug endpoint in the node (kproxy inspect).
const debugAddr = "127.0.0.1:10259"

func sandboxLayout() netbed.Layout {
	l := netbed.DefaultLayout()
	l.Nodes = l.Nodes[:1]
	l.Nodes[0].Name = nodeName
	return l
}

func demo(ctx context.Context, bed *netbed.Bed, o options) error {
	fmt.Println("== building the sandbox: 1 node, 3 pods, 1 client (network namespaces)")
	if err := bed.Up(ctx); err != nil {
		return err
	}
	var pods []*netbed.Pod
	for _, name := range podNames {
		p, err := bed.AddPod(ctx, nodeName, name, netbed.PodPorts{TCP: []int{8080}, UDP: []int{8080}})
		if err != nil {
			return err
		}
		pods = append(pods, p)
		fmt.Printf("  pod %s: %s, %s\n", name, p.IP4, p.IP6)
	}
	node := bed.Node(nodeName)
	kp, err := startKproxy(node, o)
	if err != nil {
		return err
	}
	fmt.Println("== waiting for kproxy to program the ClusterIP")
	if err := waitReady(ctx, node.Netns, kp); err != nil {
		return err
	}
	if err := sendAll(ctx, bed, pods[0], o.requests); err != nil {
		return err
	}
	printRules(ctx, node, o, pods[0])
	if !kp.Running() {
		return fmt.Errorf("kproxy exited: %v", kp.ExitErr())
	}
	return kp.Stop()
}

func startKproxy(node *netbed.Node, o options) (*netbed.Process, error) {
	bin, err := filepath.Abs(o.kproxy)
	if err != nil {
		return nil, err
	}
	src, err := filepath.Abs(o.source)
	if err != nil {
		return nil, err
	}
	args := []string{bin, "--source-file", src, "--proxy-mode", o.mode,
		"--hostname-override", nodeName,
		"--cluster-cidr", netbed.ClusterCIDR4.String() + "," + netbed.ClusterCIDR6.String(),
		"--healthz-bind-address", netip.AddrPortFrom(node.Spec.IP4, 10256).String(),
		"--metrics-bind-address", "127.0.0.1:10249", "--debug-bind-address", debugAddr,
		"--conntrack-max-per-core", "0", "--v", "2"}
	fmt.Printf("== starting kproxy in %s:\n  %s\n", node.Name, strings.Join(args, " "))
	return node.Start("kproxy", args...)
}

// waitReady polls the ClusterIP from the node until it answers (at most 30 s).
func waitReady(ctx context.Context, from *netbed.Netns, kp *netbed.Process) error {
	req := echo.Request{Proto: echo.ProtoTCP, Dst: netip.AddrPortFrom(clusterIP4, 80), Timeout: time.Second}
	var last echo.Result
	for range 60 {
		if last = from.Send(ctx, req); last.OK() {
			return nil
		}
		if !kp.Running() {
			return fmt.Errorf("kproxy exited: %v", kp.ExitErr())
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		time.Sleep(500 * time.Millisecond)
	}
	return fmt.Errorf("the ClusterIP does not answer: %s", last)
}

// sendAll sends bounded traffic to the ClusterIP (from the node and from a
// pod) and to the NodePort (from the client), in both families, and prints
// which pods answered.
func sendAll(ctx context.Context, bed *netbed.Bed, pod *netbed.Pod, n int) error {
	node := bed.Node(nodeName)
	type target struct {
		from  *netbed.Netns
		label string
		dst   netip.AddrPort
		proto string
	}
	targets := []target{
		{node.Netns, "node   -> ClusterIP", netip.AddrPortFrom(clusterIP4, 80), echo.ProtoHTTP},
		{node.Netns, "node   -> ClusterIP", netip.AddrPortFrom(clusterIP6, 80), echo.ProtoHTTP},
		{pod.Netns, pod.PodName + "  -> ClusterIP", netip.AddrPortFrom(clusterIP4, 80), echo.ProtoUDP},
		{bed.Client(), "client -> NodePort ", netip.AddrPortFrom(node.Spec.IP4, nodePort), echo.ProtoTCP},
		{bed.Client(), "client -> NodePort ", netip.AddrPortFrom(node.Spec.IP6, nodePort), echo.ProtoTCP},
	}
	fmt.Printf("== sending %d requests per line (each a new connection)\n", n)
	var errs []error
	for _, tg := range targets {
		counts, fails, first := map[string]int{}, 0, ""
		for _, r := range tg.from.SendN(ctx, echo.Request{Proto: tg.proto, Dst: tg.dst}, n) {
			if r.OK() {
				counts[r.Reply.Pod]++
			} else if fails++; first == "" {
				first = r.String()
			}
		}
		fmt.Printf("  %s %-26s %-5s %s\n", tg.label, tg.dst, tg.proto, histogram(counts, fails))
		if fails > 0 || len(counts) < len(podNames) {
			errs = append(errs, fmt.Errorf("%s %s: %d failures (%s), %d of %d pods answered", tg.label, tg.dst, fails, first, len(counts), len(podNames)))
		}
	}
	return errors.Join(errs...)
}

func histogram(counts map[string]int, fails int) string {
	var b strings.Builder
	for _, p := range podNames {
		fmt.Fprintf(&b, "%s=%-3d ", p, counts[p])
	}
	if fails > 0 {
		fmt.Fprintf(&b, "failed=%d", fails)
	}
	return b.String()
}

// printRules writes the ruleset kproxy programmed to a file, prints what
// it holds in one line, then what kproxy itself says about it: `kproxy
// inspect` (Services, frontends, endpoints, the kernel objects of each)
// and `kproxy explain --verify` for the pod's request to the ClusterIP.
func printRules(ctx context.Context, node *netbed.Node, o options, pod *netbed.Pod) {
	fmt.Printf("== ruleset programmed in %s (%s)\n", node.Name, o.mode)
	var out string
	var err error
	if o.mode == "iptables" {
		out, err = node.IptablesSave(ctx, false)
	} else {
		out, err = node.Run(ctx, "nft", "list", "ruleset")
	}
	if err != nil {
		fmt.Println("  cannot list:", err)
		return
	}
	file, err := filepath.Abs(filepath.Join(filepath.Dir(o.kproxy), "demo-ruleset-"+o.mode+".txt"))
	if err == nil {
		err = os.WriteFile(file, []byte(out), 0o644)
	}
	if err != nil {
		fmt.Println("  cannot write the listing:", err)
	}
	fmt.Printf("  %s; the full listing is in %s\n", countRules(out, o.mode), file)
	bin, _ := filepath.Abs(o.kproxy)
	fmt.Printf("== kproxy inspect (its debug endpoint, %s)\n", debugAddr)
	if out, err := node.Run(ctx, bin, "inspect", "--address", debugAddr); err != nil {
		fmt.Println("  ", err)
	} else {
		fmt.Print(indent(out))
	}
	src, _ := filepath.Abs(o.source)
	args := []string{bin, "explain", "--source-file", src, "--proxy-mode", o.mode, "--hostname-override", nodeName,
		"--cluster-cidr", netbed.ClusterCIDR4.String() + "," + netbed.ClusterCIDR6.String(),
		"--from", pod.IP4.String(), "--to", netip.AddrPortFrom(clusterIP4, 80).String() + "/udp", "--verify"}
	fmt.Printf("== kproxy explain --verify: %s -> %s/udp, traced through kproxy's rules and the kernel's\n", pod.PodName, netip.AddrPortFrom(clusterIP4, 80))
	out, err = node.Run(ctx, args...)
	fmt.Print(indent(out))
	if err != nil {
		fmt.Println("  ", err)
	}
}

// countRules sums up a listing: tables, chains, rules, and sets or maps
// with and without elements (nft), or chains and rules (iptables-save).
func countRules(listing, mode string) string {
	var tables, chains, rules, sets, empty int
	inSet, hasElems := false, false
	for _, line := range strings.Split(listing, "\n") {
		t := strings.TrimSpace(line)
		switch {
		case mode == "iptables" && strings.HasPrefix(t, "*"):
			tables++
		case mode == "iptables" && strings.HasPrefix(t, ":"):
			chains++
		case mode == "iptables" && strings.HasPrefix(t, "-A "):
			rules++
		case mode == "iptables":
		case strings.HasPrefix(t, "table "):
			tables++
		case strings.HasPrefix(t, "chain "):
			chains++
		case strings.HasPrefix(t, "set ") || strings.HasPrefix(t, "map "):
			sets++
			inSet, hasElems = true, false
		case inSet && strings.HasPrefix(t, "elements = "):
			hasElems = true
		case inSet && t == "}":
			if !hasElems {
				empty++
			}
			inSet = false
		case t != "" && t != "}" && !strings.HasPrefix(t, "type ") && !strings.HasPrefix(t, "comment ") &&
			!strings.HasPrefix(t, "policy ") && !strings.HasSuffix(t, "{"):
			if !inSet {
				rules++
			}
		}
	}
	if mode == "iptables" {
		return fmt.Sprintf("%d tables, %d chains, %d rules", tables, chains, rules)
	}
	return fmt.Sprintf("%d tables, %d chains, %d rules, %d sets and maps (%d of them empty)", tables, chains, rules, sets, empty)
}

func indent(s string) string {
	var b strings.Builder
	for _, line := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		b.WriteString("  " + line + "\n")
	}
	return b.String()
}
