//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/test/testbed/netbed/echo"
)

// TestRollback rolls node1 back from kproxy to upstream kube-proxy v1.36.3
// the way a DaemonSet rollback does it: kproxy is stopped and upstream is
// started in its place, unchanged, with no cleanup in between, for each of
// kproxy's modes → each of upstream's modes, while a pod and the external
// client keep opening connections (ClusterIP TCP and UDP, NodePort) and
// keep-alive connections stay open. Then:
//   - probes: on the same mode none may fail (as when upstream restarts);
//     on a mode switch only those sent while upstream ran its start-up
//     cleanup of the other mode's rules and had not served yet (upstream's
//     own mode switch has that window); keep-alive connections never fail;
//   - kernel state: nothing of kproxy's steers a packet: no dispatch bucket,
//     kproxy table or rule of its own; in the kube-proxy nftables table
//     kproxy's chains are gone after upstream's next sync and its sets are
//     unreferenced (inert);
//   - a Service deleted afterwards stops answering (its ClusterIP no longer
//     reaches the old pods), a new Service answers, an endpoint change is
//     followed, and upstream's log shows no failed sync;
//   - upstream's own `--cleanup` then removes everything.
//
// A case runs when its kproxy mode is in KPROXY_E2E_MODES.
func TestRollback(t *testing.T) {
	if isUpstream() {
		t.Skip("rolls kproxy back to upstream kube-proxy: KPROXY_BIN must be kproxy")
	}
	up, kp := upstreamBinary(t), kproxyBinary(t)
	for _, from := range []string{"nftables", "iptables"} {
		for _, to := range []string{"nftables", "iptables"} {
			name := "Kproxy" + modeName(from) + "ToUpstream" + modeName(to)
			t.Run(name, func(t *testing.T) {
				skipUnlessMode(t, from)
				b := newMigBed(t, "e2e-rb-"+from[:3]+"-"+to[:3])
				// One of each pair through flags, the other through a
				// kubeadm-style config file.
				testRollback(t, b, proxySpec{bin: kp, mode: from, config: from == to}, proxySpec{bin: up, mode: to, config: from != to})
			})
		}
	}
	for _, mode := range []string{"nftables", "iptables"} {
		t.Run("UpstreamCleanupAfterKproxy"+modeName(mode), func(t *testing.T) {
			skipUnlessMode(t, mode)
			b := newMigBed(t, "e2e-rb-clean-"+mode[:3])
			b.start(proxySpec{bin: kp, mode: mode})
			b.waitServing(b.pods...)
			b.stop()
			b.upstreamCleanup(up)
		})
	}
}

func modeName(mode string) string {
	return map[string]string{"nftables": "NFTables", "iptables": "IPTables"}[mode]
}

func testRollback(t *testing.T, b *migBed, from, to proxySpec) {
	gone := b.api.createService("gone", v1.ServiceTypeNodePort)
	b.api.setEndpoints(gone.Name, b.pods)
	b.start(from)
	b.waitServing(b.pods...)
	for _, p := range b.probesOf(gone) {
		waitForPods(t, b.exited, p.from, p.req, b.pods...)
	}

	ka := b.startKeepAlive()
	ps := b.startProbing()
	time.Sleep(300 * time.Millisecond)
	b.stop()
	time.Sleep(300 * time.Millisecond) // nobody runs: kproxy's rules answer
	upStart := time.Now()
	b.start(to)
	b.waitServing(b.pods...)
	served := time.Now()
	time.Sleep(time.Second)
	results, kaResults := ps.stop(), ka.stop()
	t.Logf("upstream started at %s, served all probes from %s (%v)", fmtTime(upStart), fmtTime(served), served.Sub(upStart).Round(time.Millisecond))
	b.judgeSwitch(results, from.mode == to.mode, upStart, served)
	for i, rs := range kaResults {
		bad := failuresOf(rs)
		t.Logf("%s: %d exchanges, %d failed", ka.names[i], len(rs), len(bad))
		if len(rs) == 0 || len(bad) > 0 {
			t.Errorf("%s: %d of %d exchanges on the kept-alive connection failed across the rollback:%s", ka.names[i], len(bad), len(rs), describeProbes(bad, 5))
		}
	}
	b.checkRolledBack(to.mode, false)

	// A Service deleted after the rollback stops answering.
	b.deleteService(gone.Name)
	for _, p := range b.probesOf(gone) {
		eventually(t, b.exited, func() error {
			for _, r := range p.from.SendN(context.Background(), p.req, 4) {
				if r.OK() {
					return fmt.Errorf("answered by %s", r.Reply.Pod)
				}
			}
			return nil
		}, "%s to the deleted Service no longer answered", p.name)
	}
	// A new one answers.
	fresh := b.api.createService("fresh", v1.ServiceTypeNodePort)
	b.api.setEndpoints(fresh.Name, b.pods[:1])
	for _, p := range b.probesOf(fresh) {
		waitForPods(t, b.exited, p.from, p.req, b.pods[0])
	}
	// An endpoint change is followed (and no rule names the old pods).
	b.checkStillProxying()
	b.checkRolledBack(to.mode, true)
	b.checkUpstreamLog()

	b.stop()
	b.upstreamCleanup(to.bin)
}

// judgeSwitch fails the test for probes that failed outside what upstream
// itself would lose: none on the same mode; on a mode switch, only probes
// sent after upstream started (it removes the other mode's rules before
// its first sync) and before it served.
func (b *migBed) judgeSwitch(results [][]probeResult, sameMode bool, upStart, served time.Time) {
	b.t.Helper()
	for i, rs := range results {
		var outside []probeResult
		for _, r := range failuresOf(rs) {
			sent := r.at.Add(-r.res.Elapsed)
			if sameMode || r.at.Before(upStart) || sent.After(served) {
				outside = append(outside, r)
			}
		}
		b.t.Logf("%s: %d probes, %d failed (%d outside upstream's own window)", b.probesName(i), len(rs), len(failuresOf(rs)), len(outside))
		if len(outside) > 0 {
			b.t.Errorf("%s: %d probes failed across the rollback:%s", b.probesName(i), len(outside), describeProbes(outside, 10))
		}
	}
}

func (b *migBed) probesName(i int) string { return b.probes()[i].name }

// probesOf are new connections to svc through node1: a pod to its
// ClusterIP (TCP, both families) and the client to its NodePort.
func (b *migBed) probesOf(svc *v1.Service) []probe {
	var out []probe
	for _, f := range families {
		vip := clusterIP(b.t, svc, f.v6)
		np := netip.AddrPortFrom(nodeAddr(b.node, f), nodePort(b.t, svc, "tcp"))
		out = append(out,
			probe{svc.Name + ": pod->ClusterIP/tcp/" + f.name, b.pods[0].Netns, echo.Request{Proto: echo.ProtoTCP, Dst: netip.AddrPortFrom(vip, 80), Timeout: dropTimeout(f)}},
			probe{svc.Name + ": client->NodePort/tcp/" + f.name, b.bed.Client(), echo.Request{Proto: echo.ProtoTCP, Dst: np, Timeout: dropTimeout(f)}})
	}
	return out
}

// deleteService deletes a Service and the EndpointSlices setEndpoints wrote.
func (b *migBed) deleteService(name string) {
	b.t.Helper()
	ctx := context.Background()
	if err := b.api.cp.DeleteService(ctx, b.api.ns, name); err != nil {
		b.t.Fatal(err)
	}
	for _, fam := range []string{"ipv4", "ipv6"} {
		if err := b.api.cp.DeleteEndpointSlice(ctx, b.api.ns, name+"-"+fam); err != nil {
			b.t.Fatal(err)
		}
	}
}

// kproxyBuckets matches kproxy's iptables dispatch buckets, of this version
// and of older ones.
var kproxyBuckets = regexp.MustCompile(`(?m)^:(KUBE-SVC-(IP|NP)-|KUBE-SERVICES-|KUBE-NODEPORTS-)\S*`)

// kproxyOnlyNFT reports whether an object of the kube-proxy nftables table
// is one only kproxy makes (the names it shares with upstream have
// upstream's definitions).
func kproxyOnlyNFT(o *nftObject) bool {
	for _, p := range []string{"svc-", "loc-", "ext-", "fw-", "endpoint-ranges-"} {
		if strings.HasPrefix(o.name, p) {
			return true
		}
	}
	return slices.Contains([]string{"services-no-endpoints", "services-no-local-endpoints", "nodeports-no-endpoints",
		"nodeports-no-local-endpoints", "service-cidrs", "nodeport-cidrs", "affinity"}, o.name)
}

// checkRolledBack checks that nothing of kproxy's can steer a packet now
// that upstream runs in mode: no kproxy nftables table, no iptables rule
// or chain only kproxy writes, and in the kube-proxy nftables table no
// kproxy object that a hook reaches. With settled (upstream has synced
// again since its first sync), kproxy's chains there must be gone too:
// what is left are sets nothing refers to.
func (b *migBed) checkRolledBack(mode string, settled bool) {
	b.t.Helper()
	for _, t := range b.nftTables() {
		if strings.HasSuffix(t, " kproxy") || (mode == "iptables" && strings.HasSuffix(t, " kube-proxy")) {
			b.t.Errorf("nftables table %s is still there with upstream in %s mode", t, mode)
		}
	}
	save := b.iptablesSave()
	if m := kproxyBuckets.FindAllString(save, -1); len(m) > 0 {
		b.t.Errorf("kproxy's dispatch chains are still there: %v", m)
	}
	if strings.Contains(save, "kproxy") {
		b.t.Errorf("iptables still holds kproxy's rules:\n%s", save)
	}
	if dups := duplicateRules(save); len(dups) > 0 {
		b.t.Errorf("rules present twice:\n  %s", strings.Join(dups, "\n  "))
	}
	if mode == "nftables" {
		for _, c := range leftoverChains(save) {
			// KUBE-FIREWALL is kubelet's (both proxies add to it in
			// iptables mode, neither deletes it).
			if !strings.HasSuffix(c, " KUBE-FIREWALL") {
				b.t.Errorf("iptables chain %s is still there with upstream in nftables mode", c)
			}
		}
	}
	g := b.nftGraph()
	live := g.reachable()
	for _, o := range live {
		if o.table == "kube-proxy" && kproxyOnlyNFT(o) {
			b.t.Errorf("kproxy's %s still steers packets", o)
		}
	}
	var inert []string
	for _, o := range g.inert("kube-proxy") {
		inert = append(inert, o.String())
		if settled && o.kind == "chain" && kproxyOnlyNFT(o) {
			b.t.Errorf("kproxy's %s is still there after upstream synced again", o)
		}
	}
	b.t.Logf("upstream %s mode: inert objects in the kube-proxy tables: %v", mode, inert)
}

var (
	// failedSync matches upstream's log lines of a failed sync or cleanup.
	failedSync = regexp.MustCompile(`(?i)sync failed|failed to execute iptables-restore|unable to delete stale chains|error (cleaning|removing)`)
	errorLine  = regexp.MustCompile(`^E\d{4} `)
	// upstreamOwnErrors are error lines upstream logs on any node,
	// whatever ran before it: a configuration advice, and (nftables mode,
	// first sync on a node without its table) listing the table before
	// the transaction that creates it.
	upstreamOwnErrors = regexp.MustCompile(`Kube-proxy configuration may be incomplete|Failed to list existing nftables objects`)
)

// checkUpstreamLog fails the test for any error upstream logged, but those
// it logs on a node no proxy ran on before.
func (b *migBed) checkUpstreamLog() {
	b.t.Helper()
	var bad []string
	for _, l := range strings.Split(b.proc.Log(), "\n") {
		if failedSync.MatchString(l) || errorLine.MatchString(l) && !upstreamOwnErrors.MatchString(l) {
			bad = append(bad, l)
		}
	}
	if len(bad) > 0 {
		b.t.Errorf("upstream kube-proxy logged errors after the rollback:\n  %s", strings.Join(bad, "\n  "))
	}
}

// upstreamCleanup runs upstream's `kube-proxy --cleanup` in node1 and checks
// that it succeeds and leaves no proxy state (upstream itself leaves the
// empty mangle KUBE-PROXY-CANARY chain, and KUBE-FIREWALL to kubelet).
func (b *migBed) upstreamCleanup(up string) {
	b.t.Helper()
	out, err := b.node.Run(context.Background(), up, "--cleanup", "--v", "2")
	b.t.Logf("kube-proxy --cleanup (err=%v):\n%s", err, tail(out, 15))
	if err != nil {
		b.t.Fatalf("upstream's --cleanup failed on a node kproxy programmed: %v", err)
	}
	for _, t := range b.nftTables() {
		if strings.HasSuffix(t, " kproxy") || strings.HasSuffix(t, " kube-proxy") {
			b.t.Errorf("after kube-proxy --cleanup, nftables table %s is left", t)
		}
	}
	for _, c := range leftoverChains(b.iptablesSave()) {
		if c != "mangle KUBE-PROXY-CANARY" && !strings.HasSuffix(c, " KUBE-FIREWALL") {
			b.t.Errorf("after kube-proxy --cleanup, iptables chain %s is left", c)
		}
	}
}

// keepAlive holds long-lived TCP connections from a pod on node1 to the
// ClusterIP (one per family), each exchanging a line every interval.
type keepAlive struct {
	names   []string
	probers []*prober
}

func (b *migBed) startKeepAlive() *keepAlive {
	b.t.Helper()
	ka := &keepAlive{}
	for _, f := range families {
		dst := netip.AddrPortFrom(clusterIP(b.t, b.svc, f.v6), 80)
		conn, err := echo.DialKeepAlive(b.pods[0].Netns.Do, dst, 2*time.Second)
		if err != nil {
			b.t.Fatalf("keep-alive connection to %s: %v", dst, err)
		}
		b.t.Cleanup(func() { conn.Close() })
		ka.names = append(ka.names, "pod->ClusterIP/tcp keep-alive/"+f.name)
		ka.probers = append(ka.probers, startFuncProber(conn.Exchange, 50*time.Millisecond, 3*time.Minute))
	}
	return ka
}

func (ka *keepAlive) stop() [][]probeResult { return stopAll(ka.probers) }
