package iptables

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/dataplane/dptest"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/objects"
)

func newTestProxier(t *testing.T) (*Proxier, *fakeKernel, fakeSysctl) {
	k := newFakeKernel()
	sc := fakeSysctl{}
	p, err := New(dptest.Config(), WithExec(k), WithSysctl(sc), WithBackend(BackendNFT))
	if err != nil {
		t.Fatal(err)
	}
	return p, k, sc
}

func changed(names ...string) dataplane.SyncRequest {
	m := map[objects.Key]struct{}{}
	for _, n := range names {
		m[objects.Key{Namespace: "ns", Name: n}] = struct{}{}
	}
	return dataplane.SyncRequest{Changed: m}
}

func twoServices(aEPs ...*model.Endpoint) *model.Snapshot {
	return dptest.Snapshot(
		dptest.Svc("ns", "a", "198.19.0.1", 80, dptest.WithEPs(aEPs...)),
		dptest.Svc("ns", "b", "198.19.0.2", 80, dptest.WithEPs(dptest.EP("198.18.65.20", 80, false))),
	)
}

func TestFullThenPartialWritesOnlyChanges(t *testing.T) {
	ctx := context.Background()
	p, k, sc := newTestProxier(t)
	if err := p.Sync(ctx, twoServices(dptest.EP("198.18.65.10", 80, false)), changed("a", "b")); err != nil {
		t.Fatal(err)
	}
	if sc[sysctlRouteLocalnet] != 1 {
		t.Errorf("route_localnet not set")
	}
	first := k.last()
	for _, want := range []string{"*mangle", "-I PREROUTING 1", "KUBE-SVC-", "KUBE-SEP-"} {
		if !strings.Contains(first, want) {
			t.Errorf("full sync lacks %q", want)
		}
	}
	// Add an endpoint to a: only a's chains and nothing of b.
	snap := twoServices(dptest.EP("198.18.65.10", 80, false), dptest.EP("198.18.65.11", 80, false))
	if err := p.Sync(ctx, snap, changed("a")); err != nil {
		t.Fatal(err)
	}
	part := k.last()
	a, b := chainsOf(snap.V4.Ports[0].ID), chainsOf(snap.V4.Ports[1].ID)
	if !strings.Contains(part, ":"+a.svc) || strings.Contains(part, b.svc) || strings.Contains(part, "*filter") ||
		strings.Contains(part, "-I ") || strings.Contains(part, ":KUBE-SERVICES ") {
		t.Errorf("partial sync wrote more than a's chains:\n%s", part)
	}
	assertKernelMatches(t, k, p, snap)
}

func TestNoEndpointsTransitionsOrderFilterAndNAT(t *testing.T) {
	ctx := context.Background()
	p, k, _ := newTestProxier(t)
	withEP := twoServices(dptest.EP("198.18.65.10", 80, false))
	if err := p.Sync(ctx, withEP, changed("a", "b")); err != nil {
		t.Fatal(err)
	}
	// Endpoints gone: the REJECT must come before the DNAT goes.
	if err := p.Sync(ctx, twoServices(), changed("a")); err != nil {
		t.Fatal(err)
	}
	txt := k.last()
	if f, n := strings.Index(txt, "*filter"), strings.Index(txt, "*nat"); f < 0 || n < 0 || f > n || strings.Count(txt, "*filter") != 1 {
		t.Errorf("removal: want filter (with REJECT) then nat:\n%s", txt)
	}
	// Endpoint back: the DNAT must come before the REJECT goes.
	if err := p.Sync(ctx, withEP, changed("a")); err != nil {
		t.Fatal(err)
	}
	txt = k.last()
	if f, n := strings.Index(txt, "*filter"), strings.Index(txt, "*nat"); f < 0 || n < 0 || n > f {
		t.Errorf("add-back: want nat then filter:\n%s", txt)
	}
	assertKernelMatches(t, k, p, withEP)
}

func TestFailedPartialRestoreForcesFull(t *testing.T) {
	ctx := context.Background()
	p, k, _ := newTestProxier(t)
	if err := p.Sync(ctx, twoServices(dptest.EP("198.18.65.10", 80, false)), changed("a", "b")); err != nil {
		t.Fatal(err)
	}
	k.failNext = true
	snap := twoServices(dptest.EP("198.18.65.12", 80, false))
	if err := p.Sync(ctx, snap, changed("a")); err == nil {
		t.Fatal("want error from failed restore")
	}
	if err := p.Sync(ctx, snap, changed()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(k.last(), "*mangle") {
		t.Errorf("sync after failure was not full:\n%s", k.last())
	}
	assertKernelMatches(t, k, p, snap)
}

func TestStaleChainsDeleted(t *testing.T) {
	ctx := context.Background()
	p, k, _ := newTestProxier(t)
	old := twoServices(dptest.EP("198.18.65.10", 80, false))
	if err := p.Sync(ctx, old, changed("a", "b")); err != nil {
		t.Fatal(err)
	}
	oldSEP := endpointChain(old.V4.Ports[0].ID, old.V4.Ports[0].Endpoints[0])
	snap := dptest.Snapshot(dptest.Svc("ns", "b", "198.19.0.2", 80, dptest.WithEPs(dptest.EP("198.18.65.20", 80, false))))
	if err := p.Sync(ctx, snap, changed("a")); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(k.last(), "-X "+oldSEP) || !strings.Contains(k.last(), "-X KUBE-SVC-IP-01") {
		t.Errorf("stale chains not deleted:\n%s", k.last())
	}
	assertKernelMatches(t, k, p, snap)
}

func TestRestartDoesNotFlushAndRemovesLeftovers(t *testing.T) {
	ctx := context.Background()
	p, k, _ := newTestProxier(t)
	snap := twoServices(dptest.EP("198.18.65.10", 80, false))
	if err := p.Sync(ctx, snap, changed("a", "b")); err != nil {
		t.Fatal(err)
	}
	// A leftover of an older run.
	_ = k.apply("4", "*nat\n:KUBE-SEP-OLDOLDOLDOLDOLD - [0:0]\nCOMMIT\n")
	p2, _ := New(dptest.Config(), WithExec(k), WithSysctl(fakeSysctl{}), WithBackend(BackendNFT))
	if err := p2.Sync(ctx, snap, dataplane.SyncRequest{Full: true}); err != nil {
		t.Fatal(err)
	}
	txt := k.last()
	if strings.Contains(txt, "\n-F ") || strings.Contains(txt, "-X KUBE-SERVICES\n") || strings.Contains(txt, "-I PREROUTING") {
		t.Errorf("restart flushed or duplicated jumps:\n%s", txt)
	}
	if !strings.Contains(txt, "-X KUBE-SEP-OLDOLDOLDOLDOLD") {
		t.Errorf("leftover chain not removed")
	}
	if n := strings.Count(k.save("4", "nat"), "-j KUBE-SERVICES\n"); n != 2 {
		t.Errorf("want 2 jumps to KUBE-SERVICES (PREROUTING, OUTPUT), got %d", n)
	}
	assertKernelMatches(t, k, p2, snap)
}

func TestDriftedAfterFlush(t *testing.T) {
	ctx := context.Background()
	p, k, _ := newTestProxier(t)
	if d, _ := p.Drifted(ctx); d {
		t.Fatal("drifted before first sync")
	}
	snap := twoServices(dptest.EP("198.18.65.10", 80, false))
	if err := p.Sync(ctx, snap, changed("a", "b")); err != nil {
		t.Fatal(err)
	}
	if d, err := p.Drifted(ctx); d || err != nil {
		t.Fatalf("drifted right after sync: %v %v", d, err)
	}
	for c := range k.table("4", "nat") { // iptables -t nat -F
		k.tables["4"]["nat"][c] = nil
	}
	if d, _ := p.Drifted(ctx); !d {
		t.Fatal("flush not detected")
	}
	if err := p.Sync(ctx, snap, changed()); err != nil {
		t.Fatal(err)
	}
	assertKernelMatches(t, k, p, snap)
}

func TestCleanupRemovesEverything(t *testing.T) {
	ctx := context.Background()
	p, k, _ := newTestProxier(t)
	if err := p.Sync(ctx, featureSnapshot(), changed()); err != nil {
		t.Fatal(err)
	}
	if err := p.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	for _, table := range []string{"nat", "filter", "mangle"} {
		out := k.save("4", table)
		out = strings.ReplaceAll(out, "KUBE-FIREWALL", "") // kubelet's, kept as upstream does
		if strings.Contains(out, "KUBE-") {
			t.Errorf("%s still has KUBE- chains:\n%s", table, out)
		}
	}
}

// assertKernelMatches compares the fake kernel's chains with a fresh render.
func assertKernelMatches(t *testing.T, k *fakeKernel, p *Proxier, snap *model.Snapshot) {
	t.Helper()
	rs := Render(p.params(), snap.V4, snap.Node)
	for _, table := range []string{tableMangle, tableFilter, tableNAT} {
		kt := k.table("4", table)
		want := map[string]bool{}
		for _, c := range rs.table(table) {
			want[c.Name] = true
			if want := strings.Join(ruleTexts(c.Rules), "\n"); strings.Join(kt[c.Name], "\n") != want {
				t.Errorf("%s %s: kernel has\n%s\nwant\n%s", table, c.Name, strings.Join(kt[c.Name], "\n"), want)
			}
		}
		for name := range kt {
			if isOwnedChain(table, name) && !want[name] {
				t.Errorf("%s: stale chain %s left", table, name)
			}
		}
	}
}

// TestTakesOverOlderBucketNames: a table written by a kproxy version that
// named its dispatch buckets KUBE-SERVICES-… / KUBE-NODEPORTS-… and kept a
// rule in KUBE-PROXY-CANARY is taken over by one full sync: the old
// buckets are deleted, the canary chains are emptied, and nothing but
// chains upstream also deletes is left.
func TestTakesOverOlderBucketNames(t *testing.T) {
	ctx := context.Background()
	p, k, _ := newTestProxier(t)
	snap := twoServices(dptest.EP("198.18.65.10", 80, false))
	svc := chainsOf(snap.V4.Ports[0].ID).svc
	old := "*mangle\n:KUBE-PROXY-CANARY - [0:0]\n-A KUBE-PROXY-CANARY -m comment --comment \"kproxy canary\" -j RETURN\nCOMMIT\n" +
		"*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-SERVICES-1 - [0:0]\n:KUBE-SERVICES-01 - [0:0]\n:KUBE-NODEPORTS-TCP-75 - [0:0]\n:KUBE-PROXY-CANARY - [0:0]\n:" + svc + " - [0:0]\n" +
		"-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n" +
		"-A KUBE-SERVICES -d 0.0.0.1/0.0.0.15 -j KUBE-SERVICES-1\n-A KUBE-SERVICES-1 -d 0.0.0.1/0.0.0.255 -g KUBE-SERVICES-01\n" +
		"-A KUBE-SERVICES-01 -d 198.19.0.1/32 -p tcp -m tcp --dport 80 -j " + svc + "\n" +
		"-A KUBE-PROXY-CANARY -m comment --comment \"kproxy canary\" -j RETURN\nCOMMIT\n"
	if err := k.apply("4", old); err != nil {
		t.Fatal(err)
	}
	if err := p.Sync(ctx, snap, changed("a", "b")); err != nil {
		t.Fatal(err)
	}
	for _, table := range []string{"mangle", "nat"} {
		save := k.save("4", table)
		for _, gone := range []string{"KUBE-SERVICES-", "KUBE-NODEPORTS-", "kproxy canary"} {
			if strings.Contains(save, gone) {
				t.Errorf("%s still holds %q after the takeover:\n%s", table, gone, save)
			}
		}
	}
	for c := range k.table("4", "nat") {
		if !isLeftoverChain(tableNAT, c) && !slices.Contains([]string{"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"}, c) {
			t.Errorf("nat chain %s is neither built in nor one upstream deletes", c)
		}
	}
	assertKernelMatches(t, k, p, snap)
}

// TestRuleCounts: after a full sync every rule owned was written; a partial
// sync writes only the changed Service's nat rules and leaves the totals
// matching the kernel's rule count.
func TestRuleCounts(t *testing.T) {
	ctx := context.Background()
	p, k, _ := newTestProxier(t)
	if got := p.RuleCounts(); len(got) != 0 {
		t.Errorf("before a sync: %+v", got)
	}
	if err := p.Sync(ctx, twoServices(dptest.EP("198.18.65.10", 80, false)), changed("a", "b")); err != nil {
		t.Fatal(err)
	}
	counts := func() map[string]dataplane.RuleCount {
		m := map[string]dataplane.RuleCount{}
		for _, c := range p.RuleCounts() {
			m[c.Family.String()+"/"+c.Table] = c
		}
		return m
	}
	first := counts()
	nat := first["IPv4/nat"]
	if nat.Total == 0 || nat.LastSync != nat.Total || first["IPv4/filter"].Total == 0 {
		t.Errorf("after the full sync: %+v", first)
	}
	if lines := strings.Count(k.last(), "\n-A "); lines < nat.Total {
		t.Errorf("the full sync wrote %d rules, the count says %d in nat alone", lines, nat.Total)
	}
	snap := twoServices(dptest.EP("198.18.65.10", 80, false), dptest.EP("198.18.65.11", 80, false))
	if err := p.Sync(ctx, snap, changed("a")); err != nil {
		t.Fatal(err)
	}
	second := counts()
	if n := second["IPv4/nat"]; n.LastSync == 0 || n.LastSync >= n.Total || n.Total <= nat.Total {
		t.Errorf("after a's partial sync (one endpoint more): nat %+v, before %+v", n, nat)
	}
	if f := second["IPv4/filter"]; f.LastSync != 0 {
		t.Errorf("the partial sync wrote %d filter rules", f.LastSync)
	}
}

// ruleTexts prints the rules.
func ruleTexts(rules []rule) []string {
	out := make([]string, len(rules))
	for i, r := range rules {
		out[i] = r.String()
	}
	return out
}

// TestLastSyncFull: the first sync, a Node change and a change that
// crosses the large-cluster bound (every endpoint comment changes) are
// full without the request asking, and LastSyncFull says so.
func TestLastSyncFull(t *testing.T) {
	p, _, _ := newTestProxier(t)
	small := twoServices(dptest.EP("198.18.65.10", 80, false))
	var many []*model.Endpoint
	for i := range largeClusterEndpoints + 1 {
		many = append(many, dptest.EP(fmt.Sprintf("198.18.%d.%d", 70+i/250, 1+i%250), 80, false))
	}
	large := twoServices(many...)
	for _, step := range []struct {
		snap *model.Snapshot
		req  dataplane.SyncRequest
		want bool
	}{
		{small, changed("a"), true},
		{small, changed("a"), false},
		{small, dataplane.SyncRequest{NodeChanged: true}, true},
		{small, changed("b"), false},
		{large, changed("a"), true},
		{large, changed("a"), false},
		{small, changed("a"), true},
	} {
		if err := p.Sync(context.Background(), step.snap, step.req); err != nil {
			t.Fatal(err)
		}
		if got := p.LastSyncFull(); got != step.want {
			t.Errorf("after %+v: LastSyncFull %v, want %v", step.req, got, step.want)
		}
	}
}

// readOnlySysctl refuses every write, as a read-only /proc/sys does.
type readOnlySysctl struct{}

func (readOnlySysctl) Get(string) (int, error) { return 0, nil }
func (readOnlySysctl) Set(n string, _ int) error {
	return fmt.Errorf("open /proc/sys/%s: read-only file system", n)
}

// TestInitSetsRouteLocalnet: Init sets route_localnet when NodePorts
// answer on localhost, and fails when it cannot (upstream's proxier does
// not start); with localhost NodePorts off it leaves the sysctl alone.
func TestInitSetsRouteLocalnet(t *testing.T) {
	ctx := context.Background()
	p, _, sc := newTestProxier(t)
	if err := p.Init(ctx); err != nil || sc[sysctlRouteLocalnet] != 1 {
		t.Errorf("Init: %v, route_localnet %d", err, sc[sysctlRouteLocalnet])
	}
	ro, err := New(dptest.Config(), WithExec(newFakeKernel()), WithSysctl(readOnlySysctl{}), WithBackend(BackendNFT))
	if err != nil {
		t.Fatal(err)
	}
	if err := ro.Init(ctx); err == nil || !strings.Contains(err.Error(), "route_localnet") {
		t.Errorf("Init with a read-only sysctl: %v, want the route_localnet error", err)
	}
	cfg := dptest.Config()
	cfg.NoLocalhostNodePorts = true
	off, err := New(cfg, WithExec(newFakeKernel()), WithSysctl(readOnlySysctl{}), WithBackend(BackendNFT))
	if err != nil {
		t.Fatal(err)
	}
	if err := off.Init(ctx); err != nil {
		t.Errorf("Init without localhost NodePorts: %v", err)
	}
}
