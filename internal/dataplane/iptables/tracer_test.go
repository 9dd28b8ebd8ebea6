package iptables

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/kproxy/kproxy/internal/dataplane/dptest"
	"github.com/kproxy/kproxy/internal/model"
)

// testTracer traces iptables-restore text and fails the test when the
// tracer cannot.
type testTracer struct {
	t  testing.TB
	tr *tracer
}

func newTracer(t testing.TB, text string, localAddrs ...netip.Addr) *testTracer {
	isLocal := func(a netip.Addr) bool { return a.IsLoopback() || slices.Contains(localAddrs, a) }
	return &testTracer{t: t, tr: newRuleTracer(text, isLocal)}
}

func (tt *testTracer) trace(p dptest.Packet) dptest.Result {
	tt.t.Helper()
	return dptest.Explore(tt.t, p, tt.tr.run)
}

// traceOf renders snap for one family and builds a tracer over it.
func traceOf(t testing.TB, p Params, snap *model.Snapshot, fam model.Family) *testTracer {
	rs := Render(p, snap.Family(fam), snap.Node)
	return newTracer(t, RestoreText(rs), dptest.NodeIP, dptest.NodeIP6)
}
