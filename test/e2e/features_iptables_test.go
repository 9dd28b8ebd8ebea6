//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/test/testbed/netbed"
	"github.com/kproxy/kproxy/test/testbed/netbed/echo"
)

// Feature cases of the iptables mode only (features_suite_test.go runs them
// in that mode and skips them in the others).

// iptablesOnly skips t unless the bed runs the iptables mode.
func iptablesOnly(t *testing.T, b *fbed) {
	t.Helper()
	if b.mode != "iptables" {
		t.Skipf("iptables mode only (this bed runs %s)", b.mode)
	}
}

// kubeletHint is the mangle chain a kubelet creates in the iptables backend
// it uses; kube-proxy's backend detection follows it.
const kubeletHint = "KUBE-IPTABLES-HINT"

// iptablesTool is the iptables program of node's backend for f:
// iptables-legacy when a kubelet hint chain is in legacy, else iptables
// (nf_tables here). Legacy is read whole: naming a table would create it.
func iptablesTool(t *testing.T, node *netbed.Node, f family) string {
	t.Helper()
	base := "iptables"
	if f.v6 {
		base = "ip6tables"
	}
	out, err := node.Run(context.Background(), base+"-legacy-save")
	if err == nil && strings.Contains(out, ":"+kubeletHint+" ") {
		return base + "-legacy"
	}
	return base
}

// testLocalhostNodePort: (IPv4) a NodePort answers on 127.0.0.1 from the
// node itself; kproxy has set route_localnet=1 and installed the rule that
// drops localnet packets from other hosts (CVE-2020-8558), jumped to from
// INPUT.
//
// In IPVS mode (as upstream's) no NodePort is served on a loopback address:
// the node's own address answers, 127.0.0.1 (and ::1) refuse.
func testLocalhostNodePort(t *testing.T, b *fbed, f family) {
	if b.mode == "ipvs" {
		testNoLocalhostNodePortIPVS(t, b, f)
		return
	}
	iptablesOnly(t, b)
	if f.v6 {
		t.Skip("NodePorts on localhost are IPv4 only, as upstream's iptables.localhostNodePorts")
	}
	svc := b.applyService(t, svcName("localnp", f), v1.ServiceTypeNodePort)
	b.setSlices(t, svc.Name, nil, readyEPs(b.pods...))
	node := b.node(0)
	r := req(echo.ProtoTCP, netip.MustParseAddr("127.0.0.1"), nodePort(t, svc, "tcp"))
	got := waitForPods(t, b.exited, node.Netns, r, b.pods...)
	t.Logf("tcp %s -> %s: %s", node.Spec.Name, r.Dst, got)
	ctx := context.Background()
	if v, err := node.Run(ctx, "sysctl", "-n", "net.ipv4.conf.all.route_localnet"); err != nil || strings.TrimSpace(v) != "1" {
		t.Errorf("route_localnet = %q (%v), want 1", strings.TrimSpace(v), err)
	}
	rules, err := node.Run(ctx, iptablesTool(t, node, f), "-t", "filter", "-S")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"-A INPUT -j KUBE-FIREWALL", "-d 127.0.0.0/8", "block incoming localnet connections"} {
		if !strings.Contains(rules, want) {
			t.Errorf("filter table lacks %q:\n%s", want, rules)
		}
	}
	// Those connections are counted, as upstream counts them (an nfacct
	// counter its rules count into), and so is the INVALID drop, which saw
	// nothing.
	eventually(t, b.exited, func() error {
		got, err := scrapeNFAcct(node)
		switch {
		case err != nil:
			return err
		case got[nfacctLocalhostMetric] < 1:
			return fmt.Errorf("%s = %v, want at least one packet", nfacctLocalhostMetric, got[nfacctLocalhostMetric])
		}
		if _, ok := got[nfacctInvalidMetric]; !ok {
			return fmt.Errorf("%s is not served", nfacctInvalidMetric)
		}
		return nil
	}, "the localhost NodePort's packets in %s", nfacctLocalhostMetric)
}

// Upstream's iptables-mode metrics read from nfacct counters.
const (
	nfacctLocalhostMetric = "kubeproxy_iptables_localhost_nodeports_accepted_packets_total"
	nfacctInvalidMetric   = "kubeproxy_iptables_ct_state_invalid_dropped_packets_total"
)

// scrapeNFAcct reads the node's proxy's nfacct metrics.
func scrapeNFAcct(node *netbed.Node) (map[string]float64, error) {
	fams, err := scrapeNode(node)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, name := range []string{nfacctLocalhostMetric, nfacctInvalidMetric} {
		if mf := fams[name]; mf != nil && len(mf.GetMetric()) == 1 {
			out[name] = mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return out, nil
}

// testNoLocalhostNodePorts (--iptables-localhost-nodeports=false): the
// NodePort is not answered on 127.0.0.1, and still is on the node address.
func testNoLocalhostNodePorts(t *testing.T, b *fbed, f family) {
	if f.v6 {
		t.Skip("NodePorts on localhost are IPv4 only")
	}
	svc := b.applyService(t, svcName("nolocalnp", f), v1.ServiceTypeNodePort)
	b.setSlices(t, svc.Name, nil, readyEPs(b.pods...))
	node := b.node(0)
	np := nodePort(t, svc, "tcp")
	got := waitForPods(t, b.exited, b.bed.Client(), req(echo.ProtoTCP, nodeAddr(node, f), np), b.pods...)
	t.Logf("tcp client -> %s:%d: %s", nodeAddr(node, f), np, got)
	if res := node.Send(context.Background(), req(echo.ProtoTCP, netip.MustParseAddr("127.0.0.1"), np)); res.OK() {
		t.Errorf("127.0.0.1:%d answered (%s) with localhost NodePorts off", np, res)
	}
}

// legacyCases are the representative subset of the suite run again on the
// legacy iptables backend.
var legacyCases = []fcase{
	{"ClusterIPProtocolsOnOnePort", testProtocolsOnOnePort},
	{"LoadBalancerSourceRanges", testLoadBalancerSourceRanges},
	{"SessionAffinityClientIP", testSessionAffinity},
	{"ExternalTrafficPolicyLocal", testExternalTrafficPolicyLocal},
	{"NoBlackholeOnAddBack", testNoBlackholeOnAddBack},
	{"FlushRepair", testFlushRepair},
	{"LocalhostNodePort", testLocalhostNodePort},
}

// setupLegacy makes every node look like one whose kubelet uses the legacy
// backend (its hint chain in legacy's mangle table, as kubelet creates it),
// before kproxy restarts and detects the backend. It skips when the kernel
// or tools have no legacy iptables.
func setupLegacy(t *testing.T, b *fbed) {
	ctx := context.Background()
	for _, n := range b.bed.Nodes() {
		for _, tool := range []string{"iptables-legacy", "ip6tables-legacy"} {
			if out, err := n.Run(ctx, tool, "-t", "mangle", "-N", kubeletHint); err != nil && !strings.Contains(out, "exists") {
				t.Skipf("no legacy iptables here (%s: %v %s)", tool, err, out)
			}
		}
	}
}

// testLegacyBackend runs legacyCases on the legacy backend, then checks that
// no rule was left in the nf_tables backend (never split across the two).
func testLegacyBackend(t *testing.T, b *fbed, f family) {
	for _, n := range b.bed.Nodes() {
		if tool := iptablesTool(t, n, f); !strings.HasSuffix(tool, "-legacy") {
			t.Fatalf("%s: backend tool is %s, want legacy", n.Spec.Name, tool)
		}
	}
	for _, tc := range legacyCases {
		t.Run(tc.name, func(t *testing.T) {
			tc.run(t, b, f)
			b.checkKproxysRunning(t)
		})
	}
	for _, n := range b.bed.Nodes() {
		nft, err := n.IptablesSave(context.Background(), f.v6)
		if err != nil {
			t.Fatal(err)
		}
		if l := leftoverChains(nft); len(l) > 0 {
			t.Errorf("%s: nf_tables backend still has %v while kproxy uses legacy", n.Spec.Name, l)
		}
	}
}

// teardownLegacy removes the hint chains and kproxy's legacy rules
// (--cleanup, which then also removes KUBE-FIREWALL), then restarts kproxy on the nf_tables backend.
func teardownLegacy(t *testing.T, b *fbed) {
	ctx := context.Background()
	for _, n := range b.bed.Nodes() {
		if err := b.kproxys[n.Spec.Name].Stop(); err != nil {
			t.Fatal(err)
		}
		for _, tool := range []string{"iptables-legacy", "ip6tables-legacy"} {
			_, _ = n.Run(ctx, tool, "-t", "mangle", "-X", kubeletHint)
		}
		if out, err := n.Run(ctx, kproxyBinary(t), "--cleanup"); err != nil {
			t.Fatalf("%s: --cleanup: %v\n%s", n.Spec.Name, err, tail(out, 20))
		}
		legacy, _ := n.Run(ctx, "iptables-legacy-save")
		if l := leftoverChains(legacy); len(l) > 0 {
			t.Errorf("%s: legacy still has %v after --cleanup", n.Spec.Name, l)
		}
	}
	b.restartKproxys(t)
}

// testNoLocalhostNodePortIPVS: IPVS mode serves a NodePort on the node's
// address and never on loopback.
func testNoLocalhostNodePortIPVS(t *testing.T, b *fbed, f family) {
	svc := b.applyService(t, svcName("localnp", f), v1.ServiceTypeNodePort)
	b.setSlices(t, svc.Name, nil, readyEPs(b.pods...))
	node := b.node(0)
	np := nodePort(t, svc, "tcp")
	got := waitForPods(t, b.exited, node.Netns, req(echo.ProtoTCP, nodeAddr(node, f), np), b.pods...)
	t.Logf("tcp %s -> its own address:%d: %s", node.Spec.Name, np, got)
	lo := pick(f, netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback())
	b.expectRefused(t, node.Netns, req(echo.ProtoTCP, lo, np), f)
}
