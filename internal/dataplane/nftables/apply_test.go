package nftables

import (
	"context"
	"fmt"
	"hash/fnv"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/knftables"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/dataplane/dptest"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/objects"
)

// fakeKernel is one knftables.Fake per family, shared by Proxiers to model
// a kernel that outlives a restart.
type fakeKernel struct {
	fakes map[string]*knftables.Fake
}

func newFakeKernel() *fakeKernel {
	return &fakeKernel{fakes: map[string]*knftables.Fake{}}
}

func (k *fakeKernel) open(f knftables.Family, table string) (knftables.Interface, error) {
	key := string(f) + " " + table
	if k.fakes[key] == nil {
		k.fakes[key] = knftables.NewFake(f, table)
	}
	return k.fakes[key], nil
}

func (k *fakeKernel) fake(f model.Family) *knftables.Fake {
	fk, _ := k.open(nftFamily(f), DefaultTableName)
	return fk.(*knftables.Fake)
}

func (k *fakeKernel) lastTx(f model.Family) string {
	fk := k.fake(f)
	fk.RLock()
	defer fk.RUnlock()
	if fk.LastTransaction == nil {
		return ""
	}
	return fk.LastTransaction.String()
}

func (k *fakeKernel) run(t *testing.T, f model.Family, do func(tx *knftables.Transaction)) {
	t.Helper()
	tx := k.fake(f).NewTransaction()
	do(tx)
	if err := k.fake(f).Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
}

// wantDump is what a fresh table loaded from the rendered text dumps as,
// rendered with (a copy of) the endpoint-map blocks slots holds.
func wantDump(t *testing.T, cfg dataplane.Config, snap *model.Snapshot, f model.Family, slots *slotAlloc) string {
	t.Helper()
	fresh := knftables.NewFake(nftFamily(f), DefaultTableName)
	r := newRenderer(cfg, f, snap.Node)
	if slots != nil {
		r.slots = &slotAlloc{next: maps.Clone(slots.next), free: maps.Clone(slots.free), owner: maps.Clone(slots.owner), owned: maps.Clone(slots.owned)}
	}
	d := r.fixed()
	for _, sp := range snap.Family(f).Ports {
		d.Ports[sp.ID] = r.port(sp)
	}
	if err := fresh.ParseDump(renderText(d, DefaultTableName)); err != nil {
		t.Fatal(err)
	}
	return fresh.Dump()
}

type applyEnv struct {
	t     *testing.T
	cfg   dataplane.Config
	k     *fakeKernel
	clock *clocktesting.FakeClock
	p     *Proxier
}

func newApplyEnv(t *testing.T) *applyEnv {
	e := &applyEnv{t: t, cfg: dptest.Config(), k: newFakeKernel(), clock: clocktesting.NewFakeClock(time.Unix(1000, 0))}
	e.cfg.Families = []model.Family{model.IPv4, model.IPv6}
	e.restart()
	return e
}

// restart replaces the Proxier, keeping the kernel.
func (e *applyEnv) restart() {
	p, err := New(e.cfg, WithNFT(e.k.open), WithClock(e.clock))
	if err != nil {
		e.t.Fatal(err)
	}
	e.p = p
}

func (e *applyEnv) sync(snap *model.Snapshot, req dataplane.SyncRequest) {
	e.t.Helper()
	if err := e.p.Sync(context.Background(), snap, req); err != nil {
		e.t.Fatal(err)
	}
}

// checkKernel asserts that every family's table is exactly the rendering
// of snap.
func (e *applyEnv) checkKernel(snap *model.Snapshot) {
	e.t.Helper()
	for _, f := range e.cfg.Families {
		if got, want := sortedLines(e.k.fake(f).Dump()), sortedLines(wantDump(e.t, e.cfg, snap, f, e.p.fams[f].slots)); got != want {
			e.t.Fatalf("%s table differs from the rendering:\n--- got\n%s\n--- want\n%s", f, got, want)
		}
	}
}

// sortedLines ignores the order of elements, which the fake keeps as added.
func sortedLines(s string) string {
	lines := strings.Split(s, "\n")
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

func TestApplyFirstSyncMatchesRender(t *testing.T) {
	e := newApplyEnv(t)
	snap := featureSnapshot()
	e.sync(snap, dataplane.SyncRequest{Full: true})
	e.checkKernel(snap)
}

func TestApplyIncrementalSendsOnlyChanges(t *testing.T) {
	e := newApplyEnv(t)
	snap := featureSnapshot()
	e.sync(snap, dataplane.SyncRequest{Full: true})

	// One Service gets a new endpoint: a new pointer for its port only.
	next := featureSnapshot()
	for _, fs := range []*model.FamilySnapshot{next.V4, next.V6} {
		for i, sp := range fs.Ports {
			if old := snap.Family(fs.Family).Port(sp.ID); old != nil && sp.ID.Name != "cluster" {
				fs.Ports[i] = old
			}
		}
	}
	cl := dptest.Svc("ns", "cluster", "198.19.0.10", 80, dptest.WithEPs(dptest.EP("198.18.65.10", 8080, false), dptest.EP("198.18.65.11", 8080, false), dptest.EP("198.18.65.12", 8080, false)))
	for i, sp := range next.V4.Ports {
		if sp.ID == cl.ID {
			next.V4.Ports[i] = cl
		}
	}
	e.sync(next, dataplane.SyncRequest{Changed: nil})
	tx := e.k.lastTx(model.IPv4)
	if n := strings.Count(tx, "\n"); n > 8 {
		t.Errorf("incremental transaction has %d operations, want a handful:\n%s", n, tx)
	}
	// Same endpoint count: only elements of the endpoint-ranges map change.
	for _, want := range []string{"delete element ip kube-proxy endpoint-ranges-", "add element ip kube-proxy endpoint-ranges-", "198.18.65.12 . 8080"} {
		if !strings.Contains(tx, want) {
			t.Errorf("transaction lacks %q:\n%s", want, tx)
		}
	}
	if strings.Contains(tx, "etplocal") || strings.Contains(tx, "add table") || strings.Contains(tx, "chain") {
		t.Errorf("transaction touches more than the changed Service:\n%s", tx)
	}
	// The old chain is deleted once it has been unreferenced long enough.
	e.clock.Step(2 * time.Second)
	e.sync(next, dataplane.SyncRequest{})
	e.checkKernel(next)

	// A different endpoint count, none at all, and one again: still
	// elements only (the block is split anew; with none the port is in
	// the reject set), never a chain, a rule or a goto element.
	for _, step := range []struct {
		eps  []*model.Endpoint
		want []string
	}{
		{[]*model.Endpoint{dptest.EP("198.18.65.10", 8080, false), dptest.EP("198.18.65.11", 8080, false)}, []string{"524288-1048575 : 198.18.65.11 . 8080"}},
		{nil, []string{"add element ip kube-proxy services-no-endpoints { 198.19.0.10 . tcp . 80 }"}},
		{[]*model.Endpoint{dptest.EP("198.18.65.13", 8080, false)}, []string{"delete element ip kube-proxy services-no-endpoints", "198.18.65.13 . 8080"}},
	} {
		svc := dptest.Svc("ns", "cluster", "198.19.0.10", 80, dptest.WithEPs(step.eps...))
		for i, sp := range next.V4.Ports {
			if sp.ID == svc.ID {
				next.V4.Ports[i] = svc
			}
		}
		e.sync(next, dataplane.SyncRequest{Changed: map[objects.Key]struct{}{svc.ID.Service(): {}}})
		tx := e.k.lastTx(model.IPv4)
		for _, want := range step.want {
			if !strings.Contains(tx, want) {
				t.Errorf("%d endpoints: transaction lacks %q:\n%s", len(step.eps), want, tx)
			}
		}
		if strings.Contains(tx, "chain") || strings.Contains(tx, "rule") || strings.Contains(tx, "goto") {
			t.Errorf("%d endpoints: transaction touches chains, rules or verdicts:\n%s", len(step.eps), tx)
		}
		e.checkKernel(next)
	}
	e.clock.Step(2 * time.Second)
	e.sync(next, dataplane.SyncRequest{Changed: map[objects.Key]struct{}{}})
	e.checkKernel(next)

	// A Service removed, then a no-op sync sends nothing.
	gone := dptest.Snapshot(next.V4.Ports[1:]...)
	gone.V6 = next.V6
	e.sync(gone, dataplane.SyncRequest{})
	e.clock.Step(2 * time.Second)
	before := e.k.lastTx(model.IPv4)
	e.sync(gone, dataplane.SyncRequest{})
	e.checkKernel(gone)
	e.sync(gone, dataplane.SyncRequest{})
	if after := e.k.lastTx(model.IPv4); after != before && !strings.HasPrefix(after, "delete chain") {
		t.Errorf("no-op sync sent a transaction:\n%s", after)
	}
}

func TestApplyRestartReusesTable(t *testing.T) {
	e := newApplyEnv(t)
	snap := featureSnapshot()
	e.sync(snap, dataplane.SyncRequest{Full: true})
	e.restart()
	e.sync(snap, dataplane.SyncRequest{Full: true})
	tx := e.k.lastTx(model.IPv4)
	if strings.Contains(tx, "svc-") || strings.Contains(tx, "add element ip kube-proxy service-ips") || strings.Contains(tx, "delete") {
		t.Errorf("restart rewrote Service state instead of reusing it:\n%s", tx)
	}
	e.checkKernel(snap)
}

// TestApplyRestartCountsChanges: LastSyncOps after a restart counts what
// the fixed chains and configured sets take, whatever the number of
// Services; a cold sync counts every port's rules and elements too.
func TestApplyRestartCountsChanges(t *testing.T) {
	e := newApplyEnv(t)
	e.sync(scaleSnapshot(10, 2), dataplane.SyncRequest{Full: true})
	e.restart()
	e.sync(scaleSnapshot(10, 2), dataplane.SyncRequest{Full: true})
	small := e.p.LastSyncOps()

	e = newApplyEnv(t)
	snap := scaleSnapshot(300, 5)
	e.sync(snap, dataplane.SyncRequest{Full: true})
	cold := e.p.LastSyncOps()
	e.restart()
	e.sync(snap, dataplane.SyncRequest{Full: true})
	if restart := e.p.LastSyncOps(); restart != small || cold < 300*5 {
		t.Errorf("restart at 300 Services wrote %d changes, at 10 %d (want the same); cold %d", restart, small, cold)
	}
}

func TestApplyRestartRemovesLeftovers(t *testing.T) {
	e := newApplyEnv(t)
	e.sync(featureSnapshot(), dataplane.SyncRequest{Full: true})
	e.restart()
	small := dptest.Snapshot(dptest.Svc("ns", "one", "198.19.0.30", 80, dptest.WithEPs(dptest.EP("198.18.65.10", 8080, false))))
	e.sync(small, dataplane.SyncRequest{Full: true})
	e.clock.Step(2 * time.Second)
	e.sync(small, dataplane.SyncRequest{})
	e.checkKernel(small)
}

// TestApplyRestartRemovesOldAffinitySets: older versions made one affinity
// set per endpoint; after an upgrade they and the chains using them go.
func TestApplyRestartRemovesOldAffinitySets(t *testing.T) {
	e := newApplyEnv(t)
	snap := featureSnapshot()
	e.sync(snap, dataplane.SyncRequest{Full: true})
	const oldSet, oldChain = "aff-OLD-ns/a/tcp/p/198.18.65.10/8080", "svc-OLD-ns/a/tcp/p"
	e.k.run(t, model.IPv4, func(tx *knftables.Transaction) {
		tx.Add(&knftables.Set{Name: oldSet, Type: "ipv4_addr", Flags: []knftables.SetFlag{knftables.DynamicFlag, knftables.TimeoutFlag}})
		tx.Add(&knftables.Chain{Name: oldChain})
		tx.Add(&knftables.Rule{Chain: oldChain, Rule: "ip saddr @" + oldSet + " meta l4proto tcp update @" + oldSet + " { ip saddr } dnat to 198.18.65.10:8080"})
	})
	e.restart()
	e.sync(snap, dataplane.SyncRequest{Full: true})
	e.clock.Step(2 * time.Second)
	e.sync(snap, dataplane.SyncRequest{})
	e.checkKernel(snap)
}

func TestApplyDriftRepair(t *testing.T) {
	snap := featureSnapshot()
	flushTargets := map[string]bool{}
	breakages := map[string]func(tx *knftables.Transaction){
		"table deleted":      func(tx *knftables.Transaction) { tx.Delete(&knftables.Table{}) },
		"base chain deleted": func(tx *knftables.Transaction) { tx.Delete(&knftables.Chain{Name: chainNATPrerouting}) },
		"services flushed":   func(tx *knftables.Transaction) { tx.Flush(&knftables.Chain{Name: chainServices}) },
		"table flushed": func(tx *knftables.Transaction) {
			for _, bc := range baseChains {
				tx.Flush(&knftables.Chain{Name: bc.name})
			}
			tx.Flush(&knftables.Chain{Name: chainServices})
			for name := range flushTargets {
				tx.Flush(&knftables.Chain{Name: name})
			}
		},
	}
	for name, breakIt := range breakages {
		t.Run(name, func(t *testing.T) {
			e := newApplyEnv(t)
			e.sync(snap, dataplane.SyncRequest{Full: true})
			names, _ := e.k.fake(model.IPv4).List(context.Background(), "chain")
			for _, n := range names {
				flushTargets[n] = isPortObject(n)
			}
			if d, err := e.p.Drifted(context.Background()); err != nil || d {
				t.Fatalf("Drifted before any change = %v, %v", d, err)
			}
			e.k.run(t, model.IPv4, breakIt)
			d, err := e.p.Drifted(context.Background())
			if err != nil || !d {
				t.Fatalf("Drifted after %s = %v, %v; want true", name, d, err)
			}
			e.sync(snap, dataplane.SyncRequest{Full: true})
			e.checkKernel(snap)
			if d, _ := e.p.Drifted(context.Background()); d {
				t.Fatal("still drifted after the repair")
			}
		})
	}
}

// failingNFT fails every transaction while fail is set.
type failingNFT struct {
	knftables.Interface
	fail bool
}

func (f *failingNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	if f.fail {
		return failErr{}
	}
	return f.Interface.Run(ctx, tx)
}

type failErr struct{}

func (failErr) Error() string { return "injected failure" }

func TestApplyFailureForcesFullResync(t *testing.T) {
	fake := knftables.NewFake(knftables.IPv4Family, DefaultTableName)
	f := &failingNFT{Interface: fake}
	p, _ := New(dptest.Config(), WithNFT(func(knftables.Family, string) (knftables.Interface, error) { return f, nil }))
	snap := featureSnapshot()
	if err := p.Sync(context.Background(), snap, dataplane.SyncRequest{Full: true}); err != nil {
		t.Fatal(err)
	}
	f.fail = true
	next := dptest.Snapshot(dptest.Svc("ns", "one", "198.19.0.30", 80, dptest.WithEPs(dptest.EP("198.18.65.10", 8080, false))))
	if err := p.Sync(context.Background(), next, dataplane.SyncRequest{}); err == nil {
		t.Fatal("Sync succeeded despite the failing kernel")
	}
	f.fail = false
	if err := p.Sync(context.Background(), next, dataplane.SyncRequest{}); err != nil {
		t.Fatal(err)
	}
	if tx := fake.LastTransaction.String(); !strings.Contains(tx, "add table") || strings.Contains(tx, "delete table") {
		t.Errorf("the sync after a failed incremental one was not a full one that keeps the table:\n%s", tx)
	}
	// A failed full sync: the next one replaces the table, once.
	f.fail = true
	if err := p.Sync(context.Background(), snap, dataplane.SyncRequest{Full: true}); err == nil {
		t.Fatal("Sync succeeded despite the failing kernel")
	}
	f.fail = false
	for i, replace := range []bool{true, false} {
		if err := p.Sync(context.Background(), snap, dataplane.SyncRequest{Full: true}); err != nil {
			t.Fatal(err)
		}
		if tx := fake.LastTransaction.String(); strings.Contains(tx, "delete table") != replace {
			t.Errorf("full sync %d after a failed full sync: replaced the table = %v, want %v:\n%s", i, !replace, replace, tx)
		}
	}
	if dump := fake.Dump(); !strings.Contains(dump, "ns/one") && !strings.Contains(dump, "svc-") {
		t.Errorf("table after the replacement:\n%s", dump)
	}
}

// TestTakesOverUpstreamTable: upstream kube-proxy's nftables table (its
// per-Service chains referenced from service-ips, its no-endpoint maps, a
// nodeport-ips set of another definition) is replaced by the first sync in
// one transaction, and the result is exactly what a fresh table holds.
func TestTakesOverUpstreamTable(t *testing.T) {
	e := newApplyEnv(t)
	up, _ := e.k.open(knftables.IPv4Family, DefaultTableName)
	upstream := `add table ip kube-proxy { comment "rules for kube-proxy" ; }
add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }
add chain ip kube-proxy services
add chain ip kube-proxy service-ULMVA6XW-ns/a/tcp/p80
add chain ip kube-proxy endpoint-5OJB2KTY-ns/a/tcp/p80__198.18.65.10/80
add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; }
add map ip kube-proxy no-endpoint-services { type ipv4_addr . inet_proto . inet_service : verdict ; }
add set ip kube-proxy nodeport-ips { type ipv4_addr ; }
add rule ip kube-proxy nat-prerouting jump services
add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips
add rule ip kube-proxy service-ULMVA6XW-ns/a/tcp/p80 goto endpoint-5OJB2KTY-ns/a/tcp/p80__198.18.65.10/80
add rule ip kube-proxy endpoint-5OJB2KTY-ns/a/tcp/p80__198.18.65.10/80 meta l4proto tcp dnat to 198.18.65.10:80
add element ip kube-proxy service-ips { 198.19.0.1 . tcp . 80 : goto service-ULMVA6XW-ns/a/tcp/p80 }
`
	if err := up.(*knftables.Fake).ParseDump(upstream); err != nil {
		t.Fatal(err)
	}
	e.sync(featureSnapshot(), dataplane.SyncRequest{Full: true})
	if tx := e.k.lastTx(model.IPv4); !strings.Contains(tx, "delete table ip kube-proxy") {
		t.Errorf("upstream's table was not replaced:\n%s", tx)
	}
	e.checkKernel(featureSnapshot())
}

func TestCleanupRemovesTables(t *testing.T) {
	e := newApplyEnv(t)
	e.sync(featureSnapshot(), dataplane.SyncRequest{Full: true})
	if err := e.p.Cleanup(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, f := range e.cfg.Families {
		if dump := e.k.fake(f).Dump(); dump != "" {
			t.Errorf("%s table left after Cleanup:\n%s", f, dump)
		}
	}
	if err := e.p.Cleanup(context.Background()); err != nil {
		t.Errorf("second Cleanup: %v", err)
	}
}

// TestSyncRemovesOlderKproxyTables: the table older kproxy versions
// programmed goes once the first sync has put kproxy's own in place.
func TestSyncRemovesOlderKproxyTables(t *testing.T) {
	e := newApplyEnv(t)
	up, _ := e.k.open(knftables.IPv4Family, legacyTable)
	tx := up.NewTransaction()
	tx.Add(&knftables.Table{})
	tx.Add(&knftables.Chain{Name: "nat-prerouting"})
	if err := up.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	e.sync(featureSnapshot(), dataplane.SyncRequest{Full: true})
	if dump := up.(*knftables.Fake).Dump(); dump != "" {
		t.Errorf("older kproxy table left after the first sync:\n%s", dump)
	}
	e.checkKernel(featureSnapshot())
}

// TestApplySetServiceCIDRs: a change of the service ranges lands with the
// next incremental sync as a rewrite of the service-cidrs set only.
func TestApplySetServiceCIDRs(t *testing.T) {
	e := newApplyEnv(t)
	snap := featureSnapshot()
	e.sync(snap, dataplane.SyncRequest{Full: true})
	steps := []struct {
		cidrs []netip.Prefix
		want  []string // elements of the v4 set
	}{
		{[]netip.Prefix{netip.MustParsePrefix("198.19.0.0/24"), netip.MustParsePrefix("fd00:19::/112")}, []string{"198.19.0.0/24"}},
		{[]netip.Prefix{netip.MustParsePrefix("198.19.0.0/24"), netip.MustParsePrefix("198.19.8.0/24")}, []string{"198.19.0.0/24", "198.19.8.0/24"}},
		{nil, nil},
	}
	for i, s := range steps {
		e.p.SetServiceCIDRs(s.cidrs)
		e.cfg.ServiceCIDRs = s.cidrs
		e.sync(snap, dataplane.SyncRequest{Changed: map[objects.Key]struct{}{}})
		tx := e.k.lastTx(model.IPv4)
		if !strings.Contains(tx, "flush set ip kube-proxy service-cidrs") || strings.Contains(tx, "chain") || strings.Contains(tx, "service-ips") {
			t.Errorf("step %d: transaction is not a rewrite of the service-cidrs set:\n%s", i, tx)
		}
		for _, w := range s.want {
			if !strings.Contains(tx, "add element ip kube-proxy service-cidrs { "+w+" }") {
				t.Errorf("step %d: transaction lacks %s:\n%s", i, w, tx)
			}
		}
		e.checkKernel(snap)
		before := e.k.lastTx(model.IPv4)
		e.sync(snap, dataplane.SyncRequest{Changed: map[objects.Key]struct{}{}})
		if after := e.k.lastTx(model.IPv4); after != before {
			t.Errorf("step %d: an unchanged sync sent a transaction:\n%s", i, after)
		}
	}
	// A restart with the ranges in Config reuses the table and keeps them.
	e.cfg.ServiceCIDRs = steps[0].cidrs
	e.restart()
	e.sync(snap, dataplane.SyncRequest{Full: true})
	e.checkKernel(snap)
}

// TestApplySuspectRepair: what the monitor reports (a flushed Service
// chain, a flushed map) is repaired by the next full sync, which rewrites
// only the named port chains.
func TestApplySuspectRepair(t *testing.T) {
	snap := featureSnapshot()
	e := newApplyEnv(t)
	e.sync(snap, dataplane.SyncRequest{Full: true})
	var svcChain string
	names, _ := e.k.fake(model.IPv4).List(context.Background(), "chain")
	for _, n := range names {
		if strings.HasPrefix(n, "svc-") && strings.Contains(n, "ns/cluster/") {
			svcChain = n
		}
	}
	e.k.run(t, model.IPv4, func(tx *knftables.Transaction) {
		tx.Flush(&knftables.Chain{Name: svcChain})
		tx.Flush(&knftables.Map{Name: mapServiceIPs})
	})
	e.p.fams[model.IPv4].suspect(map[string]bool{svcChain: true, mapServiceIPs: true})
	e.sync(snap, dataplane.SyncRequest{Full: true})
	e.checkKernel(snap)
	tx := e.k.lastTx(model.IPv4)
	if strings.Count(tx, "flush chain ip kube-proxy svc-") != 1 || !strings.Contains(tx, "add element ip kube-proxy service-ips") {
		t.Errorf("repair did not rewrite exactly the flushed chain and refill the map:\n%s", tx)
	}
	if st := e.p.fams[model.IPv4]; st.suspects != nil || st.distrust {
		t.Error("suspects kept after the repair")
	}
}

// TestApplyFullSyncReleasesBlocks: blocks of ports that are gone, or that
// no longer have a policy chain, go back to the allocator at a full sync
// and after a restart (which reserves blocks from every chain it finds,
// stale ones included), so the fixed number of blocks per map never leaks.
func TestApplyFullSyncReleasesBlocks(t *testing.T) {
	e := newApplyEnv(t)
	ep := dptest.EP("198.18.65.10", 8080, false)
	a := dptest.Svc("ns", "a", "198.19.0.10", 80, dptest.WithITPLocal, dptest.WithEPs(ep))
	b := dptest.Svc("ns", "b", "198.19.0.11", 80, dptest.WithEPs(ep))
	e.sync(dptest.Snapshot(a, b), dataplane.SyncRequest{Full: true})
	owners := func() []string {
		return slices.Sorted(maps.Keys(e.p.fams[model.IPv4].slots.owner))
	}
	if got := owners(); !slices.Equal(got, []string{"loc ns/a/tcp/p", "svc ns/b/tcp/p"}) {
		t.Fatalf("blocks after the first sync: %q", got)
	}
	// ns/a switches to the Cluster policy, ns/b is deleted: a full sync
	// without a kernel read (as the hourly one is).
	a2 := dptest.Svc("ns", "a", "198.19.0.10", 80, dptest.WithEPs(ep))
	e.sync(dptest.Snapshot(a2), dataplane.SyncRequest{Full: true})
	if got := owners(); !slices.Equal(got, []string{"svc ns/a/tcp/p"}) {
		t.Errorf("blocks after a full sync: %q, want only svc ns/a/tcp/p", got)
	}
	// A restart while the old chains still wait for deletion.
	e.restart()
	e.sync(dptest.Snapshot(a2), dataplane.SyncRequest{Full: true})
	if got := owners(); !slices.Equal(got, []string{"svc ns/a/tcp/p"}) {
		t.Errorf("blocks after a restart: %q, want only svc ns/a/tcp/p", got)
	}
	e.clock.Step(2 * time.Second)
	e.sync(dptest.Snapshot(a2), dataplane.SyncRequest{})
	e.checkKernel(dptest.Snapshot(a2))
}

// TestRenderFullMapFallsBackToRules: a port whose endpoint-ranges map has
// no block left still gets a uniform choice, from plain rules.
func TestRenderFullMapFallsBackToRules(t *testing.T) {
	snap := dptest.Snapshot(dptest.Svc("ns", "web", "198.19.0.10", 80,
		dptest.WithEPs(dptest.EP("198.18.65.10", 8080, false), dptest.EP("198.18.65.11", 8080, false))))
	r := newRenderer(dptest.Config(), model.IPv4, snap.Node)
	r.slots = newSlotAlloc()
	r.slots.next[shardOf("svc ns/web/tcp/p", "tcp")] = blocksPerShard
	d := r.fixed()
	sp := snap.V4.Ports[0]
	d.Ports[sp.ID] = r.port(sp)
	if len(r.full) != 1 || len(d.Ports[sp.ID].Fills) != 0 {
		t.Fatalf("full = %q, blocks = %v", r.full, d.Ports[sp.ID].Fills)
	}
	tr := newTracer(t, d, dptest.NodeIP)
	got := tr.trace(dptest.Packet{Src: netip.MustParseAddr("198.18.200.5"), Dst: sp.ClusterIP, DPort: 80, Proto: "tcp", Iif: "eth0"})
	if len(got.DNAT) != 2 {
		t.Errorf("trace = %+v, want both endpoints reachable", got)
	}
}

// wantText is every element the last render wants, per set, in text form
// (key -> value): want's and the blocks' of the endpoint-ranges maps.
func (st *famState) wantText() map[string]map[string]string {
	out := map[string]map[string]string{}
	put := func(e element) {
		if out[e.Set] == nil {
			out[e.Set] = map[string]string{}
		}
		out[e.Set][e.Key] = e.Value
	}
	for _, m := range st.want {
		for _, r := range m {
			put(*r.e)
		}
	}
	for k := range st.hairpins {
		put(k.element())
	}
	if st.cur != nil {
		for _, ps := range st.cur.Ports {
			for i := range ps.Fills {
				for j := range ps.Fills[i].elems {
					put(ps.Fills[i].element(j))
				}
			}
		}
	}
	return out
}

// TestApplySharedHairpinAndBlocks steps Services that share local
// endpoints (one hairpin element, counted per port) through incremental
// and full syncs, with a restart between: after each, the table is
// exactly the rendering, and the hairpin element goes only with the last
// port that has its endpoint.
func TestApplySharedHairpinAndBlocks(t *testing.T) {
	e := newApplyEnv(t)
	e.cfg.Families = []model.Family{model.IPv4}
	e.restart()
	local := func(ip string) *model.Endpoint { return dptest.EP(ip, 8080, true) }
	svc := func(name, ip string, eps ...*model.Endpoint) *model.ServicePort {
		return dptest.Svc("ns", name, ip, 80, dptest.WithEPs(eps...))
	}
	a := svc("a", "198.19.0.1", local("198.18.64.10"), local("198.18.64.11"))
	b := svc("b", "198.19.0.2", local("198.18.64.10"), dptest.EP("198.18.65.10", 8080, false))
	c := svc("c", "198.19.0.3", local("198.18.64.12"))
	steps := []struct {
		name  string
		snap  *model.Snapshot
		req   dataplane.SyncRequest
		has   []string // in the step's transaction
		hasnt []string
	}{
		{"first", dptest.Snapshot(a, b, c), dataplane.SyncRequest{Full: true},
			[]string{"198.18.64.10 . 198.18.64.10 . tcp . 8080", "198.18.64.11 . 198.18.64.11"}, nil},
		{"a goes, its shared endpoint stays", dptest.Snapshot(b, c), dataplane.SyncRequest{},
			[]string{"delete element ip kube-proxy hairpin-connections { 198.18.64.11 . 198.18.64.11"},
			[]string{"198.18.64.10 . 198.18.64.10"}},
		{"b loses it", dptest.Snapshot(svc("b", "198.19.0.2", dptest.EP("198.18.65.10", 8080, false)), c), dataplane.SyncRequest{},
			[]string{"delete element ip kube-proxy hairpin-connections { 198.18.64.10 . 198.18.64.10"}, nil},
		{"full resync, a back", dptest.Snapshot(a, svc("b", "198.19.0.2", dptest.EP("198.18.65.10", 8080, false)), c), dataplane.SyncRequest{Full: true},
			[]string{"add element ip kube-proxy hairpin-connections { 198.18.64.10 . 198.18.64.10"}, nil},
		{"c's endpoint count changes", dptest.Snapshot(a, svc("b", "198.19.0.2", dptest.EP("198.18.65.10", 8080, false)),
			svc("c", "198.19.0.3", local("198.18.64.12"), local("198.18.64.13"), local("198.18.64.14"))), dataplane.SyncRequest{},
			[]string{"0-349524 : 198.18.64.12 . 8080", "delete element ip kube-proxy endpoint-ranges-tcp-"}, nil},
	}
	for i, s := range steps {
		if i == 3 {
			e.restart() // the full sync reads the kernel back
		}
		e.sync(s.snap, s.req)
		tx := e.k.lastTx(model.IPv4)
		for _, want := range s.has {
			if !strings.Contains(tx, want) {
				t.Errorf("%s: transaction lacks %q:\n%s", s.name, want, tx)
			}
		}
		for _, not := range s.hasnt {
			if strings.Contains(tx, not) {
				t.Errorf("%s: transaction has %q:\n%s", s.name, not, tx)
			}
		}
		// Unreferenced chains and maps go a while later.
		e.clock.Step(2 * time.Second)
		e.sync(s.snap, dataplane.SyncRequest{Changed: map[objects.Key]struct{}{}})
		e.checkKernel(s.snap)
	}
}

// TestApplyAffinitySweep: when an endpoint of a ClientIP-affinity Service
// goes, its clients' affinity elements go with it (an endpoint back within
// the timeout must not get them back); a full sync also deletes elements
// whose id no port has (left by endpoints that went while kproxy was down).
func TestApplyAffinitySweep(t *testing.T) {
	e := newApplyEnv(t)
	e1, e2 := dptest.EP("198.18.65.10", 8080, false), dptest.EP("198.18.65.11", 8080, false)
	aff := func(eps ...*model.Endpoint) *model.Snapshot {
		return dptest.Snapshot(dptest.Svc("ns", "aff", "198.19.0.40", 80, dptest.WithAffinity(30), dptest.WithEPs(eps...)))
	}
	snap := aff(e1, e2)
	e.sync(snap, dataplane.SyncRequest{Full: true})
	st := e.p.fams[model.IPv4]
	id := snap.V4.Ports[0].ID
	ids := st.cur.Ports[id].Affinity
	if len(ids) != 2 {
		t.Fatalf("affinity ids %v, want two", ids)
	}
	elem := func(client string, id uint32) []string { return []string{client, fmt.Sprintf("0x%08x", id)} }
	e.k.run(t, model.IPv4, func(tx *knftables.Transaction) {
		for _, k := range [][]string{elem("198.18.0.1", ids[0]), elem("198.18.0.2", ids[1]), elem("198.18.0.3", 0xdeadbeef)} {
			tx.Add(&knftables.Element{Set: setAffinity, Key: k})
		}
	})
	clients := func() []string {
		els, err := e.k.fake(model.IPv4).ListElements(context.Background(), "set", setAffinity)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, el := range els {
			out = append(out, strings.Join(el.Key, fieldSep))
		}
		slices.Sort(out)
		return out
	}
	idOf := func(ep *model.Endpoint) uint32 {
		h := fnv.New32a()
		h.Write([]byte("ns/aff/tcp/p/" + epName(ep)))
		return h.Sum32()
	}
	gone, kept := elem("198.18.0.1", idOf(e1)), elem("198.18.0.2", idOf(e2))
	if !slices.Contains(ids, idOf(e1)) || !slices.Contains(ids, idOf(e2)) {
		t.Fatalf("affinity ids %v are not the endpoints' (%#x, %#x)", ids, idOf(e1), idOf(e2))
	}
	stranger := strings.Join(elem("198.18.0.3", 0xdeadbeef), fieldSep)

	// e1 goes: its client's element goes; the others stay.
	snap = aff(e2)
	e.sync(snap, dataplane.SyncRequest{Changed: map[objects.Key]struct{}{id.Service(): {}}})
	if got, want := clients(), []string{strings.Join(kept, fieldSep), stranger}; !slices.Equal(got, want) {
		t.Errorf("after e1 left: affinity elements %q, want %q (gone: %q)", got, want, gone)
	}
	// A full sync (a restart) deletes the element no port's id names.
	e.restart()
	e.sync(snap, dataplane.SyncRequest{Full: true})
	if got, want := clients(), []string{strings.Join(kept, fieldSep)}; !slices.Equal(got, want) {
		t.Errorf("after a full sync: affinity elements %q, want %q", got, want)
	}
	// An id noted gone that a port has again (its endpoint came back
	// before a failed sync or sweep was redone) is not swept.
	e.p.fams[model.IPv4].affinityGone = map[uint32]bool{idOf(e2): true}
	e.sync(snap, dataplane.SyncRequest{Changed: map[objects.Key]struct{}{id.Service(): {}}})
	if got, want := clients(), []string{strings.Join(kept, fieldSep)}; !slices.Equal(got, want) {
		t.Errorf("after a live id was noted gone: affinity elements %q, want %q", got, want)
	}
	// The Service goes: every element of its ids goes.
	e.sync(dptest.Snapshot(), dataplane.SyncRequest{Changed: map[objects.Key]struct{}{id.Service(): {}}})
	if got := clients(); len(got) != 0 {
		t.Errorf("after the Service left: affinity elements %q, want none", got)
	}
}

// TestLastSyncFull: a Node change or a failed sync before makes a sync
// full without the request asking, and LastSyncFull says so.
func TestLastSyncFull(t *testing.T) {
	e := newApplyEnv(t)
	snap := featureSnapshot()
	for _, step := range []struct {
		req  dataplane.SyncRequest
		want bool
	}{
		{dataplane.SyncRequest{}, true}, // the first
		{dataplane.SyncRequest{}, false},
		{dataplane.SyncRequest{NodeChanged: true}, true},
		{dataplane.SyncRequest{Full: true}, true},
		{dataplane.SyncRequest{}, false},
	} {
		e.sync(snap, step.req)
		if got := e.p.LastSyncFull(); got != step.want {
			t.Errorf("after %+v: LastSyncFull %v, want %v", step.req, got, step.want)
		}
	}
}

// deleteFailingNFT fails the transactions that delete a chain while fail
// is set: the stale deletion's.
type deleteFailingNFT struct {
	knftables.Interface
	fail bool
}

func (f *deleteFailingNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	if f.fail && strings.Contains(tx.String(), "delete chain") {
		return failErr{}
	}
	return f.Interface.Run(ctx, tx)
}

// TestCleanupFailureReported: a failed deletion of stale chains does not
// fail the sync but is reported for its family (upstream's
// kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total), and only
// for the sync in which it failed.
func TestCleanupFailureReported(t *testing.T) {
	k := newFakeKernel()
	fake := k.fake(model.IPv4)
	f := &deleteFailingNFT{Interface: fake}
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	cfg := dptest.Config()
	cfg.Families = []model.Family{model.IPv4}
	p, _ := New(cfg, WithNFT(func(fam knftables.Family, table string) (knftables.Interface, error) {
		if fam == knftables.IPv4Family && table == DefaultTableName {
			return f, nil
		}
		return k.open(fam, table)
	}), WithClock(clk))
	ctx := context.Background()
	one := dptest.Snapshot(dptest.Svc("ns", "one", "198.19.0.30", 80, dptest.WithEPs(dptest.EP("198.18.65.10", 8080, false))))
	if err := p.Sync(ctx, one, dataplane.SyncRequest{Full: true}); err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		fail bool
		want []model.Family
	}{
		{false, nil}, // the port's chains become stale
		{true, []model.Family{model.IPv4}},
		{false, nil},
	} {
		f.fail = step.fail
		if err := p.Sync(ctx, dptest.Snapshot(), dataplane.SyncRequest{Changed: map[objects.Key]struct{}{{Namespace: "ns", Name: "one"}: {}}}); err != nil {
			t.Fatalf("Sync (stale deletion failing: %v): %v", step.fail, err)
		}
		if got := p.LastSyncCleanupFailed(); !slices.Equal(got, step.want) {
			t.Errorf("stale deletion failing %v: LastSyncCleanupFailed %v, want %v", step.fail, got, step.want)
		}
		clk.Step(2 * staleDelay)
	}
	if strings.Contains(fake.Dump(), "chain ip kube-proxy svc-") {
		t.Errorf("the stale chains were not deleted after the failure:\n%s", fake.Dump())
	}
}
