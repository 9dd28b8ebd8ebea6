package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/explain"
)

// ErrExplain marks a request explain cannot answer (an unknown node, a
// bad request); ErrNotProxied an answer that no Service frontend takes the
// packet, already written. kproxy explain exits 1 for both.
var (
	ErrExplain    = errors.New("explain")
	ErrNotProxied = errors.New("explain: not proxied")
)

// Explain answers kproxy explain: the path of one new connection on the
// node, from the first complete input of the configured source (the API or
// --source-file) and the dataplane configuration the daemon would use
// there. The mode is the configured one (no IPVS fallback: the node asked
// about may have IPVS where the command runs has not). It changes nothing
// in the kernel. The answer is written to out, as text or JSON; a request
// no frontend takes is answered and returned as an ErrExplain.
//
// With verify, the packet is also traced through the rules this node's
// kernel holds and through kproxy's rules for the same snapshot (see
// Report); a difference is returned as ErrDisagree after the report.
func Explain(ctx context.Context, o *config.Options, req explain.Request, out io.Writer, asJSON, verify bool) error {
	e := defaultEnv()
	e.ipvsSupport = nil
	e.stdout = out
	return explainWith(ctx, o, e, req, asJSON, verify)
}

// explainNodeWait bounds the wait for the Node object after the inputs
// synced: an unknown node is answered after it.
const explainNodeWait = 10 * time.Second

func explainWith(ctx context.Context, o *config.Options, e env, req explain.Request, asJSON, verify bool) error {
	d, err := newDaemon(o, e)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { d.runSource(ctx) })
	if err := d.waitFor(ctx, 0, d.inputs.Tracker.Synced); err != nil {
		return err
	}
	if d.inputs.NodeExpected {
		// The Node's event can reach the tracker just after the inputs
		// report synced (the daemon's start-up waits for it the same way).
		if err := d.waitFor(ctx, explainNodeWait, func() bool { return d.peekNode() != nil }); err != nil {
			return err
		}
	}
	if d.peekNode() == nil {
		return fmt.Errorf("%w: node %q does not exist in the source", ErrExplain, d.nodeName)
	}
	if err := d.prepare(ctx); err != nil {
		return err
	}
	snap := d.takeSnapshot(ctx)
	a, err := explain.Explain(explain.Input{Snapshot: snap, Config: d.dpCfg, Mode: d.mode}, req)
	if err != nil {
		return err
	}
	var report *Report
	if verify {
		r, err := d.verify(ctx, snap, req, *a)
		if err != nil {
			return err
		}
		report = &r
	}
	switch {
	case asJSON && report != nil:
		err = explain.WriteJSONValue(e.stdout, VerifiedAnswer{a, report})
	case asJSON:
		err = explain.WriteJSON(e.stdout, a)
	default:
		err = explain.WriteText(e.stdout, a)
		if err == nil && report != nil {
			err = writeReport(e.stdout, *report)
		}
	}
	if err != nil {
		return err
	}
	if report != nil && !report.Agree {
		return ErrDisagree
	}
	if a.Verdict == explain.NotProxied {
		return ErrNotProxied
	}
	return nil
}
