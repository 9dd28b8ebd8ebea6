package traffic

import (
	"fmt"
	"net/netip"
	"testing"

	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/dataplane/dptest"
	"github.com/kproxy/kproxy/internal/model"
)

// BenchmarkPrivilegedScrape10k: one Read (a scrape's kernel work) of the
// counters of 10,000 Service ports, each with a ClusterIP and a NodePort,
// in a fresh network namespace.
func BenchmarkPrivilegedScrape10k(b *testing.B) {
	const n = 10000
	l := dptest.NewLab(b, "kptr")
	var ports []*model.ServicePort
	for i := range n {
		ip := netip.AddrFrom4([4]byte{198, 19, byte(i >> 8), byte(i)})
		ports = append(ports, dptest.Svc("ns", fmt.Sprintf("svc-%05d", i), ip.String(), 80, dptest.WithNodePort(uint16(20000+i))))
	}
	snap := dptest.Snapshot(ports...)
	r := NewReconciler([]model.Family{model.IPv4}, klog.Background())
	l.In(l.Node, func() {
		r.apply(snap)
		got, err := Read([]model.Family{model.IPv4})
		if err != nil || len(got) != n {
			b.Fatalf("read %d samples, %v", len(got), err)
		}
		b.ResetTimer()
		for range b.N {
			if _, err := Read([]model.Family{model.IPv4}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
