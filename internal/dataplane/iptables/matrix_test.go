package iptables

import (
	"testing"

	"github.com/kproxy/kproxy/internal/dataplane/dptest"
	"github.com/kproxy/kproxy/internal/model"
)

// TestTraceMatrix runs the shared policy matrix (dptest.RunMatrix) through
// the iptables tracer, over the typed rules and over their text, against
// wantIPTables.
func TestTraceMatrix(t *testing.T) {
	for name, of := range map[string]func(testing.TB, Params, *model.Snapshot, model.Family) *testTracer{"typed": traceOf, "text": traceTextOf} {
		for _, counted := range []bool{false, true} {
			p := testParams()
			if counted {
				name += "/nfacct" // the counting rules change no verdict
				p.Counters = Counters{InvalidDropped: true, LocalhostAccepted: true}
			}
			t.Run(name, func(t *testing.T) {
				dptest.RunMatrix(t, func(snap *model.Snapshot) func(dptest.Packet) dptest.Result {
					return of(t, p, snap, model.IPv4).trace
				}, wantIPTables)
			})
		}
	}
}

// wantIPTables is upstream's iptables mode for a matrix case. It differs
// from the shared oracle for Services without endpoints: those reject
// before any other check (LB source ranges included), except the host's
// own packets to an LB or external IP, which upstream's iptables mode
// leaves untouched (it jumps to KUBE-EXTERNAL-SERVICES from INPUT and
// FORWARD only, and these IPs are not local).
func wantIPTables(c dptest.MatrixCase) dptest.Result {
	if c.EPs != dptest.EPsNone {
		return c.Want()
	}
	if c.Source.FromHost && (c.Frontend == dptest.FELB || c.Frontend == dptest.FEExternalIP) {
		return dptest.Result{Verdict: "accept"}
	}
	return dptest.Result{Verdict: "reject"}
}
