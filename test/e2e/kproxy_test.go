//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/test/testbed/netbed"
	"github.com/kproxy/kproxy/test/testbed/netbed/echo"
)

// proxyModes are the dataplanes the traffic cases run against. Adding a mode
// is one line here. KPROXY_E2E_MODES (comma-separated) overrides the list.
var proxyModes = []string{
	"nftables",
	"iptables",
}

func modes() []string {
	if env := os.Getenv("KPROXY_E2E_MODES"); env != "" {
		return strings.Split(env, ",")
	}
	return proxyModes
}

// cluster is one mode's testbed: nodes, pods, API objects and a kproxy per node.
type cluster struct {
	mode    string
	bed     *netbed.Bed
	pods    []*netbed.Pod // podsPerNode per node, node by node
	api     *api
	kproxys map[string]*netbed.Process // by node name
}

// family is one IP family of the cases.
type family struct {
	name string
	v6   bool
	// rejectBound is how fast a rejected connection must fail: ICMPv6 errors
	// only take effect at the first SYN retransmit (~1 s) on this kernel.
	rejectBound time.Duration
}

var families = []family{
	{name: "ipv4", v6: false, rejectBound: 500 * time.Millisecond},
	{name: "ipv6", v6: true, rejectBound: 1500 * time.Millisecond},
}

// kproxyCases run for every mode and family, each on its own Services.
var kproxyCases = []struct {
	name string
	run  func(t *testing.T, c *cluster, f family)
}{
	{"ClusterIPLoadBalancing", testClusterIPLoadBalancing},
	{"NodePortFromClient", testNodePortFromClient},
	{"RejectWithoutEndpoints", testRejectWithoutEndpoints},
	{"EndpointUpdates", testEndpointUpdates},
	{"SurvivesRestart", testSurvivesRestart},
}

func TestKproxy(t *testing.T) {
	for _, mode := range modes() {
		t.Run(mode, func(t *testing.T) {
			c := newCluster(t, mode)
			for _, f := range families {
				t.Run(f.name, func(t *testing.T) {
					for _, tc := range kproxyCases {
						t.Run(tc.name, func(t *testing.T) {
							tc.run(t, c, f)
							c.checkKproxysRunning(t)
						})
					}
				})
			}
			t.Run("HealthAndMetrics", func(t *testing.T) { testHealthAndMetrics(t, c) })
		})
	}
}

// newCluster builds the bed with pods, the Node objects, and starts kproxy
// in every node namespace. On failure the kproxy logs (netbed) and every
// node's ruleset are logged.
func newCluster(t *testing.T, mode string) *cluster {
	t.Helper()
	bed, pods := newBedWithPods(t)
	c := &cluster{mode: mode, bed: bed, pods: pods, kproxys: map[string]*netbed.Process{}}
	c.api = newAPI(t, "e2e-"+mode)
	c.api.applyNodes(bed)
	t.Cleanup(func() {
		if t.Failed() {
			c.dumpRules(t)
		}
	})
	for _, n := range bed.Nodes() {
		p, err := n.Start("kproxy", c.kproxyArgs(t, n)...)
		if err != nil {
			t.Fatal(err)
		}
		c.kproxys[n.Spec.Name] = p
	}
	c.waitHealthy(t)
	return c
}

// kproxyArgs are upstream kube-proxy flags, and for kproxy its debug
// endpoint (debugAddress, in the node's namespace) and its Service traffic
// metrics.
func (c *cluster) kproxyArgs(t *testing.T, n *netbed.Node) []string {
	var own []string
	if !isUpstream() {
		own = []string{"--debug-bind-address", debugAddress, "--service-traffic-metrics"}
	}
	return append([]string{
		kproxyBinary(t),
		"--kubeconfig", nodeKubeconfig(t),
		"--hostname-override", n.Spec.Name,
		"--proxy-mode", c.mode,
		"--healthz-bind-address", netip.AddrPortFrom(n.Spec.IP4, 10256).String(),
		"--metrics-bind-address", "127.0.0.1:10249",
		"--cluster-cidr", clusterCIDRs(),
		// Leave nf_conntrack_max alone: it is global, not per namespace.
		"--conntrack-max-per-core", "0",
		"--v", "2",
	}, own...)
}

// debugAddress is kproxy's --debug-bind-address on every node.
const debugAddress = "127.0.0.1:10259"

// exited returns an error naming the first kproxy that is not running.
func (c *cluster) exited() error {
	for node, p := range c.kproxys {
		if !p.Running() {
			return fmt.Errorf("kproxy on %s exited (%v); log %s:\n%s", node, p.ExitErr(), p.LogPath, tail(p.Log(), 40))
		}
	}
	return nil
}

// waitHealthy waits until every kproxy's /healthz answers 200 (it has
// synced once), failing at once if one exits.
func (c *cluster) waitHealthy(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	for _, n := range c.bed.Nodes() {
		url := "http://" + netip.AddrPortFrom(n.Spec.IP4, 10256).String() + "/healthz"
		eventually(t, c.exited, func() error {
			code, body, err := n.HTTPGet(ctx, url)
			if err == nil && code != 200 {
				err = fmt.Errorf("status %d: %s", code, body)
			}
			return err
		}, "kproxy on %s healthy (GET %s)", n.Spec.Name, url)
	}
}

func tail(s string, lines int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(l[max(0, len(l)-lines):], "\n")
}

func (c *cluster) checkKproxysRunning(t *testing.T) {
	t.Helper()
	for node, p := range c.kproxys {
		if !p.Running() {
			t.Errorf("kproxy on %s exited: %v (log %s)", node, p.ExitErr(), p.LogPath)
		}
	}
}

func (c *cluster) dumpRules(t *testing.T) {
	ctx := context.Background()
	for _, n := range c.bed.Nodes() {
		var out string
		var err error
		switch c.mode {
		case "iptables":
			v4, err4 := n.IptablesSave(ctx, false)
			v6, err6 := n.IptablesSave(ctx, true)
			out, err = v4+v6, errJoin(err4, err6)
		default:
			out, err = n.Run(ctx, "nft", "list", "ruleset")
		}
		if c.mode == "ipvs" {
			ipvs, _ := n.Run(ctx, "cat", "/proc/net/ip_vs", "/proc/net/ip_vs_conn")
			sets, _ := n.Run(ctx, "ipset", "save")
			ct, _ := n.Run(ctx, "conntrack", "-L")
			out += "\n---- /proc/net/ip_vs, ip_vs_conn ----\n" + ipvs + "\n---- ipset save ----\n" + sets + "\n---- conntrack -L ----\n" + ct
		}
		t.Logf("---- %s rules on %s (err=%v) ----\n%s", c.mode, n.Spec.Name, err, out)
	}
}

func errJoin(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// pod returns the cluster's pods matching the given indexes.
func (c *cluster) podsAt(idx ...int) []*netbed.Pod {
	out := make([]*netbed.Pod, len(idx))
	for i, x := range idx {
		out[i] = c.pods[x]
	}
	return out
}

func svcName(base string, f family) string { return strings.ToLower(base) + "-" + f.name }

func tcpTo(addr netip.Addr, port uint16) echo.Request {
	return echo.Request{Proto: echo.ProtoTCP, Dst: netip.AddrPortFrom(addr, port)}
}

// testClusterIPLoadBalancing: a Service backed by pods on both nodes is
// balanced over all of them, from a pod and from every node, over TCP, HTTP
// and UDP; pod-to-Service traffic keeps the pod's source address.
func testClusterIPLoadBalancing(t *testing.T, c *cluster, f family) {
	svc := c.api.createService(svcName("lb", f), v1.ServiceTypeClusterIP)
	c.api.setEndpoints(svc.Name, c.pods)
	vip := clusterIP(t, svc, f.v6)
	from := c.pods[0]
	for _, proto := range []string{echo.ProtoTCP, echo.ProtoHTTP, echo.ProtoUDP} {
		req := echo.Request{Proto: proto, Dst: netip.AddrPortFrom(vip, 80)}
		got := waitForPods(t, c.exited, from.Netns, req, c.pods...)
		t.Logf("%s from pod %s to %s: %s", proto, from.PodName, req.Dst, got)
		for _, r := range got.results {
			if r.Reply.Pod != from.PodName && r.Reply.Source.Addr() != podAddr(from, vip) {
				t.Errorf("%s: %s saw source %s, want the client pod's %s (no SNAT)", proto, r.Reply.Pod, r.Reply.Source, podAddr(from, vip))
			}
		}
	}
	for _, n := range c.bed.Nodes() {
		got := waitForPods(t, c.exited, n.Netns, tcpTo(vip, 80), c.pods...)
		t.Logf("tcp from node %s to %s: %s", n.Spec.Name, vip, got)
	}
}

// testNodePortFromClient: the external client reaches every pod through
// either node's address; the backends see a masqueraded source.
func testNodePortFromClient(t *testing.T, c *cluster, f family) {
	svc := c.api.createService(svcName("np", f), v1.ServiceTypeNodePort)
	c.api.setEndpoints(svc.Name, c.pods)
	client := c.bed.Client()
	clientIP := c.bed.Layout().Clients[0].IP4
	if f.v6 {
		clientIP = c.bed.Layout().Clients[0].IP6
	}
	for _, n := range c.bed.Nodes() {
		nodeIP := addrOf(clientIP, n.Spec.IP4, n.Spec.IP6)
		for _, pp := range []struct {
			port, proto string
		}{{"tcp", echo.ProtoTCP}, {"udp", echo.ProtoUDP}} {
			req := echo.Request{Proto: pp.proto, Dst: netip.AddrPortFrom(nodeIP, nodePort(t, svc, pp.port))}
			got := waitForPods(t, c.exited, client, req, c.pods...)
			t.Logf("%s from client to %s: %s", pp.proto, req.Dst, got)
			for _, r := range got.results {
				if r.Reply.Source.Addr() == clientIP {
					t.Errorf("%s: %s saw the client's own address %s, want masquerade", pp.proto, r.Reply.Pod, clientIP)
				}
			}
		}
	}
}

// testRejectWithoutEndpoints: a Service without endpoints rejects at once
// (TCP and UDP, ClusterIP from a pod, NodePort from the client) instead of
// letting connections hang.
func testRejectWithoutEndpoints(t *testing.T, c *cluster, f family) {
	svc := c.api.createService(svcName("empty", f), v1.ServiceTypeNodePort)
	c.api.setEndpoints(svc.Name, nil)
	vip := clusterIP(t, svc, f.v6)
	timeout := 2 * f.rejectBound
	for _, proto := range []string{echo.ProtoTCP, echo.ProtoUDP} {
		req := echo.Request{Proto: proto, Dst: netip.AddrPortFrom(vip, 80), Timeout: timeout}
		waitForKind(t, c.exited, c.pods[0].Netns, req, echo.KindRefused, f.rejectBound, 5)
	}
	node := c.bed.Nodes()[0]
	req := echo.Request{Proto: echo.ProtoTCP, Timeout: timeout,
		Dst: netip.AddrPortFrom(addrOf(vip, node.Spec.IP4, node.Spec.IP6), nodePort(t, svc, "tcp"))}
	waitForKind(t, c.exited, c.bed.Client(), req, echo.KindRefused, f.rejectBound, 5)
}

// testEndpointUpdates: removing and adding endpoints moves the traffic.
func testEndpointUpdates(t *testing.T, c *cluster, f family) {
	svc := c.api.createService(svcName("update", f), v1.ServiceTypeClusterIP)
	last := len(c.pods) - 1
	vip := clusterIP(t, svc, f.v6)
	from := c.bed.Nodes()[0].Netns
	steps := [][]int{
		{0, last},     // one pod on each node
		{0},           // remove the remote one
		{0, last - 1}, // add another remote one
		{last - 1},    // move everything to the other node
	}
	for _, idx := range steps {
		want := c.podsAt(idx...)
		c.api.setEndpoints(svc.Name, want)
		got := waitForPods(t, c.exited, from, tcpTo(vip, 80), want...)
		t.Logf("endpoints %v: %s", podNames(want), got)
	}
}

// testSurvivesRestart: killing kproxy leaves the programmed rules in place,
// and a restarted kproxy picks up changes made while it was down.
func testSurvivesRestart(t *testing.T, c *cluster, f family) {
	svc := c.api.createService(svcName("restart", f), v1.ServiceTypeClusterIP)
	vip := clusterIP(t, svc, f.v6)
	node := c.bed.Nodes()[0]
	before := c.podsAt(0, len(c.pods)-1)
	c.api.setEndpoints(svc.Name, before)
	waitForPods(t, c.exited, node.Netns, tcpTo(vip, 80), before...)

	kp := c.kproxys[node.Spec.Name]
	if err := kp.Kill(); err != nil {
		t.Fatal(err)
	}
	got := burst(node.Netns, tcpTo(vip, 80), 16)
	if len(got.failures) > 0 {
		t.Errorf("with kproxy killed, traffic broke: %s", got)
	}
	after := c.podsAt(1)
	c.api.setEndpoints(svc.Name, after)
	if err := kp.Restart(); err != nil {
		t.Fatal(err)
	}
	waitForPods(t, c.exited, node.Netns, tcpTo(vip, 80), after...)
}

// listingGate is the metric line of a WatchListClient gate that is off.
var listingGate = regexp.MustCompile(`(?m)^kubernetes_feature_enabled\{name="WatchListClient",stage="[A-Z]*"\} 0$`)

// testHealthAndMetrics: /healthz and /livez answer 200 on every node's
// healthz address (from the client), and /metrics on 127.0.0.1:10249 inside
// the node has upstream's sync metrics.
func testHealthAndMetrics(t *testing.T, c *cluster) {
	ctx := context.Background()
	for _, n := range c.bed.Nodes() {
		for _, path := range []string{"/healthz", "/livez"} {
			url := "http://" + netip.AddrPortFrom(n.Spec.IP4, 10256).String() + path
			eventually(t, c.exited, func() error {
				code, body, err := c.bed.Client().HTTPGet(ctx, url)
				if err == nil && code != 200 {
					err = fmt.Errorf("status %d: %s", code, body)
				}
				return err
			}, "GET %s from the client", url)
		}
		want := []string{"kubeproxy_sync_proxy_rules_duration_seconds"}
		if c.mode == "userspace" {
			// The relays' counters, per Service port and endpoint.
			want = append(want, "kproxy_userspace_connections_total{", `kproxy_userspace_bytes_total{direction="from_endpoint"`)
		}
		if c.mode == "iptables" {
			// Upstream's iptables mode reports the rules it owns per table.
			want = append(want, `kubeproxy_sync_proxy_rules_iptables_total{ip_family="IPv4",table="nat"}`,
				`kubeproxy_sync_proxy_rules_iptables_total{ip_family="IPv4",table="filter"}`)
			if !isUpstream() {
				// The testbed's iptables-nft (Debian's 1.8.9) is a version
				// the netlink writer is proven against.
				want = append(want, `kproxy_iptables_writer{writer="netlink"} 1`)
			}
		}
		eventually(t, c.exited, func() error {
			code, body, err := n.HTTPGet(ctx, "http://127.0.0.1:10249/metrics")
			if err != nil || code != 200 {
				return fmt.Errorf("status %d: %v", code, err)
			}
			for _, w := range want {
				if !strings.Contains(body, w) {
					return fmt.Errorf("no %s", w)
				}
			}
			// kproxy's informers LIST unless WatchListClient is named
			// (internal/source), and its gate metric says so; upstream's
			// says 1, its default.
			if !isUpstream() && !listingGate.MatchString(body) {
				return fmt.Errorf("no %s", listingGate)
			}
			return nil
		}, "GET /metrics in %s", n.Spec.Name)
		checkZpages(t, ctx, n)
		c.checkStartingEvent(t, ctx, n.Spec.Name)
	}
}

// checkStartingEvent: the proxy recorded its start on its Node (Normal,
// reason Starting, action StartKubeProxy, reported by kube-proxy), which
// `kubectl describe node` lists, as upstream's.
func (c *cluster) checkStartingEvent(t *testing.T, ctx context.Context, node string) {
	t.Helper()
	eventually(t, c.exited, func() error {
		list, err := c.api.cp.Client.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{
			FieldSelector: "involvedObject.kind=Node,involvedObject.name=" + node + ",reason=Starting"})
		if err != nil {
			return err
		}
		for _, ev := range list.Items {
			if ev.Type == v1.EventTypeNormal && ev.Action == "StartKubeProxy" && ev.ReportingController == "kube-proxy" {
				return nil
			}
		}
		return fmt.Errorf("no Starting event of kube-proxy on Node %s among %d", node, len(list.Items))
	}, "the Starting event on Node %s", node)
}

// flagzLine is /flagz's line of --metrics-bind-address, whichever
// separator the page picked.
var flagzLine = regexp.MustCompile(`(?m)^metrics-bind-address(:|: |=| )127\.0\.0\.1:10249$`)

// checkZpages: /statusz and /flagz answer on the metrics address, as
// upstream's (the ComponentStatusz and ComponentFlagz gates are on).
func checkZpages(t *testing.T, ctx context.Context, n *netbed.Node) {
	t.Helper()
	for path, want := range map[string]*regexp.Regexp{
		"/statusz": regexp.MustCompile(`(?m)^kube-proxy statusz$(.|\n)*^Binary version(:|: |=| ) ?1\.36\.`),
		"/flagz":   flagzLine,
	} {
		code, body, err := n.HTTPGet(ctx, "http://127.0.0.1:10249"+path)
		if err != nil || code != 200 || !want.MatchString(body) {
			t.Errorf("GET %s in %s: %d %v, want %s in:\n%s", path, n.Spec.Name, code, err, want, body)
		}
		if path == "/statusz" {
			t.Logf("GET %s in %s:%s", path, n.Spec.Name, body)
		}
	}
	// The structured form, as upstream's.
	for _, r := range []struct {
		method, path, accept, body string
		want                       *regexp.Regexp
	}{
		{http.MethodGet, "/statusz", "application/json;as=Statusz;g=config.k8s.io;v=v1beta1", "",
			regexp.MustCompile(`"kind":"Statusz"`)},
	} {
		req, err := http.NewRequestWithContext(ctx, r.method, "http://127.0.0.1:10249"+r.path, strings.NewReader(r.body))
		if err != nil {
			t.Fatal(err)
		}
		if r.accept != "" {
			req.Header.Set("Accept", r.accept)
		}
		resp, err := n.HTTPClient(5 * time.Second).Do(req)
		if err != nil {
			t.Errorf("%s %s in %s: %v", r.method, r.path, n.Spec.Name, err)
			continue
		}
		body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || !r.want.Match(body) {
			t.Errorf("%s %s in %s: %d %v, want %s in %q", r.method, r.path, n.Spec.Name, resp.StatusCode, err, r.want, body)
		}
	}
}
