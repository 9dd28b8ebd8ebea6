package nftables

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/dataplane/dptest"
	"github.com/kproxy/kproxy/internal/model"
)

// listedMaps are the endpoint-ranges maps nft lists in a namespace's table.
func listedMaps(t *testing.T, ns string) []string {
	var out []string
	for _, l := range strings.Split(listTable(t, ns, "ip"), "\n") {
		if name, ok := strings.CutPrefix(l, "map "+mapEndpoints+"-"); ok {
			out = append(out, mapEndpoints+"-"+strings.TrimSuffix(name, " {"))
		}
	}
	slices.Sort(out)
	return out
}

// TestPrivilegedMapLifecycle: in the kernel, a Service's endpoint-ranges
// map comes in the transaction of its first chain and goes in the one
// deleting its last (the kernel refuses to delete a map a rule uses, and to
// add a rule using a missing one), through incremental syncs and a
// restart; traffic flows through a map added by an incremental sync.
func TestPrivilegedMapLifecycle(t *testing.T) {
	n := newTestNet(t)
	n.Serve("198.18.64.10:8080", "pod-8080")
	clk := testingclock.NewFakePassiveClock(time.Now())
	p, _ := New(privConfig(), WithClock(clk))
	a, _, other := sameShard(t)
	mapOf := func(name string) string { s, _ := keyShard("svc ns/" + name + "/tcp/p"); return s }
	svc := func(name, ip string) *model.ServicePort {
		return dptest.Svc("ns", name, ip, 80, dptest.WithEPs(dptest.EP("198.18.64.10", 8080, true)))
	}
	// Every transaction must succeed: a failed stale deletion is only
	// logged (and the next sync re-reads the table).
	var log bytes.Buffer
	ctx := klog.NewContext(context.Background(), textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(&log))))
	step := func(label string, snap *model.Snapshot, req dataplane.SyncRequest, want ...string) {
		t.Helper()
		log.Reset()
		var err error
		n.In(n.Node, func() { err = p.Sync(ctx, snap, req) })
		if err != nil || strings.Contains(log.String(), "failed") {
			t.Errorf("%s: %v\n%s", label, err, log.String())
		}
		slices.Sort(want)
		if got := listedMaps(t, n.Node); !slices.Equal(got, want) {
			t.Errorf("%s: maps %v, want %v", label, got, want)
		}
	}
	both := dptest.Snapshot(svc(a, "198.19.0.1"), svc(other, "198.19.0.2"))
	step("first Service", dptest.Snapshot(svc(a, "198.19.0.1")), dataplane.SyncRequest{Full: true}, mapOf(a))
	step("a Service in another map", both, dataplane.SyncRequest{}, mapOf(a), mapOf(other))
	if got, err := n.get("198.19.0.2:80"); err != nil || got != "pod-8080" {
		t.Errorf("through the new map: %q, %v", got, err)
	}
	alone := dptest.Snapshot(svc(other, "198.19.0.2"))
	step("first Service gone", alone, dataplane.SyncRequest{}, mapOf(a), mapOf(other))
	step("its chain not deleted yet", alone, dataplane.SyncRequest{}, mapOf(a), mapOf(other))
	clk.SetTime(clk.Now().Add(2 * staleDelay))
	step("its chain deleted", alone, dataplane.SyncRequest{}, mapOf(other))

	// A restart finds the map; once its Service is gone too, it goes.
	p, _ = New(privConfig(), WithClock(clk))
	step("restart", dptest.Snapshot(), dataplane.SyncRequest{Full: true}, mapOf(other))
	clk.SetTime(clk.Now().Add(2 * staleDelay))
	step("after the restart", dptest.Snapshot(), dataplane.SyncRequest{})
}
