//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/test/testbed/netbed"
	"github.com/kproxy/kproxy/test/testbed/netbed/echo"
)

// Bounds of every wait on kproxy: how long programming may take, how often
// traffic is re-sampled meanwhile.
var (
	convergeTimeout = 30 * time.Second * vmFactor()
	resample        = 250 * time.Millisecond
	// proxyStartTimeout bounds a proxy's start until it is healthy,
	// start-up cleanup of another mode's state included.
	proxyStartTimeout = 3 * convergeTimeout
)

// vmFactor stretches the waits in the IPVS VM (test/vm sets KPROXY_VM),
// where upstream kube-proxy's IPVS mode takes ~20 s to program a node.
func vmFactor() time.Duration {
	if os.Getenv("KPROXY_VM") != "" {
		return 2
	}
	return 1
}

// tally is the outcome of a burst of requests.
type tally struct {
	byPod    map[string]int // replies per pod
	failures []echo.Result  // requests without a reply
	results  []echo.Result  // every result, in order
}

func (t tally) pods() []string { return slices.Sorted(maps.Keys(t.byPod)) }

func (t tally) String() string {
	var b strings.Builder
	for _, p := range t.pods() {
		fmt.Fprintf(&b, "%s=%d ", p, t.byPod[p])
	}
	if len(t.failures) > 0 {
		fmt.Fprintf(&b, "failures=%d (first: %s)", len(t.failures), t.failures[0])
	}
	return strings.TrimSpace(b.String())
}

// burst sends n requests from ns, each on a new connection (new source port).
func burst(ns *netbed.Netns, req echo.Request, n int) tally {
	t := tally{byPod: map[string]int{}}
	for _, r := range ns.SendN(context.Background(), req, n) {
		t.results = append(t.results, r)
		if r.OK() {
			t.byPod[r.Reply.Pod]++
		} else {
			t.failures = append(t.failures, r)
		}
	}
	return t
}

// abortFunc tells a wait to give up at once (e.g. kproxy exited); nil means
// keep waiting.
type abortFunc func() error

func checkAbort(t *testing.T, abort abortFunc) {
	t.Helper()
	if abort == nil {
		return
	}
	if err := abort(); err != nil {
		t.Fatalf("giving up: %v", err)
	}
}

// waitForPods re-samples bursts from ns until a burst gets replies from
// exactly the pods in want and no failures, and fails t after convergeTimeout
// or as soon as abort reports an error. It returns the converged burst.
func waitForPods(t *testing.T, abort abortFunc, ns *netbed.Netns, req echo.Request, want ...*netbed.Pod) tally {
	t.Helper()
	names := podNames(want)
	n := max(8*len(want), 16)
	var last tally
	deadline := time.Now().Add(convergeTimeout)
	for time.Now().Before(deadline) {
		last = burst(ns, req, n)
		if len(last.failures) == 0 && slices.Equal(last.pods(), names) {
			return last
		}
		checkAbort(t, abort)
		time.Sleep(resample)
	}
	t.Fatalf("%s -> %s %s: want replies from %v, last burst: %s", ns.Name, req.Proto, req.Dst, names, last)
	return last
}

// waitForKind re-sends req until it fails with kind, then checks that
// `confirm` more requests fail the same way within bound each.
func waitForKind(t *testing.T, abort abortFunc, ns *netbed.Netns, req echo.Request, kind echo.ErrKind, bound time.Duration, confirm int) {
	t.Helper()
	var last echo.Result
	deadline := time.Now().Add(convergeTimeout)
	for time.Now().Before(deadline) {
		if last = ns.Send(context.Background(), req); last.Kind == kind {
			break
		}
		checkAbort(t, abort)
		time.Sleep(resample)
	}
	if last.Kind != kind {
		t.Fatalf("%s -> %s %s: want %s, last: %s", ns.Name, req.Proto, req.Dst, kind, last)
	}
	for _, r := range ns.SendN(context.Background(), req, confirm) {
		if r.Kind != kind || r.Elapsed > bound {
			t.Errorf("%s -> %s %s: want %s within %s, got %s", ns.Name, req.Proto, req.Dst, kind, bound, r)
		}
	}
}

func podNames(pods []*netbed.Pod) []string {
	out := make([]string, len(pods))
	for i, p := range pods {
		out[i] = p.PodName
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// eventually retries check until it returns nil, and fails t with the last
// error after convergeTimeout or as soon as abort reports an error.
func eventually(t *testing.T, abort abortFunc, check func() error, format string, args ...any) {
	t.Helper()
	eventuallyWithin(t, convergeTimeout, abort, check, format, args...)
}

// eventuallyWithin is eventually with its own bound.
func eventuallyWithin(t *testing.T, bound time.Duration, abort abortFunc, check func() error, format string, args ...any) {
	t.Helper()
	var err error
	deadline := time.Now().Add(bound)
	for time.Now().Before(deadline) {
		if err = check(); err == nil {
			return
		}
		checkAbort(t, abort)
		time.Sleep(resample)
	}
	t.Fatalf("%s: %v", fmt.Sprintf(format, args...), err)
}
