package netbed

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kproxy/kproxy/test/testbed/netbed/echo"
)

const (
	hubBridge = "br0"  // the node network, in the hub namespace
	podBridge = "cbr0" // each node's pod bridge
	uplink    = "eth0" // a namespace's own interface
)

// newNetns creates prefix+short with loopback up and no IPv6 DAD or RAs.
func (b *Bed) newNetns(ctx context.Context, short string) (*Netns, error) {
	n := &Netns{Name: b.prefix + short, bed: b}
	if _, err := run(ctx, "ip", "netns", "add", n.Name); err != nil {
		return nil, err
	}
	if _, err := n.IP(ctx, "link", "set", "lo", "up"); err != nil {
		return nil, err
	}
	for _, kv := range [][2]string{
		{"net.ipv6.conf.all.accept_dad", "0"}, {"net.ipv6.conf.default.accept_dad", "0"},
		{"net.ipv6.conf.all.accept_ra", "0"}, {"net.ipv6.conf.default.accept_ra", "0"},
	} {
		if err := n.Sysctl(kv[0], kv[1]); err != nil {
			return nil, err
		}
	}
	return n, nil
}

func (b *Bed) upHub(ctx context.Context) error {
	hub, err := b.newNetns(ctx, "hub")
	if err != nil {
		return err
	}
	b.Hub = hub
	if _, err := hub.IP(ctx, "link", "add", hubBridge, "type", "bridge"); err != nil {
		return err
	}
	_, err = hub.IP(ctx, "link", "set", hubBridge, "up")
	return err
}

// attach connects ns to the hub bridge with a veth named port on the hub
// side and eth0 inside ns, and gives eth0 the two addresses.
func (b *Bed) attach(ctx context.Context, ns *Netns, port string, ip4, ip6 netip.Addr) error {
	l := b.opts.Layout
	cmds := [][]string{
		{"-n", b.Hub.Name, "link", "add", port, "type", "veth", "peer", "name", uplink, "netns", ns.Name},
		{"-n", b.Hub.Name, "link", "set", port, "master", hubBridge, "up"},
		{"-n", ns.Name, "addr", "add", prefixOf(ip4, l.NodeNet4), "dev", uplink},
		{"-n", ns.Name, "addr", "add", prefixOf(ip6, l.NodeNet6), "dev", uplink, "nodad"},
		{"-n", ns.Name, "link", "set", uplink, "up"},
	}
	return runIP(ctx, cmds)
}

func (b *Bed) upHostLink(ctx context.Context) error {
	l := b.opts.Layout
	if !l.Host4.IsValid() && !l.Host6.IsValid() {
		return nil
	}
	if err := checkRootOverlap(ctx, l); err != nil {
		return err
	}
	link := b.prefix + "h"
	cmds := [][]string{
		{"link", "add", link, "type", "veth", "peer", "name", "vhost", "netns", b.Hub.Name},
		{"-n", b.Hub.Name, "link", "set", "vhost", "master", hubBridge, "up"},
	}
	if l.Host4.IsValid() {
		cmds = append(cmds, []string{"addr", "add", prefixOf(l.Host4, l.NodeNet4), "dev", link})
	}
	if l.Host6.IsValid() {
		cmds = append(cmds, []string{"addr", "add", prefixOf(l.Host6, l.NodeNet6), "dev", link, "nodad"})
	}
	cmds = append(cmds, []string{"link", "set", link, "up"})
	if err := runIP(ctx, cmds); err != nil {
		return err
	}
	if !l.Host4.IsValid() {
		return nil
	}
	// An existing route (another run's blackhole) is left alone.
	if _, err := run(ctx, "ip", "route", "add", "blackhole", l.Supernet4.String()); err == nil {
		b.mu.Lock()
		b.rootRoutes = append(b.rootRoutes, l.Supernet4.String())
		b.mu.Unlock()
	}
	return nil
}

// checkRootOverlap refuses a host link whose node network overlaps an
// address already configured in the root namespace.
func checkRootOverlap(ctx context.Context, l Layout) error {
	out, err := run(ctx, "ip", "-o", "addr", "show")
	if err != nil {
		return err
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		for i := 0; i+1 < len(f); i++ {
			if f[i] != "inet" && f[i] != "inet6" {
				continue
			}
			p, err := netip.ParsePrefix(f[i+1])
			if err != nil {
				continue
			}
			if (l.Host4.IsValid() && p.Overlaps(l.NodeNet4)) || (l.Host6.IsValid() && p.Overlaps(l.NodeNet6)) {
				return fmt.Errorf("netbed: root namespace already has %s, which overlaps the node network; refusing the host link", p)
			}
		}
	}
	return nil
}

func (b *Bed) teardownRoot() []error {
	var errs []error
	ctx := context.Background()
	b.mu.Lock()
	routes := b.rootRoutes
	b.rootRoutes = nil
	b.mu.Unlock()
	for _, r := range routes {
		if _, err := run(ctx, "ip", "route", "del", "blackhole", r); err != nil {
			errs = append(errs, err)
		}
	}
	link := b.prefix + "h"
	if _, err := os.Stat("/sys/class/net/" + link); err == nil {
		if _, err := run(ctx, "ip", "link", "del", link); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// nodeSysctls make a namespace behave like a Kubernetes node.
var nodeSysctls = [][2]string{
	{"net.ipv4.ip_forward", "1"},
	{"net.ipv6.conf.all.forwarding", "1"},
	{"net.ipv4.icmp_ratelimit", "0"},
	{"net.ipv6.icmp.ratelimit", "0"},
	{"net.bridge.bridge-nf-call-iptables", "1"},
	{"net.bridge.bridge-nf-call-ip6tables", "1"},
}

func (b *Bed) upNodes(ctx context.Context) error {
	for i, spec := range b.opts.Layout.Nodes {
		if err := b.upNode(ctx, i, spec); err != nil {
			return fmt.Errorf("netbed: node %s: %w", spec.Name, err)
		}
	}
	for _, n := range b.nodes {
		if err := b.routeNode(ctx, n); err != nil {
			return fmt.Errorf("netbed: node %s routes: %w", n.Spec.Name, err)
		}
	}
	return nil
}

func (b *Bed) upNode(ctx context.Context, i int, spec NodeSpec) error {
	ns, err := b.newNetns(ctx, spec.Name)
	if err != nil {
		return err
	}
	n := &Node{Netns: ns, Spec: spec, nextPod: 10,
		Gateway4: spec.PodCIDR4.Masked().Addr().Next(), Gateway6: spec.PodCIDR6.Masked().Addr().Next()}
	b.nodes = append(b.nodes, n)
	for _, kv := range nodeSysctls {
		if err := ns.Sysctl(kv[0], kv[1]); err != nil {
			if strings.HasPrefix(kv[0], "net.bridge.") && errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("%w (is the br_netfilter module loaded?)", err)
			}
			return err
		}
	}
	if err := b.attach(ctx, ns, "vn"+strconv.Itoa(i), spec.IP4, spec.IP6); err != nil {
		return err
	}
	// The supernet is on-link on the node network (routeNode), so a node
	// ARPs for every address in it, ClusterIPs included, where a real node
	// sends them to its router. A node answers ARP only for the addresses
	// of its uplink: otherwise a node whose kube-ipvs0 holds a ClusterIP
	// (IPVS mode) answered for it and took its neighbours' flows to
	// ClusterIPs they had not programmed yet (with stale conntrack
	// entries on both nodes after that). kproxy's strictARP sets the same
	// for all interfaces, which TestIPVSMode checks in conf/all.
	if err := ns.Sysctl("net.ipv4.conf."+uplink+".arp_ignore", "1"); err != nil {
		return err
	}
	return runIP(ctx, [][]string{
		{"-n", ns.Name, "link", "add", podBridge, "type", "bridge"},
		{"-n", ns.Name, "addr", "add", prefixOf(n.Gateway4, spec.PodCIDR4), "dev", podBridge},
		{"-n", ns.Name, "addr", "add", prefixOf(n.Gateway6, spec.PodCIDR6), "dev", podBridge, "nodad"},
		{"-n", ns.Name, "link", "set", podBridge, "up"},
	})
}

// routeNode routes the supernets on-link on the node network and every other
// node's pod CIDRs via that node.
func (b *Bed) routeNode(ctx context.Context, n *Node) error {
	l := b.opts.Layout
	cmds := [][]string{
		{"-n", n.Name, "route", "add", l.Supernet4.String(), "dev", uplink},
		{"-n", n.Name, "-6", "route", "add", l.Supernet6.String(), "dev", uplink},
	}
	for _, o := range b.nodes {
		if o == n {
			continue
		}
		cmds = append(cmds,
			[]string{"-n", n.Name, "route", "add", o.Spec.PodCIDR4.String(), "via", o.Spec.IP4.String()},
			[]string{"-n", n.Name, "-6", "route", "add", o.Spec.PodCIDR6.String(), "via", o.Spec.IP6.String()})
	}
	return runIP(ctx, cmds)
}

// clientSysctls make a client behave like a host behind a router: it
// ignores ICMP redirects. It shares the node segment and reaches Service
// addresses by static routes via a node, and a node that forwards a packet
// back out the same link (e.g. an out-of-range loadBalancerSourceRanges
// source in iptables mode, dropped only later in FORWARD) would otherwise
// redirect it to an on-link address nobody answers for (see
// test/e2e/redirects_test.go).
var clientSysctls = [][2]string{
	{"net.ipv4.conf.all.accept_redirects", "0"}, {"net.ipv4.conf.default.accept_redirects", "0"},
	{"net.ipv6.conf.all.accept_redirects", "0"}, {"net.ipv6.conf.default.accept_redirects", "0"},
}

func (b *Bed) upClients(ctx context.Context) error {
	for i, spec := range b.opts.Layout.Clients {
		ns, err := b.newNetns(ctx, spec.Name)
		if err != nil {
			return err
		}
		b.clients = append(b.clients, ns)
		for _, kv := range clientSysctls {
			if err := ns.Sysctl(kv[0], kv[1]); err != nil {
				return err
			}
		}
		if err := b.attach(ctx, ns, "vc"+strconv.Itoa(i), spec.IP4, spec.IP6); err != nil {
			return fmt.Errorf("netbed: client %s: %w", spec.Name, err)
		}
	}
	return nil
}

// Pod is a pod namespace on a node's pod bridge, running the echo server.
type Pod struct {
	*Netns
	PodName  string // the echo server's --name, and the Kubernetes pod name
	Node     *Node
	IP4, IP6 netip.Addr
	Ports    PodPorts
	Echo     *Process
}

// PodPorts are the echo server's ports.
type PodPorts struct {
	TCP, UDP, SCTP []int
}

// DefaultPodPorts is 8080 for every protocol.
var DefaultPodPorts = PodPorts{TCP: []int{8080}, UDP: []int{8080}, SCTP: []int{8080}}

// AddPod creates pod name on node, with the next free addresses of the
// node's pod CIDRs, starts the echo server on ports (DefaultPodPorts when
// empty) and waits until it answers.
func (b *Bed) AddPod(ctx context.Context, node, name string, ports PodPorts) (*Pod, error) {
	n := b.Node(node)
	if n == nil {
		return nil, fmt.Errorf("netbed: no node %q", node)
	}
	if b.opts.EchoBinary == "" {
		return nil, errors.New("netbed: Options.EchoBinary is not set")
	}
	if len(ports.TCP)+len(ports.UDP)+len(ports.SCTP) == 0 {
		ports = DefaultPodPorts
	}
	b.mu.Lock()
	idx := n.nextPod
	n.nextPod++
	b.mu.Unlock()
	ns, err := b.newNetns(ctx, "p-"+name)
	if err != nil {
		return nil, err
	}
	p := &Pod{Netns: ns, PodName: name, Node: n, Ports: ports,
		IP4: nthAddr(n.Spec.PodCIDR4, idx), IP6: nthAddr(n.Spec.PodCIDR6, idx)}
	b.mu.Lock()
	b.pods = append(b.pods, p)
	b.mu.Unlock()
	if err := b.wirePod(ctx, p, "p"+strconv.Itoa(idx)); err != nil {
		return nil, fmt.Errorf("netbed: pod %s: %w", name, err)
	}
	if err := b.startEcho(ctx, p); err != nil {
		return nil, fmt.Errorf("netbed: pod %s: %w", name, err)
	}
	return p, nil
}

func (b *Bed) wirePod(ctx context.Context, p *Pod, port string) error {
	l, n := b.opts.Layout, p.Node
	return runIP(ctx, [][]string{
		{"-n", n.Name, "link", "add", port, "type", "veth", "peer", "name", uplink, "netns", p.Name},
		{"-n", n.Name, "link", "set", port, "master", podBridge, "up"},
		// A pod reaching itself through a Service comes back out its own port.
		{"-n", n.Name, "link", "set", port, "type", "bridge_slave", "hairpin", "on"},
		{"-n", p.Name, "addr", "add", prefixOf(p.IP4, n.Spec.PodCIDR4), "dev", uplink},
		{"-n", p.Name, "addr", "add", prefixOf(p.IP6, n.Spec.PodCIDR6), "dev", uplink, "nodad"},
		{"-n", p.Name, "link", "set", uplink, "up"},
		{"-n", p.Name, "route", "add", l.Supernet4.String(), "via", n.Gateway4.String()},
		{"-n", p.Name, "-6", "route", "add", l.Supernet6.String(), "via", n.Gateway6.String()},
	})
}

func (b *Bed) startEcho(ctx context.Context, p *Pod) error {
	argv := []string{b.opts.EchoBinary, "serve", "--name", p.PodName,
		"--tcp", joinInts(p.Ports.TCP), "--udp", joinInts(p.Ports.UDP), "--sctp", joinInts(p.Ports.SCTP)}
	proc, err := p.Start("echo", argv...)
	if err != nil {
		return err
	}
	p.Echo = proc
	if len(p.Ports.TCP) == 0 {
		return nil
	}
	req := echo.Request{Proto: echo.ProtoTCP, Dst: netip.AddrPortFrom(p.IP4, uint16(p.Ports.TCP[0])), Timeout: time.Second}
	var last echo.Result
	for range 100 { // up to ~5 s
		if last = p.Send(ctx, req); last.OK() {
			return nil
		}
		if !proc.Running() {
			return fmt.Errorf("echo server exited: %s", proc.Log())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("echo server not answering: %s", last)
}

// Routes returns `ip route` and `ip -6 route` of the namespace, for logs.
func (n *Netns) Routes(ctx context.Context) string {
	v4, _ := n.IP(ctx, "route")
	v6, _ := n.IP(ctx, "-6", "route")
	return v4 + v6
}

func runIP(ctx context.Context, cmds [][]string) error {
	for _, c := range cmds {
		if _, err := run(ctx, append([]string{"ip"}, c...)...); err != nil {
			return err
		}
	}
	return nil
}

// prefixOf writes addr with the length of the subnet it lives in.
func prefixOf(addr netip.Addr, subnet netip.Prefix) string {
	return netip.PrefixFrom(addr, subnet.Bits()).String()
}

// nthAddr returns the n-th address of prefix p.
func nthAddr(p netip.Prefix, n int) netip.Addr {
	a := p.Masked().Addr()
	for range n {
		a = a.Next()
	}
	return a
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}
