package nftables

import (
	"testing"

	"github.com/kproxy/kproxy/internal/dataplane/dptest"
	"github.com/kproxy/kproxy/internal/model"
)

// TestTraceMatrix runs the shared policy matrix (dptest.RunMatrix) through
// the nftables tracer; upstream's nftables mode is the oracle as written.
func TestTraceMatrix(t *testing.T) {
	dptest.RunMatrix(t, func(snap *model.Snapshot) func(dptest.Packet) dptest.Result {
		return traceOf(t, dptest.Config(), snap, model.IPv4).trace
	}, dptest.MatrixCase.Want)
}
