package nftables

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/dataplane/dptest"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/objects"
)

// TestApplyBalancingIncremental: endpoint changes of round-robin and
// source-hash ports, with and without affinity, applied incrementally,
// leave the kernel exactly as rendered (once replaced chains are gone); source-hash without affinity
// changes map elements only while its table size stays.
func TestApplyBalancingIncremental(t *testing.T) {
	eps := func(n int) []*model.Endpoint {
		var out []*model.Endpoint
		for i := range n {
			out = append(out, dptest.EP(fmt.Sprintf("198.18.65.%d", 10+i), 8080, false))
		}
		return out
	}
	svcs := func(n int) *model.Snapshot {
		return dptest.Snapshot(
			dptest.Svc("ns", "rr", "198.19.0.10", 80, dptest.WithBalancing(model.BalanceRoundRobin), dptest.WithEPs(eps(n)...)),
			dptest.Svc("ns", "sh", "198.19.0.11", 80, dptest.WithBalancing(model.BalanceSourceHash), dptest.WithEPs(eps(n)...)),
			dptest.Svc("ns", "rra", "198.19.0.12", 80, dptest.WithBalancing(model.BalanceRoundRobin), dptest.WithAffinity(30), dptest.WithEPs(eps(n)...)),
			dptest.Svc("ns", "sha", "198.19.0.13", 80, dptest.WithBalancing(model.BalanceSourceHash), dptest.WithAffinity(30), dptest.WithEPs(eps(n)...)))
	}
	e := newApplyEnv(t)
	e.sync(svcs(3), dataplane.SyncRequest{Full: true})
	e.checkKernel(svcs(3))
	all := map[objects.Key]struct{}{}
	for _, name := range []string{"rr", "sh", "rra", "sha"} {
		all[objects.Key{Namespace: "ns", Name: name}] = struct{}{}
	}
	for _, n := range []int{4, 2, 0, 1, 5, 13} {
		snap := svcs(n)
		e.sync(snap, dataplane.SyncRequest{Changed: all})
		// Replaced chains go once unreferenced long enough.
		e.clock.Step(2 * time.Second)
		e.sync(snap, dataplane.SyncRequest{Changed: map[objects.Key]struct{}{}})
		e.checkKernel(snap)
	}
	// Source-hash alone, 5 -> 6 endpoints: the same table size, so
	// elements only.
	only := func(n int) *model.Snapshot {
		return dptest.Snapshot(dptest.Svc("ns", "sh", "198.19.0.11", 80, dptest.WithBalancing(model.BalanceSourceHash), dptest.WithEPs(eps(n)...)))
	}
	e = newApplyEnv(t)
	e.sync(only(5), dataplane.SyncRequest{Full: true})
	e.sync(only(6), dataplane.SyncRequest{Changed: map[objects.Key]struct{}{{Namespace: "ns", Name: "sh"}: {}}})
	tx := e.k.lastTx(model.IPv4)
	if strings.Contains(tx, "chain") || strings.Contains(tx, "rule") || !strings.Contains(tx, "add element ip kube-proxy endpoint-ranges-") {
		t.Errorf("5 -> 6 source-hash endpoints: want element changes only:\n%s", tx)
	}
	e.checkKernel(only(6))
}
