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
	return &testTracer{t: t, tr: newRuleTracer(text, isLocalTo(localAddrs...))}
}

func (tt *testTracer) trace(p dptest.Packet) dptest.Result {
	tt.t.Helper()
	return dptest.Explore(tt.t, p, tt.tr.run)
}

// traceOf renders snap for one family and builds a tracer over its typed
// rules.
func traceOf(t testing.TB, p Params, snap *model.Snapshot, fam model.Family) *testTracer {
	rs := Render(p, snap.Family(fam), snap.Node)
	return &testTracer{t: t, tr: newRulesetTracer(rs, isLocalTo(dptest.NodeIP, dptest.NodeIP6))}
}

// traceTextOf is traceOf over the printed restore text: the tracer as it
// reads the kernel's iptables-save output.
func traceTextOf(t testing.TB, p Params, snap *model.Snapshot, fam model.Family) *testTracer {
	rs := Render(p, snap.Family(fam), snap.Node)
	return newTracer(t, RestoreText(rs), dptest.NodeIP, dptest.NodeIP6)
}

func isLocalTo(localAddrs ...netip.Addr) func(netip.Addr) bool {
	return func(a netip.Addr) bool { return a.IsLoopback() || slices.Contains(localAddrs, a) }
}
