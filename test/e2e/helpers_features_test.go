//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/kproxy/kproxy/internal/explain"
	"github.com/kproxy/kproxy/test/testbed/controlplane"
	"github.com/kproxy/kproxy/test/testbed/netbed"
	"github.com/kproxy/kproxy/test/testbed/netbed/echo"
)

// Helpers of the feature cases (features_*_test.go). They build on the
// cluster of kproxy_test.go: one bed per proxy mode, shared by every feature
// case of both families; cases that need other kproxy flags restart kproxy
// with them (fbed.restartKproxys).

// fbed is one mode's feature bed: the cluster plus what the feature cases add.
type fbed struct {
	*cluster
	top *testing.T // the mode's test: kubeconfigs and processes outlive subtests
}

// fcase is one feature case, run once per family.
type fcase struct {
	name string
	run  func(t *testing.T, b *fbed, f family)
}

// isUpstream reports whether KPROXY_BIN is upstream kube-proxy (the cases
// are validated against it).
func isUpstream() bool {
	return strings.HasPrefix(filepath.Base(os.Getenv(envKproxyBin)), "kube-proxy")
}

// kproxyOnly skips t when running upstream kube-proxy, which lacks the
// behaviour; it never skips when running kproxy.
func kproxyOnly(t *testing.T, why string) {
	t.Helper()
	if isUpstream() {
		t.Skipf("kproxy-only: %s (KPROXY_BIN=%s is upstream kube-proxy)", why, os.Getenv(envKproxyBin))
	}
}

// --- addresses --------------------------------------------------------------

func pick(f family, v4, v6 netip.Addr) netip.Addr {
	if f.v6 {
		return v6
	}
	return v4
}

func nodeAddr(n *netbed.Node, f family) netip.Addr { return pick(f, n.Spec.IP4, n.Spec.IP6) }
func podIP(p *netbed.Pod, f family) netip.Addr     { return pick(f, p.IP4, p.IP6) }

func (b *fbed) clientAddr(f family) netip.Addr {
	c := b.bed.Layout().Clients[0]
	return pick(f, c.IP4, c.IP6)
}

// client2Addr is a second address of the client namespace (a second
// external source), added by ensureClient2.
func client2Addr(f family) netip.Addr {
	return pick(f, netip.MustParseAddr("198.18.0.101"), netip.MustParseAddr("fd00:0:0:10::101"))
}

// ensureClient2 gives the client namespace its second address (idempotent).
func (b *fbed) ensureClient2(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	l := b.bed.Layout()
	for _, a := range []netip.Prefix{
		netip.PrefixFrom(client2Addr(family{}), l.NodeNet4.Bits()),
		netip.PrefixFrom(client2Addr(family{v6: true}), l.NodeNet6.Bits()),
	} {
		args := []string{"addr", "replace", a.String(), "dev", "eth0"}
		if a.Addr().Is6() {
			// Deprecated (preferred_lft 0): never picked as a source
			// address unless a test binds to it explicitly.
			args = append(args, "nodad", "preferred_lft", "0")
		}
		if _, err := b.bed.Client().IP(ctx, args...); err != nil {
			t.Fatal(err)
		}
	}
}

// extIP is the n-th test address for LoadBalancer ingress and externalIPs
// (controlplane.LoadBalancerCIDR4/6). Each case uses its own n.
func extIP(f family, n int) netip.Addr {
	p := pick(f, controlplane.LoadBalancerCIDR4.Addr(), controlplane.LoadBalancerCIDR6.Addr())
	for range n {
		p = p.Next()
	}
	return p
}

// routeVia routes the single address dst from ns via node's address.
func routeVia(t *testing.T, ns *netbed.Netns, dst netip.Addr, via *netbed.Node, f family) {
	t.Helper()
	if err := ns.AddRoute(context.Background(), netip.PrefixFrom(dst, dst.BitLen()), nodeAddr(via, f)); err != nil {
		t.Fatal(err)
	}
}

// nodeOwnAddrs are the addresses a node masquerades to: its node-network
// address and its pod bridge address.
func nodeOwnAddrs(n *netbed.Node) []netip.Addr {
	return []netip.Addr{n.Spec.IP4, n.Spec.IP6, n.Gateway4, n.Gateway6}
}

// --- requests ---------------------------------------------------------------

func req(proto string, dst netip.Addr, port uint16) echo.Request {
	return echo.Request{Proto: proto, Dst: netip.AddrPortFrom(dst, port)}
}

// dropTimeout is how long a request waits before it counts as dropped.
func dropTimeout(f family) time.Duration {
	if f.v6 {
		return 2 * time.Second // an ICMPv6 reject arrives only after ~1 s
	}
	return time.Second
}

// expectDropped waits until req from ns gets no answer at all within
// dropTimeout, and checks once more.
func (b *fbed) expectDropped(t *testing.T, ns *netbed.Netns, r echo.Request, f family) {
	t.Helper()
	r.Timeout = dropTimeout(f)
	waitForKind(t, b.exited, ns, r, echo.KindTimeout, r.Timeout+500*time.Millisecond, 1)
}

// expectTurnedAway is expectDropped for a client upstream drops, in
// kproxy's userspace mode: its socket takes a TCP connection, then resets
// it (a socket cannot drop a SYN); a UDP datagram is dropped.
func (b *fbed) expectTurnedAway(t *testing.T, ns *netbed.Netns, r echo.Request, f family) {
	t.Helper()
	if b.mode != "userspace" || r.Proto == echo.ProtoUDP {
		b.expectDropped(t, ns, r, f)
		return
	}
	r.Timeout = dropTimeout(f)
	waitForKind(t, b.exited, ns, r, echo.KindReset, r.Timeout+500*time.Millisecond, 1)
}

// turnedAway is explain's verdict for what expectTurnedAway expects.
func (b *fbed) turnedAway(r echo.Request) explain.Verdict {
	if b.mode == "userspace" && r.Proto != echo.ProtoUDP {
		return explain.Reject
	}
	return explain.Drop
}

// refusesUnknownPorts says whether the mode refuses a Service IP's ports
// no Service has: nftables (upstream's cluster-ips-check) and userspace
// (no socket on a local address); the others let them pass unanswered.
func (b *fbed) refusesUnknownPorts() bool { return b.mode == "nftables" || b.mode == "userspace" }

// sourceKept says which source an endpoint sees of client's traffic that
// keeps it (externalTrafficPolicy Local): the client's own, or in the
// userspace mode, an address of via, the relaying node.
func (b *fbed) sourceKept(client netip.Addr, via *netbed.Node) (func(netip.Addr) bool, string) {
	if b.mode == "userspace" {
		return isOneOf(nodeOwnAddrs(via)...), via.Spec.Name + "'s address (the userspace mode relays)"
	}
	return isOneOf(client), "the client's " + client.String() + " (no SNAT)"
}

// verifies says whether explain --verify applies: the netfilter modes.
func (b *fbed) verifies() bool {
	return (b.mode == "nftables" || b.mode == "iptables") && !isUpstream()
}

// expectRefused waits until req from ns is rejected fast, and checks that
// three more are.
func (b *fbed) expectRefused(t *testing.T, ns *netbed.Netns, r echo.Request, f family) {
	t.Helper()
	r.Timeout = 2 * f.rejectBound
	waitForKind(t, b.exited, ns, r, echo.KindRefused, f.rejectBound, 3)
}

// checkSources fails t for every reply in got whose source is not allowed.
func checkSources(t *testing.T, what string, got tally, allowed func(netip.Addr) bool, want string) {
	t.Helper()
	for _, r := range got.results {
		if r.OK() && !allowed(r.Reply.Source.Addr()) {
			t.Errorf("%s: %s saw source %s, want %s", what, r.Reply.Pod, r.Reply.Source.Addr(), want)
		}
	}
}

func isOneOf(addrs ...netip.Addr) func(netip.Addr) bool {
	return func(a netip.Addr) bool {
		for _, x := range addrs {
			if a == x {
				return true
			}
		}
		return false
	}
}

// waitOnePod re-samples bursts until one has no failures and every reply
// comes from a single pod (session affinity), and returns that pod.
func (b *fbed) waitOnePod(t *testing.T, ns *netbed.Netns, r echo.Request, n int) string {
	t.Helper()
	var last tally
	deadline := time.Now().Add(convergeTimeout)
	for time.Now().Before(deadline) {
		if last = burst(ns, r, n); len(last.failures) == 0 && len(last.byPod) == 1 {
			return last.pods()[0]
		}
		checkAbort(t, b.exited)
		time.Sleep(resample)
	}
	t.Fatalf("%s -> %s %s: want every reply from one pod, last burst: %s", ns.Name, r.Proto, r.Dst, last)
	return ""
}

// --- API objects ------------------------------------------------------------

type svcOpt func(*v1.Service)

func withPorts(ports ...v1.ServicePort) svcOpt {
	return func(s *v1.Service) { s.Spec.Ports = ports }
}

func withETPLocal(s *v1.Service) {
	s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
}

func withITPLocal(s *v1.Service) {
	s.Spec.InternalTrafficPolicy = ptr.To(v1.ServiceInternalTrafficPolicyLocal)
}

// defaultPorts: "tcp" and "udp", 80 -> echoPort.
func defaultPorts() []v1.ServicePort {
	return []v1.ServicePort{
		controlplane.ServicePort("tcp", v1.ProtocolTCP, 80, echoPort),
		controlplane.ServicePort("udp", v1.ProtocolUDP, 80, echoPort),
	}
}

// applyService creates a dual-stack Service of type typ with defaultPorts
// changed by opts, and deletes it when t ends.
func (b *fbed) applyService(t *testing.T, name string, typ v1.ServiceType, opts ...svcOpt) *v1.Service {
	t.Helper()
	svc := controlplane.NewService(b.api.ns, name, nil, defaultPorts()...)
	svc.Spec.Type = typ
	svc.Spec.IPFamilyPolicy = ptr.To(v1.IPFamilyPolicyRequireDualStack)
	for _, o := range opts {
		o(svc)
	}
	out, err := b.api.cp.ApplyService(context.Background(), svc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.api.cp.DeleteService(context.Background(), b.api.ns, name) })
	return out
}

// lbIngress is one status.loadBalancer.ingress entry.
type lbIngress struct {
	ip    netip.Addr
	proxy bool // ipMode Proxy instead of VIP
}

// setIngress writes the Service's status.loadBalancer.ingress.
func (b *fbed) setIngress(t *testing.T, svc *v1.Service, ings ...lbIngress) {
	t.Helper()
	ctx := context.Background()
	services := b.api.cp.Client.CoreV1().Services(svc.Namespace)
	cur, err := services.Get(ctx, svc.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Status.LoadBalancer.Ingress = nil
	for _, i := range ings {
		mode := v1.LoadBalancerIPModeVIP
		if i.proxy {
			mode = v1.LoadBalancerIPModeProxy
		}
		cur.Status.LoadBalancer.Ingress = append(cur.Status.LoadBalancer.Ingress,
			v1.LoadBalancerIngress{IP: i.ip.String(), IPMode: ptr.To(mode)})
	}
	if _, err := services.UpdateStatus(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// epState is an endpoint's conditions.
type epState int

const (
	epReady              epState = iota // ready, serving, not terminating
	epServingTerminating                // not ready, serving, terminating
	epTerminating                       // not ready, not serving, terminating
)

// ep is one endpoint of setSlices: a pod, its conditions, its zone hint.
type ep struct {
	pod   *netbed.Pod
	state epState
	hint  string // zone hint; "" for none
}

func readyEPs(pods ...*netbed.Pod) []ep {
	out := make([]ep, len(pods))
	for i, p := range pods {
		out[i] = ep{pod: p}
	}
	return out
}

// defaultEndpointPorts: "tcp" and "udp" on echoPort.
func defaultEndpointPorts() []discoveryv1.EndpointPort {
	return []discoveryv1.EndpointPort{
		controlplane.EndpointPort("tcp", v1.ProtocolTCP, echoPort),
		controlplane.EndpointPort("udp", v1.ProtocolUDP, echoPort),
	}
}

// setSlices writes the Service's two EndpointSlices (<svc>-ipv4,
// <svc>-ipv6) listing exactly eps; nil ports means defaultEndpointPorts.
func (b *fbed) setSlices(t *testing.T, svc string, ports []discoveryv1.EndpointPort, eps []ep) {
	t.Helper()
	if ports == nil {
		ports = defaultEndpointPorts()
	}
	for _, fam := range []family{{name: "ipv4"}, {name: "ipv6", v6: true}} {
		addrType := sliceAddressType(fam)
		var out []discoveryv1.Endpoint
		for _, e := range eps {
			out = append(out, endpointOf(b.api.ns, e, fam))
		}
		name := svc + "-" + fam.name
		slice := controlplane.NewEndpointSlice(b.api.ns, svc, name, addrType, ports, out...)
		if _, err := b.api.cp.ApplyEndpointSlice(context.Background(), slice); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.api.cp.DeleteEndpointSlice(context.Background(), b.api.ns, name) })
	}
}

// sliceAddressType is the EndpointSlice address type of a family.
func sliceAddressType(f family) discoveryv1.AddressType {
	if f.v6 {
		return discoveryv1.AddressTypeIPv6
	}
	return discoveryv1.AddressTypeIPv4
}

func endpointOf(ns string, e ep, f family) discoveryv1.Endpoint {
	p := e.pod
	out := controlplane.ReadyEndpoint(podIP(p, f), p.Node.Spec.Name, p.Node.Spec.Zone)
	out.TargetRef = &v1.ObjectReference{Kind: "Pod", Namespace: ns, Name: p.PodName}
	switch e.state {
	case epServingTerminating:
		out.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true)}
	case epTerminating:
		out.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(false), Terminating: ptr.To(true)}
	}
	if e.hint != "" {
		out.Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: e.hint}}}
	}
	return out
}

// --- pods and nodes ---------------------------------------------------------

// podsOn returns the cluster's pods on node (node1 or node2), in order.
func (b *fbed) podsOn(node string) []*netbed.Pod {
	var out []*netbed.Pod
	for _, p := range b.pods {
		if p.Node.Spec.Name == node {
			out = append(out, p)
		}
	}
	return out
}

func (b *fbed) node(i int) *netbed.Node { return b.bed.Nodes()[i] }

// --- kproxy processes -------------------------------------------------------

// restartKproxys stops kproxy on every node and starts it again with the
// suite's flags plus extra, then waits until every one is healthy.
func (b *fbed) restartKproxys(t *testing.T, extra ...string) {
	t.Helper()
	for _, n := range b.bed.Nodes() {
		if err := b.kproxys[n.Spec.Name].Stop(); err != nil {
			t.Fatal(err)
		}
		args := append(b.kproxyArgs(b.top, n), extra...)
		p, err := n.Start("kproxy", args...)
		if err != nil {
			t.Fatal(err)
		}
		b.kproxys[n.Spec.Name] = p
	}
	b.waitHealthy(t)
}

// --- continuous probing -----------------------------------------------------

// probeResult is one probe of a prober.
type probeResult struct {
	at  time.Time
	res echo.Result
}

// prober sends r from ns every interval until stopped (bounded by max).
type prober struct {
	mu      sync.Mutex
	results []probeResult
	stop    chan struct{}
	done    chan struct{}
}

func startProber(ns *netbed.Netns, r echo.Request, interval, max time.Duration) *prober {
	return startFuncProber(func() echo.Result { return ns.Send(context.Background(), r) }, interval, max)
}

// startFuncProber calls probe every interval until stopped (bounded by max).
func startFuncProber(probe func() echo.Result, interval, max time.Duration) *prober {
	p := &prober{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		end := time.Now().Add(max)
		for time.Now().Before(end) {
			res := probe()
			p.mu.Lock()
			p.results = append(p.results, probeResult{at: time.Now(), res: res})
			p.mu.Unlock()
			select {
			case <-p.stop:
				return
			case <-time.After(interval):
			}
		}
	}()
	return p
}

// Stop ends probing and returns every result.
func (p *prober) Stop() []probeResult {
	close(p.stop)
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]probeResult(nil), p.results...)
}

// failuresOf returns the probes that got no reply.
// stopFamilyProbers stops probers (one per family, in families' order)
// and fails t for every probe that failed across what.
func stopFamilyProbers(t *testing.T, probers []*prober, what string) {
	t.Helper()
	for i, p := range probers {
		rs := p.Stop()
		if bad := failuresOf(rs); len(bad) > 0 {
			t.Errorf("%s: %d of %d new connections failed across %s:%s", families[i].name, len(bad), len(rs), what, describeProbes(bad, 10))
		} else {
			t.Logf("%s: %d new connections across %s, none failed", families[i].name, len(rs), what)
		}
	}
}

func failuresOf(rs []probeResult) []probeResult {
	var out []probeResult
	for _, r := range rs {
		if !r.res.OK() {
			out = append(out, r)
		}
	}
	return out
}

func describeProbes(rs []probeResult, max int) string {
	var b strings.Builder
	for i, r := range rs {
		if i == max {
			fmt.Fprintf(&b, "... (%d more)", len(rs)-max)
			break
		}
		fmt.Fprintf(&b, "\n  %s %s", r.at.Format("15:04:05.000"), r.res)
	}
	return b.String()
}

// --- health-check node ports ------------------------------------------------

// hcBody is upstream's health-check node port reply.
type hcBody struct {
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"service"`
	LocalEndpoints      int  `json:"localEndpoints"`
	ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
}

func parseHC(body string) (hcBody, error) {
	var h hcBody
	dec := json.NewDecoder(strings.NewReader(body))
	dec.DisallowUnknownFields()
	err := dec.Decode(&h)
	return h, err
}
