package iptables

import (
	"context"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/dataplane/dptest"
)

// TestBatchedSyncsMatchSingleInput: with a tiny batch size, full and
// partial syncs write Service chains ahead in several inputs, no input
// splits a port's chains, and the kernel ends up as with one input.
func TestBatchedSyncsMatchSingleInput(t *testing.T) {
	defer func(n int) { batchChains = n }(batchChains)
	batchChains = 6
	defer func(n int) { batchRules = n }(batchRules)
	batchRules = 12
	ctx := context.Background()
	p, k, _ := newTestProxier(t)
	snap := featureSnapshot()
	if err := p.Sync(ctx, snap, dataplane.SyncRequest{Full: true}); err != nil {
		t.Fatal(err)
	}
	if len(k.restores) < 3 {
		t.Fatalf("full sync used %d restore inputs, want several batches", len(k.restores))
	}
	if !strings.HasPrefix(k.restores[0], "*filter") {
		t.Errorf("first input is not filter phase 1:\n%s", k.restores[0])
	}
	for i, in := range k.restores[:len(k.restores)-1] {
		// Ahead of the final input: filter phase 1, per-Service chains and
		// dispatch leaves only; never the top dispatch chains, a -g into a
		// leaf, or a deletion.
		nat := in[strings.Index(in, "*"):]
		if i == 0 {
			nat = "" // filter phase 1 only
			if strings.Contains(in, "*nat") || strings.Contains(in, "-X ") {
				t.Errorf("input 0 is not filter phase 1 alone:\n%s", in)
			}
		}
		if strings.Contains(nat, ":KUBE-SERVICES - ") || strings.Contains(nat, " -g ") || strings.Contains(nat, "-X ") {
			t.Errorf("input %d writes dispatch chains or deletes:\n%s", i, in)
		}
	}
	assertKernelMatches(t, k, p, snap)

	n := len(k.restores)
	var names []string
	for _, sp := range snap.V4.Ports {
		names = append(names, sp.ID.Name)
	}
	if err := p.Sync(ctx, snap, changed(names...)); err != nil {
		t.Fatal(err)
	}
	if len(k.restores) != n {
		t.Errorf("an unchanged snapshot wrote %d inputs", len(k.restores)-n)
	}
	assertKernelMatches(t, k, p, snap)

	for _, sp := range snap.V4.Ports { // every Service changes at once
		if len(sp.Endpoints) > 1 {
			sp.Endpoints = sp.Endpoints[1:]
			dptest.Categorize(sp)
		}
	}
	if err := p.Sync(ctx, snap, changed(names...)); err != nil {
		t.Fatal(err)
	}
	assertKernelMatches(t, k, p, snap)
}
