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
	// The same algorithms with ClientIP affinity (per-endpoint rules that
	// record the client) must pick the same way.
	snap := dptest.Snapshot(
		dptest.Svc("ns", "rr", "198.19.0.10", 80, dptest.WithBalancing(model.BalanceRoundRobin), dptest.WithEPs(eps...)),
		dptest.Svc("ns", "sh", "198.19.0.11", 80, dptest.WithBalancing(model.BalanceSourceHash), dptest.WithEPs(eps...)),
		dptest.Svc("ns", "sh-aff", "198.19.0.12", 80, dptest.WithBalancing(model.BalanceSourceHash), dptest.WithAffinity(60), dptest.WithEPs(eps...)),
		dptest.Svc("ns", "rr-aff", "198.19.0.13", 80, dptest.WithBalancing(model.BalanceRoundRobin), dptest.WithAffinity(60), dptest.WithEPs(eps...)))
	p, _ := New(privConfig())
	n.sync(p, snap, dataplane.SyncRequest{Full: true})

	// Round-robin: every window of three connections sees each endpoint.
	n.GetInTurn("198.19.0.10:80", 3, 9)

	// Source-hash: 24 clients, twice each, with and without affinity.
	var clients []netip.Addr
	for i := range 24 {
		src := netip.AddrFrom4([4]byte{198, 18, 200, byte(10 + i)})
		n.AddClientAddr(src)
		clients = append(clients, src)
	}
	for _, sp := range snap.V4.Ports {
		if sp.Balancing != model.BalanceSourceHash {
			continue
		}
		seen := map[string]bool{}
		for _, src := range clients {
			want := fmt.Sprint(sp.SourceHashPick(sp.ClusterEndpoints, src).Port)
			for range 2 {
				r, err := n.GetFrom(src, netip.AddrPortFrom(sp.ClusterIP, 80).String(), 2e9)
				if err != nil {
					t.Fatal(err)
				}
				if r != want {
					t.Fatalf("%s: client %s reached %s, the model says %s", sp.ID, src, r, want)
				}
			}
			seen[want] = true
		}
		if len(seen) != len(eps) {
			t.Errorf("%s: 24 clients reached %d of %d endpoints", sp.ID, len(seen), len(eps))
		}
	}

	// Round-robin with affinity: each new client takes the next endpoint
	// and then stays there.
	var firsts []string
	for _, src := range clients[:6] {
		var got []string
		for range 3 {
			r, err := n.GetFrom(src, "198.19.0.13:80", 2e9)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, r)
		}
		if got[0] != got[1] || got[0] != got[2] {
			t.Fatalf("rr-aff: client %s reached %v, want one endpoint (affinity)", src, got)
		}
		firsts = append(firsts, got[0])
	}
	for i := 0; i+3 <= len(firsts); i++ {
		if firsts[i] == firsts[i+1] || firsts[i] == firsts[i+2] || firsts[i+1] == firsts[i+2] {
			t.Fatalf("rr-aff: new clients went to %v, want the endpoints in turn", firsts)
		}
	}
}
