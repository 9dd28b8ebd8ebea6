//go:build e2e

package bench

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/test/testbed/controlplane"
	"github.com/kproxy/kproxy/test/testbed/netbed"
)

// config is one proxy under test.
type config struct{ proxy, mode string }

func (c config) String() string { return c.proxy + "/" + c.mode }

// nodeNet4 is the bench bed's node network. It differs from the e2e
// suite's (198.18.0.0/24), so a bench and an e2e run can link their beds to
// the root namespace at the same time.
var (
	nodeNet4 = netip.MustParsePrefix("198.18.6.0/24")
	hostIP4  = netip.MustParseAddr("198.18.6.1") // the root namespace: the API server
)

// benchLayout is netbed's default two-node layout moved onto nodeNet4.
func benchLayout() netbed.Layout {
	l := netbed.DefaultLayout()
	l.NodeNet4 = nodeNet4
	for i := range l.Nodes {
		l.Nodes[i].IP4 = addrAdd(nodeNet4.Addr(), 11+i)
	}
	l.Clients[0].IP4 = addrAdd(nodeNet4.Addr(), 100)
	l.Host4 = hostIP4
	return l
}

// The echo pods every bed runs (two per node) and the pod that probes.
var podPlan = []struct{ node, name string }{
	{"node1", "a"}, {"node1", "b"}, {"node2", "c"}, {"node2", "d"},
}

// plannedPods are the pods of podPlan as the API objects name them:
// netbed gives a node's pods host numbers 10, 11, ...
func plannedPods() []realPod {
	var out []realPod
	next := map[string]int{}
	for _, n := range benchLayout().Nodes {
		for _, p := range podPlan {
			if p.node == n.Name {
				out = append(out, realPod{ip: addrAdd(n.PodCIDR4.Addr(), 10+next[p.node]), node: p.node, zone: n.Zone})
				next[p.node]++
			}
		}
	}
	return out
}

// runBed is one run's sandbox: a fresh bed, its pods, the proxy on node1.
type runBed struct {
	t      *testing.T
	bed    *netbed.Bed
	node   *netbed.Node
	prober prober
	proc   *netbed.Process
	flags  []string // BENCH_PROXY_FLAGS
}

func newRunBed(t *testing.T, p params) *runBed {
	t.Helper()
	opts := netbed.Options{Layout: benchLayout(), EchoBinary: p.echoBin}
	if p.profile != "" {
		// Keep the process logs next to the profiles.
		opts.LogDir = filepath.Join(p.profile, "logs-"+strings.NewReplacer("/", "-", "×", "x").Replace(t.Name()))
	}
	bed := netbed.Start(t, opts)
	ctx := context.Background()
	want := plannedPods()
	for i, pp := range podPlan {
		pod, err := bed.AddPod(ctx, pp.node, pp.name, netbed.PodPorts{TCP: []int{podPort}})
		if err != nil {
			t.Fatal(err)
		}
		if pod.IP4 != want[i].ip {
			t.Fatalf("pod %s got %s, the API objects say %s", pp.name, pod.IP4, want[i].ip)
		}
	}
	client, err := bed.AddPod(ctx, "node1", "client", netbed.PodPorts{TCP: []int{podPort}})
	if err != nil {
		t.Fatal(err)
	}
	return &runBed{t: t, bed: bed, node: bed.Node("node1"), prober: prober{ns: client.Netns}, flags: p.proxyFlags}
}

// start runs the proxy on node1 with upstream kube-proxy flags only.
func (r *runBed) start(bin, mode, kubeconfig string, extra ...string) (time.Time, error) {
	n := r.node
	args := []string{bin,
		"--kubeconfig", kubeconfig,
		"--hostname-override", n.Spec.Name,
		"--proxy-mode", mode,
		"--healthz-bind-address", netip.AddrPortFrom(n.Spec.IP4, 10256).String(),
		"--metrics-bind-address", "127.0.0.1:10249",
		"--cluster-cidr", netbed.ClusterCIDR4.String() + "," + netbed.ClusterCIDR6.String(),
		"--conntrack-max-per-core", "0", // nf_conntrack_max is global: leave it alone
		"--v", "2",
	}
	args = append(append(args, r.flags...), extra...)
	began := time.Now()
	proc, err := n.Start(filepath.Base(bin), args...)
	r.proc = proc
	return began, err
}

// exited reports the proxy's exit as an error.
func (r *runBed) exited() error {
	if r.proc != nil && !r.proc.Running() {
		return fmt.Errorf("proxy exited: %v; log tail:\n%s", r.proc.ExitErr(), tail(r.proc.Log(), 20))
	}
	return nil
}

// stop ends the proxy and whatever children it left (by PID).
func (r *runBed) stop() {
	if r.proc == nil {
		return
	}
	kids := descendants(r.proc.PID())
	if err := r.proc.Stop(); err != nil {
		r.t.Logf("stop proxy: %v", err)
	}
	killDescendants(kids)
}

func tail(s string, lines int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(l[max(0, len(l)-lines):], "\n")
}

// kernelServiceIPs returns which of want appear in the proxy's dispatch
// state in the kernel: the service-ips map and the set (kproxy) or map
// (upstream) of Services without endpoints (nftables), every iptables
// table, or IPVS's virtual servers.
func (r *runBed) kernelServiceIPs(ctx context.Context, c config, want map[netip.Addr]bool) (int, error) {
	var dumps []string
	if c.mode == "ipvs" {
		out, err := r.node.Run(ctx, "cat", "/proc/net/ip_vs")
		if err != nil {
			return 0, err
		}
		n := 0
		for a := range procIPVSVirtualAddrs(out) {
			if want[a] {
				n++
			}
		}
		return n, nil
	}
	if c.mode == "iptables" {
		out, err := r.node.Run(ctx, "iptables-save")
		if err != nil {
			return 0, err
		}
		dumps = append(dumps, out)
	} else {
		// Both proxies' tables are named kube-proxy.
		table, objs := "kube-proxy", [][2]string{{"map", "service-ips"}, {"set", "services-no-endpoints"}}
		if c.proxy == "upstream" {
			objs = [][2]string{{"map", "service-ips"}, {"map", "no-endpoint-services"}}
		}
		for _, o := range objs {
			out, err := r.node.Run(ctx, "nft", "list", o[0], "ip", table, o[1])
			if err != nil {
				return 0, err
			}
			dumps = append(dumps, out)
		}
	}
	found := map[netip.Addr]bool{}
	for _, d := range dumps {
		for _, tok := range strings.FieldsFunc(d, func(r rune) bool { return (r < '0' || r > '9') && r != '.' }) {
			if a, err := netip.ParseAddr(tok); err == nil && want[a] {
				found[a] = true
			}
		}
	}
	return len(found), nil
}

// waitKernel polls the kernel until every address of want is programmed.
// It returns the start of the first complete dump.
func (r *runBed) waitKernel(ctx context.Context, c config, want map[netip.Addr]bool, deadline time.Time) (time.Time, error) {
	var got int
	var err error
	for time.Now().Before(deadline) {
		began := time.Now()
		if got, err = r.kernelServiceIPs(ctx, c, want); err == nil && got == len(want) {
			return began, nil
		}
		if e := r.exited(); e != nil {
			return began, e
		}
		time.Sleep(100 * time.Millisecond)
	}
	return time.Time{}, fmt.Errorf("%d of %d Service IPs in the kernel (last error: %v)", got, len(want), err)
}

// kubeconfigFor writes the node-side kubeconfig (kproxy user, API server at
// the bed's root-namespace address).
func kubeconfigFor(t *testing.T, cp *controlplane.ControlPlane) string {
	path := filepath.Join(t.TempDir(), "node.kubeconfig")
	if err := cp.WriteKubeconfig(path, hostIP4, controlplane.KproxyUser); err != nil {
		t.Fatal(err)
	}
	return path
}

// captureProfile saves /debug/pprof/<what> of the proxy (started with
// --profiling) to path, retrying while the metrics server comes up or
// another CPU profile runs.
func (r *runBed) captureProfile(t *testing.T, path, what string) {
	client := r.node.HTTPClient(60 * time.Second)
	url := metricsURL[:len(metricsURL)-len("metrics")] + "debug/pprof/" + what
	// 40 s: also waits for an earlier profile to end (one at a time).
	for range 400 {
		resp, err := client.Get(url)
		if err == nil && resp.StatusCode == 200 {
			b, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			if rerr == nil {
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err == nil {
					_ = os.WriteFile(path, b, 0o644)
					t.Logf("bench: profile %s", path)
				}
			}
			return
		}
		if resp != nil {
			resp.Body.Close()
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("bench: no profile %s from %s", what, url)
}

// procIPVSVirtualAddrs returns the IPv4 addresses of the virtual servers in
// a /proc/net/ip_vs dump ("TCP  C6128205:0050 rr" lines; the address is
// hex in network order).
func procIPVSVirtualAddrs(dump string) map[netip.Addr]bool {
	out := map[netip.Addr]bool{}
	for _, l := range strings.Split(dump, "\n") {
		f := strings.Fields(l)
		if len(f) < 2 || (f[0] != "TCP" && f[0] != "UDP" && f[0] != "SCTP") {
			continue
		}
		hexAddr, _, ok := strings.Cut(f[1], ":")
		if !ok || len(hexAddr) != 8 {
			continue
		}
		v, err := strconv.ParseUint(hexAddr, 16, 32)
		if err != nil {
			continue
		}
		out[netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})] = true
	}
	return out
}
