package nftables

import (
	"context"
	"errors"
	"math/bits"
	"net"
	"net/netip"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/dataplane/dptest"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/objects"
)

// labPrefix names the namespaces of this package's labs (see dptest.NewLab).
const labPrefix = "kpxnft"

// testNet is a dptest lab for the nftables proxier, which programs the
// kernel over netlink from the namespace of its thread: sync runs it in
// the node namespace.
type testNet struct {
	*dptest.Lab
	t testing.TB
}

func newTestNet(t testing.TB) *testNet { return &testNet{Lab: dptest.NewLab(t, labPrefix), t: t} }

// get connects from the client namespace and returns what the server says.
func (n *testNet) get(addr string) (string, error) { return n.Get(addr, 2*time.Second) }

func (n *testNet) sync(p *Proxier, snap *model.Snapshot, req dataplane.SyncRequest) {
	n.t.Helper()
	var err error
	n.In(n.Node, func() { err = p.Sync(context.Background(), snap, req) })
	if err != nil {
		n.t.Fatal(err)
	}
}

func privConfig() dataplane.Config {
	return dataplane.Config{Families: []model.Family{model.IPv4}, MasqueradeBit: 14,
		LocalMode: dataplane.LocalClusterCIDR, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("198.18.64.0/18")}}
}

func TestPrivilegedClusterIPTraffic(t *testing.T) {
	n := newTestNet(t)
	n.Serve("198.18.64.10:8080", "pod-8080")
	n.Serve("198.18.64.10:8081", "pod-8081")
	svcOn := func(port uint16) *model.Snapshot {
		return dptest.Snapshot(dptest.Svc("ns", "web", "198.19.0.10", 80, dptest.WithEPs(dptest.EP("198.18.64.10", port, true))))
	}
	expect := func(step, want string) {
		t.Helper()
		got, err := n.get("198.19.0.10:80")
		if err != nil || got != want {
			t.Fatalf("%s: got %q, %v; want %q", step, got, err, want)
		}
	}
	dptest.Run(t, "ip", "netns", "exec", n.Node, "nft", "add", "table", "ip", legacyTable)
	p, _ := New(privConfig())
	n.sync(p, svcOn(8080), dataplane.SyncRequest{Full: true})
	expect("first sync", "pod-8080")
	if out, _ := exec.Command("ip", "netns", "exec", n.Node, "nft", "list", "tables").CombinedOutput(); strings.Contains(string(out), " "+legacyTable+"\n") {
		t.Errorf("older kproxy table left after the first sync: %s", out)
	}

	n.sync(p, svcOn(8081), dataplane.SyncRequest{})
	expect("endpoint change", "pod-8081")

	// A restarted proxy reads the table and needs no element changes.
	p2, _ := New(privConfig())
	n.sync(p2, svcOn(8081), dataplane.SyncRequest{Full: true})
	expect("restart", "pod-8081")
	st := p2.fams[model.IPv4]
	want := st.wantText()
	n.In(n.Node, func() {
		if err := st.readKernel(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
	for name, elems := range want {
		for k, v := range elems {
			if got, ok := st.readText(name)[k]; !ok || got != v {
				t.Errorf("kernel element %s %q reads back as %q (present %v), rendered %q", name, k, got, ok, v)
			}
		}
	}

	// Someone flushes the table: Drifted notices, a full sync repairs it.
	dptest.Run(t, "ip", "netns", "exec", n.Node, "nft", "flush", "table", "ip", DefaultTableName)
	var drifted bool
	var err error
	n.In(n.Node, func() { drifted, err = p2.Drifted(context.Background()) })
	if err != nil || !drifted {
		t.Fatalf("Drifted after flush = %v, %v", drifted, err)
	}
	n.sync(p2, svcOn(8081), dataplane.SyncRequest{Full: true})
	expect("repair", "pod-8081")

	// Someone deletes the table: the same.
	dptest.Run(t, "ip", "netns", "exec", n.Node, "nft", "delete", "table", "ip", DefaultTableName)
	n.In(n.Node, func() { drifted, err = p2.Drifted(context.Background()) })
	if err != nil || !drifted {
		t.Fatalf("Drifted after table deletion = %v, %v", drifted, err)
	}
	n.sync(p2, svcOn(8081), dataplane.SyncRequest{Full: true})
	expect("repair after deletion", "pod-8081")
	n.In(n.Node, func() { drifted, err = p2.Drifted(context.Background()) })
	if err != nil || drifted {
		t.Fatalf("Drifted after repair = %v, %v", drifted, err)
	}

	// Without endpoints the ClusterIP rejects at once.
	n.sync(p2, dptest.Snapshot(dptest.Svc("ns", "web", "198.19.0.10", 80)), dataplane.SyncRequest{})
	start := time.Now()
	_, err = n.get("198.19.0.10:80")
	if !errors.Is(err, syscall.ECONNREFUSED) || time.Since(start) > time.Second {
		t.Fatalf("no endpoints: got %v after %v, want a fast connection refused", err, time.Since(start))
	}

	n.In(n.Node, func() { err = p2.Cleanup(context.Background()) })
	if err != nil {
		t.Fatal(err)
	}
	out, _ := exec.Command("ip", "netns", "exec", n.Node, "nft", "list", "tables").CombinedOutput()
	if strings.Contains(string(out), DefaultTableName) {
		t.Fatalf("tables left after Cleanup: %s", out)
	}
}

// TestPrivilegedServiceCIDRs: new connections to an unallocated address of
// the service ranges are dropped once SetServiceCIDRs names them (applied
// by an incremental sync), while ClusterIPs keep working; clearing the
// ranges lifts the drop. The unallocated address exists in the pod
// namespace, so that without the drop the connection is refused there.
func TestPrivilegedServiceCIDRs(t *testing.T) {
	n := newTestNet(t)
	n.Serve("198.18.64.10:8080", "pod-8080")
	dptest.Run(t, "ip", "-n", n.Pod, "addr", "add", "198.19.0.99/32", "dev", "eth0")
	snap := dptest.Snapshot(dptest.Svc("ns", "web", "198.19.0.10", 80, dptest.WithEPs(dptest.EP("198.18.64.10", 8080, true))))
	p, _ := New(privConfig())
	n.sync(p, snap, dataplane.SyncRequest{Full: true})
	dial := func(addr string) error {
		var err error
		n.In(n.Client, func() {
			var c net.Conn
			if c, err = net.DialTimeout("tcp", addr, 500*time.Millisecond); err == nil {
				c.Close()
			}
		})
		return err
	}
	steps := []struct {
		cidrs   []netip.Prefix
		dropped bool
	}{
		{nil, false},
		{[]netip.Prefix{netip.MustParsePrefix("198.19.0.0/24"), netip.MustParsePrefix("fd00:19::/112")}, true},
		{nil, false},
	}
	for i, s := range steps {
		p.SetServiceCIDRs(s.cidrs)
		n.sync(p, snap, dataplane.SyncRequest{Changed: map[objects.Key]struct{}{}})
		if got, err := n.get("198.19.0.10:80"); err != nil || got != "pod-8080" {
			t.Fatalf("step %d: ClusterIP: got %q, %v", i, got, err)
		}
		err := dial("198.19.0.99:80")
		if refused := errors.Is(err, syscall.ECONNREFUSED); refused == s.dropped || err == nil {
			t.Fatalf("step %d (ranges %v): unallocated service IP gave %v; want dropped=%v", i, s.cidrs, err, s.dropped)
		}
	}
}

// TestPrivilegedFeatureTables loads every feature in both families into a
// real kernel and checks that a restarted proxy reads back exactly what was
// rendered (so a restart sends no element changes).
func TestPrivilegedFeatureTables(t *testing.T) {
	n := newTestNet(t)
	cfg := dptest.Config()
	cfg.Families = []model.Family{model.IPv4, model.IPv6}
	snap := featureSnapshot()
	p, _ := New(cfg)
	n.sync(p, snap, dataplane.SyncRequest{Full: true})
	p2, _ := New(cfg)
	n.sync(p2, snap, dataplane.SyncRequest{Full: true})
	for _, f := range cfg.Families {
		st := p2.fams[f]
		want := st.wantText()
		n.In(n.Node, func() {
			if err := st.readKernel(context.Background()); err != nil {
				t.Fatal(err)
			}
		})
		count := 0
		for name, elems := range want {
			for k, v := range elems {
				count++
				if got, ok := st.readText(name)[k]; !ok || got != v {
					t.Errorf("%s: element %s %q reads back as %q (present %v), rendered %q", f, name, k, got, ok, v)
				}
			}
		}
		if count < 4 {
			t.Errorf("%s: only %d elements rendered", f, count)
		}
		var drifted bool
		var err error
		n.In(n.Node, func() { drifted, err = p2.Drifted(context.Background()) })
		if err != nil || drifted {
			t.Errorf("Drifted on an intact table = %v, %v", drifted, err)
		}
	}
	// Drifted recorded the generation; kproxy's own syncs of both
	// families keep it, so the next Drifted costs one round trip.
	if p2.gen.verified == 0 {
		t.Fatal("Drifted on intact tables did not record the ruleset generation")
	}
	n.sync(p2, dptest.Snapshot(snap.V4.Ports[1:]...), dataplane.SyncRequest{})
	if p2.gen.verified == 0 {
		t.Error("kproxy's own sync made the tables unverified")
	}
	dptest.Run(t, "ip", "netns", "exec", n.Node, "nft", "add", "table", "ip", "someone-else")
	var drifted bool
	n.In(n.Node, func() { drifted, _ = p2.Drifted(context.Background()) })
	if drifted {
		t.Error("another table's creation counted as drift")
	}
}

// TestPrivilegedBatchError sends a batch the kernel rejects and expects
// the error to name the failing message, and nothing of the batch to land.
func TestPrivilegedBatchError(t *testing.T) {
	n := newTestNet(t)
	var err error
	n.In(n.Node, func() {
		b := newNLBatch(2, DefaultTableName, 0)
		b.addTable("")
		if err := b.addChain(&knftables.Chain{Name: "good"}); err != nil {
			t.Fatal(err)
		}
		r := rule{goTo("missing-chain")}
		_ = b.addRule("good", r, r.exprs())
		err = b.send()
	})
	if err == nil || !strings.Contains(err.Error(), "add rule to "+DefaultTableName+"/good") || !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("got %v, want ENOENT naming the rule's message", err)
	}
	if out, _ := exec.Command("ip", "netns", "exec", n.Node, "nft", "list", "tables").CombinedOutput(); strings.Contains(string(out), DefaultTableName) {
		t.Errorf("a rejected batch left a table behind: %s", out)
	}
}

// TestPrivilegedNetlinkEqualsCLI programs the same Services once through
// kproxy's netlink batches (a full sync, then incremental ones) and once by
// feeding the rendered text to `nft -f`, and requires nft to list identical
// tables: same sets, maps, elements, chains and rules.
func TestPrivilegedNetlinkEqualsCLI(t *testing.T) {
	bridge := dptest.Config()
	bridge.LocalMode, bridge.BridgeInterface = dataplane.LocalBridgeInterface, "cbr0"
	prefix := dptest.Config()
	prefix.LocalMode, prefix.InterfacePrefix = dataplane.LocalInterfacePrefix, "veth"
	prefix.NodePortAddresses = []string{"198.18.0.0/15", "primary", "fd00:1::/64"}
	prefix.Families = []model.Family{model.IPv4, model.IPv6}
	dual := dptest.Config()
	dual.Families = []model.Family{model.IPv4, model.IPv6}
	dual.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("198.19.0.0/24"), netip.MustParsePrefix("fd00:19::/112")}
	all := dptest.Config()
	all.MasqueradeAll = true
	all.NodePortAddresses = []string{"198.18.64.0/24"}
	all.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("198.19.0.0/25"), netip.MustParsePrefix("198.19.0.0/16")}
	for name, cfg := range map[string]dataplane.Config{"cluster-cidr": dual, "bridge": bridge, "prefix": prefix, "masquerade-all": all} {
		t.Run(name, func(t *testing.T) {
			full := featureSnapshot()
			var ports []*model.ServicePort
			for _, fs := range []*model.FamilySnapshot{full.V4, full.V6} {
				for _, sp := range fs.Ports {
					// nft 1.0.6 cannot parse source-hash with affinity's
					// `jhash … map @m == ADDR . PORT` (it cannot type the
					// right side); TestPrivilegedBalancing sends traffic
					// through those rules instead.
					if len(sp.SourceRanges) == 0 && (sp.AffinityTimeout == 0 || sp.Balancing != model.BalanceSourceHash) {
						ports = append(ports, sp)
					}
				}
			}
			snap := dptest.Snapshot(ports...)
			snap.Node = full.Node
			viaNetlink, viaCLI := newTestNet(t), newTestNet(t)
			p1, _ := New(cfg)
			viaNetlink.sync(p1, dptest.Snapshot(ports[:2]...), dataplane.SyncRequest{Full: true})
			viaNetlink.sync(p1, snap, dataplane.SyncRequest{})
			for _, f := range cfg.Families {
				if n := p1.fams[f].kern.(*nlKernel).batches; n < 2 {
					t.Fatalf("%s: only %d of 2 syncs went through netlink", f, n)
				}
			}
			affinityRules := map[model.Family]int{}
			for _, f := range cfg.Families {
				var text strings.Builder
				p1.Render(&text, snap)
				rest, n := withoutLines(renderText(render(cfg, snap.Family(f), snap.Node), DefaultTableName), affinityRule)
				affinityRules[f] = n
				cmd := exec.Command("ip", "netns", "exec", viaCLI.Node, "nft", "-f", "-")
				cmd.Stdin = strings.NewReader(rest)
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Fatalf("nft -f: %v\n%s", err, out)
				}
			}
			// The same table loaded cold in stages of a few operations
			// (each a transaction the kernel checks on its own).
			viaStages := newTestNet(t)
			withStages(t, 1, 7)
			p3, _ := New(cfg)
			viaStages.sync(p3, snap, dataplane.SyncRequest{Full: true})
			for _, f := range cfg.Families {
				if n := p3.fams[f].kern.(*nlKernel).batches; n < 2 {
					t.Fatalf("%s: the staged cold sync sent %d batches", f, n)
				}
			}
			for fam, f := range map[string]model.Family{"ip": model.IPv4, "ip6": model.IPv6} {
				a, b := listTable(t, viaNetlink.Node, fam), listTable(t, viaCLI.Node, fam)
				a = checkAffinityRules(t, a, affinityRules[f])
				if len(a) < 200 && fam == "ip" {
					t.Errorf("suspiciously short listing: %q", a)
				}
				t.Logf("%s: %d lines compared", fam, strings.Count(a, "\n"))
				if a != b {
					t.Errorf("%s tables differ:\n--- netlink\n%s\n--- CLI\n%s", fam, a, b)
				}
				if c := checkAffinityRules(t, listTable(t, viaStages.Node, fam), affinityRules[f]); c != b {
					t.Errorf("%s tables differ:\n--- netlink, staged\n%s\n--- CLI\n%s", fam, c, b)
				}
			}
		})
	}
}

// The nft CLI cannot parse the rules of affinity chains: a constant in a
// concatenation on the left of a set lookup (`ip saddr . 0x1234abcd
// @affinity`), and a DNAT to a port with no `meta l4proto` before it (the
// chains are reached only by the protocol's own map entries). Netlink
// carries them fine and nft lists them. The comparison with the CLI leaves
// them out; checkAffinityRules checks how nft lists them.
var affinityRule = regexp.MustCompile(`@affinity `)

// affinityLookup matches the lookups alone: earlier layouts' picks kept
// `meta l4proto`, so the CLI loads them.
var affinityLookup = regexp.MustCompile(`saddr \. 0x[0-9a-f]{8}(?: \[invalid type\])? @affinity `)

// withoutAffinityLookups returns an earlier layout's text without the
// rules the CLI cannot parse.
func withoutAffinityLookups(text string) string {
	rest, _ := withoutLines(text, affinityLookup)
	return rest
}

// withoutLines returns text without the lines re matches, and how many
// there were.
func withoutLines(text string, re *regexp.Regexp) (string, int) {
	var keep []string
	for _, l := range strings.Split(text, "\n") {
		if !re.MatchString(l) {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n"), strings.Count(text, "\n") + 1 - len(keep)
}

// checkAffinityRules checks that nft lists as many affinity rules as
// render wrote (want), each in render's form (`ADDR saddr . 0xID @affinity
// update @affinity { ADDR saddr . 0xID timeout T } dnat to EP`, and the
// picks, `[numgen … mod N 0] update @affinity { … } dnat to EP`), and
// returns the listing without them.
func checkAffinityRules(t *testing.T, listing string, want int) string {
	t.Helper()
	// nft shows the lookup's constant, which has no type for it, as raw
	// big-endian bytes: the same register bytes as the update's mark.
	lookup := regexp.MustCompile(`^ip6? saddr \. (0x[0-9a-f]{8})(?: \[invalid type\])? @affinity update @affinity \{ ip6? saddr \. (0x[0-9a-f]{8}) timeout \S+ \} dnat (ip6? )?to \S+$`)
	pick := regexp.MustCompile(`^(numgen (random|inc) mod [0-9]+ 0 )?update @affinity \{ ip6? saddr \. 0x[0-9a-f]{8} timeout \S+ \} dnat (ip6? )?to \S+$`)
	sameBytes := func(a, b string) bool {
		x, _ := strconv.ParseUint(a, 0, 32)
		y, _ := strconv.ParseUint(b, 0, 32)
		return x == y || bits.ReverseBytes32(uint32(x)) == uint32(y)
	}
	var keep []string
	got := 0
	for _, l := range strings.Split(listing, "\n") {
		if !affinityRule.MatchString(l) {
			keep = append(keep, l)
			continue
		}
		got++
		if m := lookup.FindStringSubmatch(l); m != nil && sameBytes(m[1], m[2]) || pick.MatchString(l) {
			continue
		}
		t.Errorf("nft lists an affinity rule unlike render's: %q", l)
	}
	if got != want {
		t.Errorf("nft lists %d affinity rules, render wrote %d", got, want)
	}
	return strings.Join(keep, "\n")
}

// listTable returns a kproxy table as nft lists it, elements sorted.
func listTable(t *testing.T, ns, fam string) string {
	return listTableNamed(t, ns, fam, DefaultTableName)
}

func listTableNamed(t *testing.T, ns, fam, table string) string {
	out, err := exec.Command("ip", "netns", "exec", ns, "nft", "list", "table", fam, table).CombinedOutput()
	if err != nil {
		return "" // no table of this family
	}
	var keep []string
	for _, l := range strings.Split(string(out), "\n") {
		keep = append(keep, strings.TrimSpace(l))
	}
	return strings.Join(keep, "\n")
}

// TestPrivilegedDriftMonitor: a hand-flushed Service chain, a flushed map
// and a flushed endpoints map are each noticed by Drifted (through the
// nftables monitor) and repaired by the next full sync; kproxy's own
// syncs and other tables' changes are not drift.
func TestPrivilegedDriftMonitor(t *testing.T) {
	n := newTestNet(t)
	n.Serve("198.18.64.10:8080", "pod-8080")
	snap := dptest.Snapshot(dptest.Svc("ns", "web", "198.19.0.10", 80, dptest.WithEPs(dptest.EP("198.18.64.10", 8080, true))))
	p, _ := New(privConfig())
	n.sync(p, snap, dataplane.SyncRequest{Full: true})
	drifted := func() bool {
		t.Helper()
		var d bool
		var err error
		n.In(n.Node, func() { d, err = p.Drifted(context.Background()) })
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	nft := func(args ...string) {
		dptest.Run(t, append([]string{"ip", "netns", "exec", n.Node, "nft"}, args...)...)
	}
	if drifted() {
		t.Fatal("Drifted right after a sync")
	}
	var svcChain string
	for name := range p.fams[model.IPv4].kChains {
		if strings.HasPrefix(name, "svc-") {
			svcChain = name
		}
	}
	breakages := []struct {
		name string
		do   []string
	}{
		{"service chain flushed", []string{"flush", "chain", "ip", DefaultTableName, svcChain}},
		{"service-ips flushed", []string{"flush", "map", "ip", DefaultTableName, mapServiceIPs}},
		{"endpoint-ranges map flushed", []string{"flush", "map", "ip", DefaultTableName, rangesMapOf(t, p.fams[model.IPv4].cur.Ports[snap.V4.Ports[0].ID])}},
	}
	for _, b := range breakages {
		nft(b.do...)
		if _, err := n.get("198.19.0.10:80"); err == nil {
			t.Fatalf("%s: the ClusterIP still works; the breakage broke nothing", b.name)
		}
		start := time.Now()
		if !drifted() {
			t.Fatalf("%s: not noticed", b.name)
		}
		t.Logf("%s: noticed in %v", b.name, time.Since(start))
		n.sync(p, snap, dataplane.SyncRequest{Full: true})
		if got, err := n.get("198.19.0.10:80"); err != nil || got != "pod-8080" {
			t.Fatalf("%s: after the repair: %q, %v", b.name, got, err)
		}
		if drifted() {
			t.Fatalf("%s: still drifted after the repair", b.name)
		}
	}
	// Other tables' commits and kproxy's own incremental syncs are no drift.
	nft("add", "table", "ip", "someone-else")
	nft("add", "chain", "ip", "someone-else", "c")
	n.sync(p, dptest.Snapshot(dptest.Svc("ns", "web", "198.19.0.10", 80)), dataplane.SyncRequest{})
	n.sync(p, snap, dataplane.SyncRequest{})
	start := time.Now()
	if drifted() {
		t.Fatal("other tables or kproxy's own syncs counted as drift")
	}
	t.Logf("Drifted after others' commits: %v", time.Since(start))
	start = time.Now()
	if drifted() {
		t.Fatal("drifted without any change")
	}
	t.Logf("Drifted with nothing committed: %v", time.Since(start))
}

// rangesMapOf names the endpoint-ranges map holding a port's endpoints.
func rangesMapOf(t *testing.T, ps *portState) string {
	for _, f := range ps.Fills {
		return f.b.shard
	}
	t.Fatal("the port has no endpoint-ranges elements")
	return ""
}
