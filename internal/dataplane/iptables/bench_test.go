package iptables

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/objects"
)

// scaleSnapshot has n Services with eps endpoints each; every fourth has a
// NodePort. Cluster IPs are in 198.19.0.0/16 (and beyond for n > 65k).
func scaleSnapshot(n, eps int) *model.Snapshot {
	ports := make([]*model.ServicePort, 0, n)
	for i := 0; i < n; i++ {
		ip := netip.AddrFrom4([4]byte{198, 19, byte(i >> 8), byte(i)})
		var list []*model.Endpoint
		for j := 0; j < eps; j++ {
			k := i*eps + j
			a := 0xC6120000 + uint32(1024+k) // 198.18.4.0 onwards, inside 198.18.0.0/15
			ip := netip.AddrFrom4([4]byte{byte(a >> 24), byte(a >> 16), byte(a >> 8), byte(a)})
			list = append(list, ep(ip.String(), 8080, false))
		}
		opts := []spOpt{withEPs(list...)}
		if i%4 == 0 {
			opts = append(opts, withNodePort(uint16(30000+i/4%2768)))
		}
		ports = append(ports, svc("scale", "svc-"+strconv.Itoa(i), ip.String(), 80, opts...))
	}
	return snapshot(ports...)
}

func BenchmarkRender10k(b *testing.B) {
	snap := scaleSnapshot(10000, 10)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		rs := Render(testParams(), snap.V4, snap.Node)
		if len(rs.NAT) < 100000 {
			b.Fatal("too few chains")
		}
	}
}

// TestWriteScaleText writes the 1k/10k restore texts for manual timing
// (KPROXY_SCALE_TEXT=dir).
func TestWriteScaleText(t *testing.T) {
	dir := os.Getenv("KPROXY_SCALE_TEXT")
	if dir == "" {
		t.Skip("set KPROXY_SCALE_TEXT=dir to write scale restore inputs")
	}
	for _, n := range []int{1000, 10000} {
		snap := scaleSnapshot(n, 10)
		text := RestoreText(Render(testParams(), snap.V4, snap.Node))
		if err := os.WriteFile(fmt.Sprintf("%s/scale-%d.txt", dir, n), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func BenchmarkRenderText10k(b *testing.B) {
	snap := scaleSnapshot(10000, 10)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		_ = RestoreText(Render(testParams(), snap.V4, snap.Node))
	}
}

func changedKey(id model.PortID) dataplane.SyncRequest {
	return dataplane.SyncRequest{Changed: map[objects.Key]struct{}{id.Service(): {}}}
}

// BenchmarkPartialSync10k measures one endpoint change of one Service on a
// 10k × 10 state, against a fake kernel (render + diff + text, no exec).
func BenchmarkPartialSync10k(b *testing.B) {
	snap := scaleSnapshot(10000, 10)
	k := newFakeKernel()
	p, _ := New(testConfig(), WithExec(k), WithSysctl(fakeSysctl{}), WithBackend(BackendNFT))
	ctx := context.Background()
	if err := p.Sync(ctx, snap, dataplane.SyncRequest{Full: true}); err != nil {
		b.Fatal(err)
	}
	sp := snap.V4.Ports[0]
	orig := sp.Endpoints
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i%2 == 0 {
			sp.Endpoints = orig[:len(orig)-1]
		} else {
			sp.Endpoints = orig
		}
		categorize(sp)
		if err := p.Sync(ctx, snap, changedKey(sp.ID)); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	sp.Endpoints = orig
	categorize(sp)
}

// TestPrivilegedScale measures, in a node namespace, the cold start and the
// latency of single-Service partial syncs at 1k and 10k Services × 10
// endpoints, per backend. Opt-in: KPROXY_SCALE=1 (it takes minutes).
func TestPrivilegedScale(t *testing.T) {
	if os.Getenv("KPROXY_SCALE") == "" {
		t.Skip("set KPROXY_SCALE=1 to measure iptables at scale")
	}
	for _, b := range []Backend{BackendNFT, BackendLegacy} {
		for _, n := range []int{1000, 10000} {
			t.Run(fmt.Sprintf("%s/%d", b, n), func(t *testing.T) { measureScale(t, b, n) })
		}
	}
}

func measureScale(t *testing.T, b Backend, n int) {
	l := newNetLab(t)
	ex := NetnsExec{Namespace: l.node}
	p, _ := New(labConfig(), WithExec(ex), WithSysctl(ExecSysctl{Exec: ex}), WithBackend(b))
	snap := scaleSnapshot(n, 10)
	ctx := context.Background()
	start := time.Now()
	if err := p.Sync(ctx, snap, dataplane.SyncRequest{Full: true}); err != nil {
		t.Fatal(err)
	}
	cold := time.Since(start)
	sp := snap.V4.Ports[n/2]
	orig := sp.Endpoints
	var lat []time.Duration
	for i := 0; i < 20; i++ {
		sp.Endpoints = orig[:len(orig)-1-i%2]
		categorize(sp)
		s := time.Now()
		if err := p.Sync(ctx, snap, changedKey(sp.ID)); err != nil {
			t.Fatal(err)
		}
		lat = append(lat, time.Since(s))
	}
	s := time.Now()
	if d, err := p.Drifted(ctx); d || err != nil {
		t.Fatalf("drifted: %v %v", d, err)
	}
	drift := time.Since(s)
	slices.Sort(lat)
	t.Logf("backend=%s services=%d endpoints=%d cold=%v partial p50=%v p95=%v max=%v drifted-check=%v",
		b, n, n*10, cold.Round(time.Millisecond), lat[len(lat)/2].Round(time.Millisecond),
		lat[len(lat)*95/100].Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond), drift.Round(time.Millisecond))
}
