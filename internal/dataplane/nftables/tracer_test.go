package nftables

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/dataplane/dptest"
	"github.com/kproxy/kproxy/internal/model"
)

// testTracer traces the rules of a render and fails the test when the
// tracer cannot.
type testTracer struct {
	t  testing.TB
	tr *tracer
}

func newTracer(t testing.TB, d *desired, localAddrs ...netip.Addr) *testTracer {
	isLocal := func(a netip.Addr) bool { return a.IsLoopback() || slices.Contains(localAddrs, a) }
	return &testTracer{t: t, tr: newRuleTracer(newDesiredSource(d), isLocal)}
}

func (tt *testTracer) trace(p dptest.Packet) dptest.Result {
	tt.t.Helper()
	return dptest.Explore(tt.t, p, tt.tr.run)
}

// traceOf renders snap for cfg and returns a tracer for one family.
func traceOf(t testing.TB, cfg dataplane.Config, snap *model.Snapshot, fam model.Family) *testTracer {
	d := render(cfg, snap.Family(fam), snap.Node)
	return newTracer(t, d, dptest.NodeIP, dptest.NodeIP6)
}
