package nftables

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/dataplane/dptest"
	"github.com/kproxy/kproxy/internal/model"
)

// TestPrivilegedBalancing sends real connections through the kernel:
// round-robin takes the endpoints in turn, and source-hash sends each
// client address to the endpoint the model predicts (the kernel's jhash
// and the model's table agree), the same one every time.
func TestPrivilegedBalancing(t *testing.T) {
	n := newTestNet(t)
	var eps []*model.Endpoint
	for port := uint16(8080); port < 8083; port++ {
		n.Serve(fmt.Sprintf("198.18.64.10:%d", port), fmt.Sprint(port))
		eps = append(eps, dptest.EP("198.18.64.10", port, true))
	}
	snap := dptest.Snapshot(
		dptest.Svc("ns", "rr", "198.19.0.10", 80, dptest.WithBalancing(model.BalanceRoundRobin), dptest.WithEPs(eps...)),
		dptest.Svc("ns", "sh", "198.19.0.11", 80, dptest.WithBalancing(model.BalanceSourceHash), dptest.WithEPs(eps...)))
	p, _ := New(privConfig())
	n.sync(p, snap, dataplane.SyncRequest{Full: true})

	// Round-robin: every window of three connections sees each endpoint.
	n.GetInTurn("198.19.0.10:80", 3, 9)

	// Source-hash: 24 clients, twice each.
	sp := snap.V4.Ports[1]
	seen := map[string]bool{}
	for i := range 24 {
		src := netip.AddrFrom4([4]byte{198, 18, 200, byte(10 + i)})
		n.AddClientAddr(src)
		want := fmt.Sprint(sp.SourceHashPick(sp.ClusterEndpoints, src).Port)
		for range 2 {
			r, err := n.GetFrom(src, "198.19.0.11:80", 2e9)
			if err != nil {
				t.Fatal(err)
			}
			if r != want {
				t.Fatalf("source-hash: client %s reached %s, the model says %s", src, r, want)
			}
		}
		seen[want] = true
	}
	if len(seen) != len(eps) {
		t.Errorf("source-hash: 24 clients reached %d of %d endpoints", len(seen), len(eps))
	}
}
