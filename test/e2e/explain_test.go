//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/internal/daemon"
	"github.com/kproxy/kproxy/internal/explain"
	"github.com/kproxy/kproxy/test/testbed/netbed"
	"github.com/kproxy/kproxy/test/testbed/netbed/echo"
)

// `kproxy explain` is checked against real traffic inside the feature cases
// (ClusterIP from pods, NodePort and LoadBalancer with externalTrafficPolicy
// Local on the node with and without local endpoints, affinity, no
// endpoints, internalTrafficPolicy Local without local endpoints,
// loadBalancerSourceRanges, topology hints), in every mode and both
// families: after traffic showed where a request goes, explain, run on the
// node that proxies it against the same API server, must give the same
// verdict, the same endpoints and the same masquerading.

// explainOn runs kproxy explain on node (in its namespace, with the node's
// kproxy flags) for a request from `from`.
func (b *fbed) explainOn(t *testing.T, node *netbed.Node, from netip.Addr, r echo.Request) *explain.Answer {
	t.Helper()
	proto := r.Proto
	if proto == echo.ProtoHTTP {
		proto = echo.ProtoTCP
	}
	// Every explain in nftables and iptables mode also verifies: the
	// packet traced through the node's kernel rules must agree with
	// kproxy's rules (and with the answer) right after traffic went.
	var extra []string
	verify := b.verifies()
	if verify {
		extra = append(extra, "--verify")
	}
	// Exit status 1 with an answer is "not proxied": the JSON is there.
	a, code, out := b.runExplain(t, node, from, r.Dst.String()+"/"+proto, extra...)
	if a.Answer == nil {
		t.Fatalf("kproxy explain on %s (exit %d) printed no answer:\n%s", node.Spec.Name, code, out)
	}
	if verify && (a.Verify == nil || !a.Verify.Agree) {
		t.Errorf("explain --verify on %s: the kernel differs: %+v", node.Spec.Name, a.Verify)
	}
	t.Logf("explain on %s: %s -> %s/%s: %s (%s)", node.Spec.Name, from, r.Dst, proto, a.Verdict, a.Reason)
	return a.Answer
}

// runExplain runs kproxy explain -o json on node, with the node's kproxy
// flags plus extra, for a request from `from` to dst (IP:PORT/protocol).
// It returns the JSON it printed (a nil Answer when there is none: log
// lines on stderr, merged here, are around it), its exit status (-1 when
// it did not exit) and its whole output.
func (b *fbed) runExplain(t *testing.T, node *netbed.Node, from netip.Addr, dst string, extra ...string) (daemon.VerifiedAnswer, int, string) {
	t.Helper()
	args := []string{kproxyBinary(t), "explain", "--kubeconfig", nodeKubeconfig(t), "--hostname-override", node.Spec.Name,
		"--proxy-mode", b.mode, "--cluster-cidr", clusterCIDRs(), "--from", from.String(), "--to", dst, "--output", "json"}
	out, err := node.Run(context.Background(), append(args, extra...)...)
	code := 0
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		code = -1
	}
	var a daemon.VerifiedAnswer
	if i, j := strings.Index(out, "{"), strings.LastIndex(out, "}"); i >= 0 && j > i {
		if json.Unmarshal([]byte(out[i:j+1]), &a) != nil {
			a = daemon.VerifiedAnswer{}
		}
	}
	return a, code, out
}

// explainAgrees checks explain's answer for a request that traffic showed
// answered by the pods in got: forward, to exactly those pods' addresses,
// and masqueraded exactly when the pods saw another source than `from`
// (not checked for a node's own requests, whose source the node picks).
func (b *fbed) explainAgrees(t *testing.T, node *netbed.Node, from netip.Addr, r echo.Request, got tally) {
	t.Helper()
	a := b.explainOn(t, node, from, r)
	if a.Verdict != explain.Forward {
		t.Errorf("explain says %s (%s); traffic reached %s", a.Verdict, a.Reason, got)
		return
	}
	var want, have []netip.Addr
	addrOf := map[string]netip.Addr{}
	for _, p := range b.pods {
		addrOf[p.PodName] = pick(family{v6: r.Dst.Addr().Is6()}, p.IP4, p.IP6)
	}
	for _, name := range got.pods() {
		want = append(want, addrOf[name])
	}
	for _, c := range a.Endpoints {
		have = append(have, c.Endpoint.Addr())
	}
	slices.SortFunc(want, netip.Addr.Compare)
	slices.SortFunc(have, netip.Addr.Compare)
	if !slices.Equal(want, have) {
		t.Errorf("explain's endpoints %v, traffic reached %v (%s)", have, want, got)
	}
	if slices.Contains(nodeOwnAddrs(node), from) {
		return
	}
	for _, res := range got.results {
		if !res.OK() || addrOf[res.Reply.Pod] == from {
			continue // a pod reaching itself is masqueraded (hairpin), as explain says
		}
		if masq := res.Reply.Source.Addr() != from; masq != a.Masquerade {
			t.Errorf("explain says masquerade=%v (%s); the pod saw source %s for client %s", a.Masquerade, a.MasqueradeReason, res.Reply.Source.Addr(), from)
			return
		}
	}
}

// explainSays checks explain's verdict for a request that traffic showed
// rejected or dropped.
func (b *fbed) explainSays(t *testing.T, node *netbed.Node, from netip.Addr, r echo.Request, want explain.Verdict) {
	t.Helper()
	if a := b.explainOn(t, node, from, r); a.Verdict != want {
		t.Errorf("explain says %s (%s), traffic showed %s", a.Verdict, a.Reason, want)
	}
}
