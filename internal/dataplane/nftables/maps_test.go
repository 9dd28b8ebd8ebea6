package nftables

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/dataplane/dptest"
	"github.com/kproxy/kproxy/internal/model"
)

// tableMaps lists the endpoint-ranges maps of a family's table.
func (e *applyEnv) tableMaps(f model.Family) []string {
	e.t.Helper()
	var out []string
	for _, l := range strings.Split(e.k.fake(f).Dump(), "\n") {
		if rest, ok := strings.CutPrefix(l, "add map "+string(nftFamily(f))+" "+DefaultTableName+" "); ok && strings.HasPrefix(rest, mapEndpoints+"-") {
			name, _, _ := strings.Cut(rest, " ")
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// tcpSvc is a TCP Service with one endpoint.
func tcpSvc(name, ip string) *model.ServicePort {
	return dptest.Svc("ns", name, ip, 80, dptest.WithEPs(dptest.EP("198.18.65.10", 8080, false)))
}

// sameShard returns the names of two Services whose Cluster policy chains
// hash to one endpoint-ranges map, and a third whose chain hashes to
// another.
func sameShard(t *testing.T) (a, b, other string) {
	shard := func(name string) string { s, _ := keyShard("svc ns/" + name + "/tcp/p"); return s }
	a = "a"
	for i := range 10000 {
		name := "s" + strconv.Itoa(i)
		switch {
		case b == "" && shard(name) == shard(a):
			b = name
		case other == "" && shard(name) != shard(a):
			other = name
		}
		if b != "" && other != "" {
			return a, b, other
		}
	}
	t.Fatal("no two Services share an endpoint-ranges map")
	return
}

// TestApplyMapLifecycle: an endpoint-ranges map is added in the
// transaction that adds the first chain using it, before that chain's
// rule, and deleted with (after) the last chain using it.
func TestApplyMapLifecycle(t *testing.T) {
	e := newApplyEnv(t)
	e.cfg.Families = []model.Family{model.IPv4}
	e.restart()
	a, b, other := sameShard(t)
	mapOf := func(name string) string { s, _ := keyShard("svc ns/" + name + "/tcp/p"); return s }
	step := func(label string, svcs []*model.ServicePort, want ...string) string {
		t.Helper()
		snap := dptest.Snapshot(svcs...)
		e.sync(snap, dataplane.SyncRequest{})
		if len(e.p.fams[model.IPv4].stale) == 0 {
			e.checkKernel(snap)
		}
		slices.Sort(want)
		if got := e.tableMaps(model.IPv4); !slices.Equal(got, slices.Compact(want)) {
			t.Errorf("%s: maps %v, want %v", label, got, want)
		}
		return e.k.lastTx(model.IPv4)
	}

	step("no Services", nil)
	tx := step("first Service", []*model.ServicePort{tcpSvc(a, "198.19.0.1")}, mapOf(a))
	addMap, useMap := strings.Index(tx, "add map ip kube-proxy "+mapOf(a)), strings.Index(tx, "map @"+mapOf(a))
	if addMap < 0 || useMap < addMap {
		t.Errorf("the map is not added before the rule using it:\n%s", tx)
	}
	tx = step("second Service, same map", []*model.ServicePort{tcpSvc(a, "198.19.0.1"), tcpSvc(b, "198.19.0.2")}, mapOf(a))
	if strings.Contains(tx, "add map") {
		t.Errorf("a map the kernel has was added again in an incremental sync:\n%s", tx)
	}
	tx = step("third Service, another map", []*model.ServicePort{tcpSvc(a, "198.19.0.1"), tcpSvc(b, "198.19.0.2"), tcpSvc(other, "198.19.0.3")}, mapOf(a), mapOf(other))
	if strings.Count(tx, "add map") != 1 || !strings.Contains(tx, "add map ip kube-proxy "+mapOf(other)) {
		t.Errorf("the new Service's map is not the one map added:\n%s", tx)
	}

	// a goes: its map stays for b.
	e.clock.Step(2 * staleDelay)
	step("first Service gone", []*model.ServicePort{tcpSvc(b, "198.19.0.2"), tcpSvc(other, "198.19.0.3")}, mapOf(a), mapOf(other))
	e.clock.Step(2 * staleDelay)
	step("its chain deleted", []*model.ServicePort{tcpSvc(b, "198.19.0.2"), tcpSvc(other, "198.19.0.3")}, mapOf(a), mapOf(other))

	// b goes too: the map stays while b's chain waits for deletion, and
	// goes in the transaction that deletes that chain, after it.
	last := []*model.ServicePort{tcpSvc(other, "198.19.0.3")}
	step("last Service of the map gone", last, mapOf(a), mapOf(other))
	e.clock.Step(staleDelay / 2)
	step("its chain not deleted yet", last, mapOf(a), mapOf(other))
	e.clock.Step(2 * staleDelay)
	e.sync(dptest.Snapshot(last...), dataplane.SyncRequest{})
	tx = e.k.lastTx(model.IPv4)
	delChain, delMap := strings.Index(tx, "delete chain ip kube-proxy svc-"), strings.Index(tx, "delete map ip kube-proxy "+mapOf(a))
	if delChain < 0 || delMap < delChain {
		t.Errorf("the map is not deleted after its last chain:\n%s", tx)
	}
	step("chain and map deleted", last, mapOf(other))
	step("everything gone", nil, mapOf(other))
	e.clock.Step(2 * staleDelay)
	step("and deleted", nil)
	if len(e.p.fams[model.IPv4].kMaps) != 0 {
		t.Errorf("the mirror still lists maps: %v", e.p.fams[model.IPv4].kMaps)
	}
}

// TestApplyMapsAfterRestart: a restarted proxier finds the maps in the
// kernel (their elements included), keeps those in use, and deletes the
// others once their last chains go, whether the Services went before the
// restart or while the proxier was running.
func TestApplyMapsAfterRestart(t *testing.T) {
	e := newApplyEnv(t)
	snap := featureSnapshot()
	e.sync(snap, dataplane.SyncRequest{Full: true})
	before := map[model.Family][]string{}
	for _, f := range e.cfg.Families {
		before[f] = e.tableMaps(f)
	}
	e.restart()
	e.sync(snap, dataplane.SyncRequest{Full: true})
	tx := e.k.lastTx(model.IPv4)
	if strings.Contains(tx, "element ip kube-proxy "+mapEndpoints) || strings.Contains(tx, "delete") {
		t.Errorf("restart rewrote endpoint-ranges maps:\n%s", tx)
	}
	for _, f := range e.cfg.Families {
		st := e.p.fams[f]
		if got := e.tableMaps(f); !slices.Equal(got, before[f]) || !slices.Equal(sortedNames(st.kMaps, 1000), got) {
			t.Errorf("%s: maps after the restart %v, mirror %v, want %v", f, got, sortedNames(st.kMaps, 1000), before[f])
		}
	}
	e.checkKernel(snap)

	// Every Service but one goes (while running, or before a restart):
	// the others' maps go with their chains.
	kept := tcpSvc("cluster", "198.19.0.10")
	small := dptest.Snapshot(kept)
	for _, restart := range []bool{false, true} {
		e.sync(snap, dataplane.SyncRequest{Full: true})
		e.clock.Step(2 * staleDelay)
		if restart {
			e.restart()
		}
		e.sync(small, dataplane.SyncRequest{Full: restart})
		e.clock.Step(2 * staleDelay)
		e.sync(small, dataplane.SyncRequest{})
		e.checkKernel(small)
		want, _ := keyShard("svc ns/cluster/tcp/" + kept.ID.Port)
		if got := e.tableMaps(model.IPv4); !slices.Equal(got, []string{want}) {
			t.Errorf("restart %v: maps %v, want [%s]", restart, got, want)
		}
		if got := e.tableMaps(model.IPv6); len(got) != 0 {
			t.Errorf("restart %v: ip6 maps %v, want none", restart, got)
		}
	}
}

// TestApplyUpgradeFromEveryMap: a table written when every endpoint-ranges
// map always existed (empty ones too) keeps those in use and loses the
// others at the next sync.
func TestApplyUpgradeFromEveryMap(t *testing.T) {
	e := newApplyEnv(t)
	snap := featureSnapshot()
	for _, f := range e.cfg.Families {
		r := newRenderer(e.cfg, f, snap.Node)
		e.k.run(t, f, func(tx *knftables.Transaction) {
			tx.Add(&knftables.Table{Comment: knftables.PtrTo(tableComment)})
			for _, s := range r.endpointSets() {
				tx.Add(s.object())
			}
		})
	}
	e.sync(snap, dataplane.SyncRequest{Full: true})
	all := 0
	for _, n := range shardCount {
		all += n
	}
	if n := len(e.tableMaps(model.IPv4)); n != all {
		t.Errorf("the takeover deleted maps at once (%d left): they go at the next sync", n)
	}
	e.clock.Step(time.Millisecond)
	e.sync(snap, dataplane.SyncRequest{})
	e.checkKernel(snap)
}
