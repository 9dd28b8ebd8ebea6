package nftables

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/objects"
)

// scaleSnapshot has n ClusterIP Services with eps endpoints each, every
// tenth also a NodePort. Addresses: Services in 198.19.0.0/16, endpoints in
// 198.18.64.0/18.
func scaleSnapshot(n, eps int) *model.Snapshot {
	ports := make([]*model.ServicePort, 0, n)
	for i := range n {
		var list []*model.Endpoint
		for j := range eps {
			k := i*eps + j
			list = append(list, ep(fmt.Sprintf("198.18.%d.%d", 64+(k>>8)%64, k&255), 8080, false))
		}
		opts := []func(*model.ServicePort){withEPs(list...)}
		if i%10 == 0 {
			opts = append(opts, withNodePort(uint16(30000+i/10)))
		}
		ports = append(ports, svc("ns", fmt.Sprintf("svc-%05d", i), fmt.Sprintf("198.19.%d.%d", i>>8, i&255), 80, opts...))
	}
	return snapshot(ports...)
}

// withChangedEndpoint returns snap with Service i's endpoints replaced by a
// new (version-numbered) list; every other port is shared.
func withChangedEndpoint(snap *model.Snapshot, i, version int) *model.Snapshot {
	fs := *snap.V4
	fs.Ports = slices.Clone(fs.Ports)
	fs.ByID = make(map[model.PortID]*model.ServicePort, len(fs.Ports))
	for _, sp := range fs.Ports {
		fs.ByID[sp.ID] = sp
	}
	old := fs.Ports[i]
	next := *old
	next.Endpoints = append(slices.Clone(old.Endpoints[1:]), ep(fmt.Sprintf("198.18.127.%d", version%250+1), 8080, false))
	categorize(&next)
	fs.Ports[i], fs.ByID[next.ID] = &next, &next
	out := *snap
	out.V4 = &fs
	return &out
}

// changed is the SyncRequest naming the Service of port i.
func changed(snap *model.Snapshot, i int) dataplane.SyncRequest {
	return dataplane.SyncRequest{Changed: map[objects.Key]struct{}{snap.V4.Ports[i].ID.Service(): {}}}
}

func BenchmarkRender10k(b *testing.B) {
	snap := scaleSnapshot(10000, 10)
	cfg := testConfig()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		_ = render(cfg, snap.V4, snap.Node)
	}
}

// discardNFT accepts every transaction without doing anything (the fake's
// copy of the whole table per transaction would dominate the benchmark).
type discardNFT struct{ knftables.Interface }

func (discardNFT) Run(context.Context, *knftables.Transaction) error { return nil }

// BenchmarkIncrementalSync10k measures the user-space part of a
// one-endpoint change at 10k Services (kernel replaced by a no-op).
func BenchmarkIncrementalSync10k(b *testing.B) {
	snap := scaleSnapshot(10000, 10)
	fake := discardNFT{knftables.NewFake(knftables.IPv4Family, DefaultTableName)}
	p, _ := New(testConfig(), WithNFT(func(knftables.Family, string) (knftables.Interface, error) { return fake, nil }))
	ctx := context.Background()
	if err := p.Sync(ctx, snap, dataplane.SyncRequest{Full: true}); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	v := 0
	for b.Loop() {
		v++
		snap = withChangedEndpoint(snap, v%10000, v)
		if err := p.Sync(ctx, snap, changed(snap, v%10000)); err != nil {
			b.Fatal(err)
		}
	}
}

// TestPrivilegedScale loads n Services x 10 endpoints into a fresh
// namespace and times the cold sync and single-endpoint changes. It runs
// only with KPROXY_SCALE=1 (it takes a while at 10k).
func TestPrivilegedScale(t *testing.T) {
	if os.Getenv("KPROXY_SCALE") == "" {
		t.Skip("set KPROXY_SCALE=1 to measure cold load and single-change latency")
	}
	for _, n := range []int{1000, 10000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			tn := newTestNet(t)
			snap := scaleSnapshot(n, 10)
			p, _ := New(privConfig())
			start := time.Now()
			tn.sync(p, snap, dataplane.SyncRequest{Full: true})
			cold := time.Since(start)
			var lat []time.Duration
			for v := range 20 {
				i := (v * 397) % n
				snap = withChangedEndpoint(snap, i, v)
				req := changed(snap, i)
				s := time.Now()
				tn.sync(p, snap, req)
				lat = append(lat, time.Since(s))
			}
			slices.Sort(lat)
			t.Logf("%d Services x 10 endpoints: cold sync %v; one endpoint change p50 %v, max %v (of %d)", n, cold, lat[len(lat)/2], lat[len(lat)-1], len(lat))
			var drifted bool
			s0 := time.Now()
			tn.in(tn.node, func() { drifted, _ = p.Drifted(context.Background()) })
			t.Logf("%d Services: Drifted check %v (drifted=%v)", n, time.Since(s0), drifted)
			// A new Service and a new endpoint count: new chains, so the
			// kernel re-validates the table.
			more := withChangedEndpoint(snap, 1, 999)
			more.V4.Ports[1].Endpoints = more.V4.Ports[1].Endpoints[:5]
			categorize(more.V4.Ports[1])
			s0 = time.Now()
			tn.sync(p, more, changed(more, 1))
			t.Logf("%d Services: endpoint count change (new chain) %v", n, time.Since(s0))
			snap = more
			p2, _ := New(privConfig())
			s := time.Now()
			tn.sync(p2, snap, dataplane.SyncRequest{Full: true})
			t.Logf("%d Services: restart sync (read table, reuse) %v", n, time.Since(s))
		})
	}
}
