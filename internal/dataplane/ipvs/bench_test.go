package ipvs

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/dataplane/dptest"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/objects"
)

// scaleSnapshot is n ClusterIP Services with eps endpoints each; extra
// adds one endpoint to the first Service.
func scaleSnapshot(n, eps int, extra bool) *model.Snapshot {
	var ports []*model.ServicePort
	for i := range n {
		ip := netip.AddrFrom4([4]byte{198, 19, byte(i >> 8), byte(i)})
		var list []*model.Endpoint
		for j := range eps {
			list = append(list, dptest.EP(netip.AddrFrom4([4]byte{198, 18, byte(64 + j), byte(i % 250)}).String(), 8080, false))
		}
		if extra && i == 0 {
			list = append(list, dptest.EP("198.18.100.1", 8080, false))
		}
		ports = append(ports, dptest.Svc("ns", fmt.Sprintf("s%05d", i), ip.String(), 80, dptest.WithEPs(list...)))
	}
	return dptest.Snapshot(ports...)
}

// BenchmarkSyncOneChange: one endpoint added to one of 10k Services, on the
// fake kernel: the CPU a partial sync spends besides the kernel's work.
//
//	go test -run '^$' -bench SyncOneChange -benchmem ./internal/dataplane/ipvs/
func BenchmarkSyncOneChange(b *testing.B) {
	ctx := context.Background()
	snaps := [2]*model.Snapshot{scaleSnapshot(10000, 10, false), scaleSnapshot(10000, 10, true)}
	p, _ := New(testConfig(), withKernel(newFakeKernel("198.18.0.11")))
	if err := p.Sync(ctx, snaps[0], dataplane.SyncRequest{Full: true}); err != nil {
		b.Fatal(err)
	}
	req := dataplane.SyncRequest{Changed: map[objects.Key]struct{}{{Namespace: "ns", Name: "s00000"}: {}}}
	b.ResetTimer()
	for i := range b.N {
		if err := p.Sync(ctx, snaps[(i+1)%2], req); err != nil {
			b.Fatal(err)
		}
	}
}
