//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestMigration switches a node between upstream kube-proxy v1.36.3 and
// kproxy while a pod and the external client keep opening connections to a
// ClusterIP and a NodePort through that node:
//   - upstream → kproxy: upstream is stopped (its rules stay), kproxy starts
//     with the same flags or config file; no probe may fail, and afterwards
//     upstream's state is gone (or, in iptables mode, owned by kproxy);
//   - kproxy → upstream: kproxy is stopped, `kproxy --cleanup` removes every
//     trace, upstream starts; probes fail only while no proxy has rules.
//
// A case runs when its kproxy mode is in KPROXY_E2E_MODES.
// TestMigrationIPVS has the cases with IPVS on either side.
func TestMigration(t *testing.T) { testMigration(t, false) }

// TestMigrationIPVS runs the migrations with IPVS on either side, on a
// kernel with IPVS (make e2e-ipvs).
func TestMigrationIPVS(t *testing.T) { testMigration(t, true) }

func testMigration(t *testing.T, withIPVS bool) {
	if isUpstream() {
		t.Skip("migrates between upstream kube-proxy and kproxy: KPROXY_BIN must be kproxy")
	}
	up, kp := upstreamBinary(t), kproxyBinary(t)
	for _, tc := range []struct {
		name     string
		from, to proxySpec
		// ipvsSets adds the ip sets an earlier ipvs-mode run leaves
		// (this kernel has neither IPVS nor dummy interfaces).
		ipvsSets bool
	}{
		{"UpstreamIPTablesToIPTables", proxySpec{bin: up, mode: "iptables"}, proxySpec{bin: kp, mode: "iptables"}, false},
		{"UpstreamIPTablesToNFTables", proxySpec{bin: up, mode: "iptables", config: true}, proxySpec{bin: kp, mode: "nftables", config: true}, true},
		{"UpstreamNFTablesToNFTables", proxySpec{bin: up, mode: "nftables", config: true}, proxySpec{bin: kp, mode: "nftables", config: true}, false},
		// IPVS mode needs a kernel with IPVS: make e2e-ipvs runs these.
		{"UpstreamIPVSToIPVS", proxySpec{bin: up, mode: "ipvs"}, proxySpec{bin: kp, mode: "ipvs", config: true}, false},
		// Not run: upstream ipvs → kproxy nftables. In the VM (Debian's
		// 6.1 kernel under TCG) kproxy's first nftables sync takes
		// ~70 s; TestMigration's UpstreamIPTablesToNFTables covers the
		// takeover of upstream's iptables-family state and ip sets.
	} {
		if withIPVS != (tc.from.mode == "ipvs" || tc.to.mode == "ipvs") {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			skipUnlessCase(t, tc.to.mode, tc.from.mode)
			b := newMigBed(t, "e2e-mig-"+strings.ToLower(tc.name))
			if tc.ipvsSets {
				b.addIPVSSets()
			}
			testFromUpstream(t, b, tc.from, tc.to)
		})
	}
	if withIPVS {
		return
	}
	for _, mode := range []string{"nftables", "iptables"} {
		name := "CleanupToUpstream" + map[string]string{"nftables": "NFTables", "iptables": "IPTables"}[mode]
		t.Run(name, func(t *testing.T) {
			skipUnlessMode(t, mode)
			b := newMigBed(t, "e2e-mig-"+strings.ToLower(name))
			testToUpstream(t, b, proxySpec{bin: kp, mode: mode}, proxySpec{bin: up, mode: mode})
		})
	}
}

func skipUnlessMode(t *testing.T, mode string) {
	t.Helper()
	if !slices.Contains(modes(), mode) {
		t.Skipf("kproxy mode %s is not in KPROXY_E2E_MODES (%v)", mode, modes())
	}
}

// skipUnlessCase skips a switch between kproxy's mode and upstream's: one
// with IPVS on either side runs where the kernel has IPVS (make e2e-ipvs;
// make e2e leaves these out with -skip), any other when kproxy's mode is
// in KPROXY_E2E_MODES.
func skipUnlessCase(t *testing.T, kproxyMode, upstreamMode string) {
	t.Helper()
	if kproxyMode != "ipvs" && upstreamMode != "ipvs" {
		skipUnlessMode(t, kproxyMode)
		return
	}
	if _, err := os.Stat("/proc/net/ip_vs"); err != nil {
		t.Skipf("this kernel has no IPVS (run make e2e-ipvs): %v", err)
	}
}

// testFromUpstream: from runs, is stopped, to starts; no probe fails.
func testFromUpstream(t *testing.T, b *migBed, from, to proxySpec) {
	b.start(from)
	b.waitServing(b.pods...)
	b.checkUpstreamState(from.mode)
	legacyBefore := b.legacyTables()

	ps := b.startProbing()
	// Established connections (one per family, opened under the old
	// proxy) must carry on through the takeover.
	ka := b.startKeepAlive()
	time.Sleep(300 * time.Millisecond)
	b.stop()
	time.Sleep(300 * time.Millisecond) // nobody runs: the old rules answer
	b.start(to)
	eventually(t, b.exited, b.leftoversGone(to.mode), "%s's leftovers removed by %s", from, to)
	time.Sleep(time.Second) // keep probing the settled state
	results := ps.stop()
	names := ps.probeNames()
	results = append(results, ka.stop()...)
	names = append(names, ka.names...)
	for i, rs := range results {
		bad := failuresOf(rs)
		t.Logf("%s: %d probes, %d failed", names[i], len(rs), len(bad))
		if len(bad) > 0 {
			t.Errorf("%s: %d of %d probes failed across the switch from %s to %s:%s", names[i], len(bad), len(rs), from, to, describeProbes(bad, 10))
		}
	}
	b.checkOwned(to.mode)
	after := b.legacyTables()
	t.Logf("legacy iptables tables: %q with %s, %q with %s", legacyBefore, from, after, to)
	if after != legacyBefore {
		// Running iptables-legacy-save -t TABLE creates the table: then
		// iptables-save warns "iptables-legacy tables present" for good.
		t.Errorf("%s instantiated legacy iptables tables: before %q, after %q", to, legacyBefore, after)
	}
	b.checkStillProxying()
}

// testToUpstream: kproxy runs, is stopped and cleans up, upstream starts.
// Probes may fail only between the cleanup and upstream's first answer.
func testToUpstream(t *testing.T, b *migBed, from, to proxySpec) {
	b.start(from)
	b.waitServing(b.pods...)

	ps := b.startProbing()
	time.Sleep(300 * time.Millisecond)
	b.stop()
	time.Sleep(300 * time.Millisecond) // kproxy's rules keep answering
	cleanStart := time.Now()
	out, err := b.node.Run(context.Background(), from.bin, "--cleanup", "--v", "2")
	t.Logf("--cleanup in %v (err=%v):\n%s", time.Since(cleanStart).Round(time.Millisecond), err, tail(out, 15))
	if err != nil {
		t.Fatalf("kproxy --cleanup failed: %v", err)
	}
	b.checkClean()
	b.start(to)
	b.waitServing(b.pods...)
	back := time.Now()
	time.Sleep(time.Second)
	results := ps.stop()
	t.Logf("no proxy rules from %s until upstream served again at %s (%v)", fmtTime(cleanStart), fmtTime(back), back.Sub(cleanStart).Round(time.Millisecond))
	for i, rs := range results {
		var outside []probeResult
		for _, r := range failuresOf(rs) {
			// A probe sent before the cleanup may fail only if it was
			// still waiting then; one sent after upstream served may not.
			sent := r.at.Add(-r.res.Elapsed)
			if r.at.Before(cleanStart) || sent.After(back) {
				outside = append(outside, r)
			}
		}
		t.Logf("%s: %d probes, %d failed (%d outside the window)", ps.probes[i].name, len(rs), len(failuresOf(rs)), len(outside))
		if len(outside) > 0 {
			t.Errorf("%s: %d probes failed while a proxy had rules:%s", ps.probes[i].name, len(outside), describeProbes(outside, 10))
		}
	}
	b.checkStillProxying()
}

// checkUpstreamState makes sure upstream really programmed its mode, so
// that the leftover checks check something.
func (b *migBed) checkUpstreamState(mode string) {
	b.t.Helper()
	if mode == "nftables" && !b.hasNFTable("kube-proxy") {
		b.t.Fatalf("upstream nftables mode runs but there is no kube-proxy table: %v", b.nftTables())
	}
	if mode == "iptables" && !slices.Contains(b.kubeChains(), "nat KUBE-SERVICES") {
		b.t.Fatalf("upstream iptables mode runs but there is no nat KUBE-SERVICES chain: %v", b.kubeChains())
	}
	if mode == "ipvs" && len(b.ipvsLeft()) == 0 {
		b.t.Fatal("upstream ipvs mode runs but there is no IPVS state")
	}
}

// leftoversGone returns a check that upstream's state of the other modes
// is gone: no KUBE-* ip set (ipvs mode); in nftables mode no KUBE-*
// iptables chain and the kube-proxy tables (kproxy's own table name) hold
// none of upstream's objects; in iptables mode no kube-proxy or kproxy
// nftables table.
func (b *migBed) leftoversGone(mode string) func() error {
	return func() error {
		var left []string
		if mode == "nftables" {
			left = append(left, b.kubeChains()...)
			left = append(left, upstreamNFTObjects(b.nftGraph())...)
		} else {
			for _, t := range b.nftTables() {
				if strings.HasSuffix(t, " kube-proxy") || strings.HasSuffix(t, " kproxy") {
					left = append(left, "nft table "+t)
				}
			}
		}
		if mode != "ipvs" {
			left = append(left, b.ipvsLeft()...)
		}
		if len(left) > 0 {
			return fmt.Errorf("still there: %v", left)
		}
		return nil
	}
}

// upstreamNFTObjects lists the objects of the kube-proxy tables that only
// upstream's nftables mode makes: its per-Service chains and affinity sets,
// and its no-endpoint verdict maps.
func upstreamNFTObjects(g *nftGraph) []string {
	var out []string
	for _, o := range g.objects {
		if o.table != "kube-proxy" {
			continue
		}
		upstreamOnly := o.name == "no-endpoint-services" || o.name == "no-endpoint-nodeports" || o.name == "nodeport-ips"
		for _, p := range []string{"service-", "local-", "external-", "endpoint-", "firewall-", "affinity-"} {
			upstreamOnly = upstreamOnly || strings.HasPrefix(o.name, p) && strings.Contains(o.name, "/")
		}
		if upstreamOnly {
			out = append(out, o.String())
		}
	}
	slices.Sort(out)
	return out
}

// checkOwned: in iptables mode the KUBE-* chains are kproxy's now (its
// dispatch buckets, no rule twice); in nftables mode the kube-proxy tables
// hold kproxy's layout.
func (b *migBed) checkOwned(mode string) {
	b.t.Helper()
	if mode == "ipvs" {
		if len(b.ipvsLeft()) == 0 {
			b.t.Error("no IPVS state after the switch to kproxy's ipvs mode")
		}
		if dups := duplicateRules(b.iptablesSave()); len(dups) > 0 {
			b.t.Errorf("rules present twice after the takeover:\n  %s", strings.Join(dups, "\n  "))
		}
		return
	}
	if mode == "nftables" {
		g := b.nftGraph()
		if g.objects[nftKey("ip", "kube-proxy", "set", "services-no-endpoints")] == nil { // a set only kproxy makes
			b.t.Errorf("the kube-proxy table does not hold kproxy's layout: %v", b.nftTables())
		}
		return
	}
	save := b.iptablesSave()
	if !strings.Contains(save, "-j KUBE-SVC-IP-") {
		b.t.Errorf("KUBE-SERVICES does not dispatch through kproxy's buckets:\n%s", save)
	}
	if dups := duplicateRules(save); len(dups) > 0 {
		b.t.Errorf("rules present twice after the takeover:\n  %s", strings.Join(dups, "\n  "))
	}
}

// checkStillProxying moves the Service's endpoints to node1's pods and
// checks that traffic follows and that no rule names the removed pods any
// more (upstream's stale per-endpoint rules included).
func (b *migBed) checkStillProxying() {
	b.t.Helper()
	keep, gone := b.pods[:podsPerNode], b.pods[podsPerNode:]
	b.api.setEndpoints(b.svc.Name, keep)
	b.waitServing(keep...)
	for _, p := range gone {
		for _, f := range families {
			ip := podIP(p, f)
			eventually(b.t, b.exited, func() error {
				if lines := b.rulesMentioning(ip); len(lines) > 0 {
					return fmt.Errorf("rules still name removed endpoint %s:\n  %s", ip, strings.Join(lines, "\n  "))
				}
				return nil
			}, "rules of removed endpoint %s (%s) gone", p.PodName, ip)
		}
	}
}

// checkClean: after --cleanup nothing of either proxy is left.
func (b *migBed) checkClean() {
	b.t.Helper()
	for _, t := range b.nftTables() {
		if strings.HasSuffix(t, " kproxy") || strings.HasSuffix(t, " kube-proxy") {
			b.t.Errorf("after --cleanup, nftables table %s is left", t)
		}
	}
	if left := b.kubeChains(); len(left) > 0 {
		b.t.Errorf("after --cleanup, KUBE-* chains are left: %v", left)
	}
	if legacy := b.legacyTables(); legacy != "" {
		b.t.Errorf("after --cleanup, legacy iptables tables exist (nothing here uses them): %s", legacy)
	}
}
