package iptables

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/dataplane/dptest"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/nfnl"
	"github.com/kproxy/kproxy/internal/objects"
)

// scaleSnapshot is the scale tests' shape, shared with every dataplane
// (dptest.ScaleSnapshot).
func scaleSnapshot(n, eps int) *model.Snapshot { return dptest.ScaleSnapshot(n, eps) }

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

// BenchmarkEncodeNetlink10k: the nat table of 10k Services × 10 endpoints
// as netlink messages, on pooled chunks as a full sync writes them.
func BenchmarkEncodeNetlink10k(b *testing.B) {
	snap := scaleSnapshot(10000, 10)
	rs := Render(testParams(), snap.V4, snap.Node)
	w := []*tableWrite{{table: tableNAT, chains: rs.NAT}}
	pool := &nfnl.Pool{}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		batch, err := encodeSections(model.IPv4, w, pool)
		if err != nil {
			b.Fatal(err)
		}
		batch.Release()
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
	p, _ := New(dptest.Config(), WithExec(k), WithSysctl(fakeSysctl{}), WithBackend(BackendNFT))
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
		dptest.Categorize(sp)
		if err := p.Sync(ctx, snap, changedKey(sp.ID)); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	sp.Endpoints = orig
	dptest.Categorize(sp)
}

// TestPrivilegedScale measures, in a node namespace, the cold start, the
// latency of single-Service partial syncs, the drift check and the rate of
// new connections through one Service, at 10, 1k and 10k Services × 10
// endpoints, per backend. Opt-in: KPROXY_SCALE=1 (it takes minutes);
// KPROXY_SCALE_SIZES (e.g. "10,10000") and KPROXY_SCALE_BACKENDS ("nft")
// narrow it; KPROXY_SCALE_AFFINITY=1 gives every tenth Service ClientIP
// affinity, as the scale benchmark does.
func TestPrivilegedScale(t *testing.T) {
	if os.Getenv("KPROXY_SCALE") == "" {
		t.Skip("set KPROXY_SCALE=1 to measure iptables at scale")
	}
	backends := "nft,legacy"
	if v := os.Getenv("KPROXY_SCALE_BACKENDS"); v != "" {
		backends = v
	}
	for _, b := range strings.Split(backends, ",") {
		for _, n := range dptest.ScaleSizes(t, "10,1000,10000") {
			t.Run(fmt.Sprintf("%s/%d", b, n), func(t *testing.T) { measureScale(t, Backend(b), n) })
		}
	}
}

func measureScale(t *testing.T, b Backend, n int) {
	l := dptest.NewLab(t, labPrefix)
	ex := NetnsExec{Namespace: l.Node}
	p, _ := New(labConfig(), WithExec(ex), WithSysctl(ExecSysctl{Exec: ex}), WithBackend(b))
	snap := scaleSnapshot(n, 10)
	// The middle Service gets the lab's real pod as its only endpoint, for
	// the connection rate.
	probe := snap.V4.Ports[n/2]
	probe.Endpoints = []*model.Endpoint{dptest.EP("198.18.64.10", 8080, true)}
	dptest.Categorize(probe)
	l.Serve("198.18.64.10:8080", "x")
	ctx := context.Background()
	base := heapInuse(true)
	peak := sampleHeap()
	start, ru0 := time.Now(), childCPU()
	if err := p.Sync(ctx, snap, dataplane.SyncRequest{Full: true}); err != nil {
		t.Fatal(err)
	}
	cold, coldCPU := time.Since(start), childCPU().sub(ru0)
	t.Logf("heap: peak during the cold sync %d MiB above the snapshot's, kept after it %d MiB",
		(peak()-base)>>20, (heapInuse(true)-base)>>20)
	rate := connRate(t, l, probe.ClusterIP.String()+":80", 2*time.Second)
	sp := snap.V4.Ports[n/3]
	orig := sp.Endpoints
	var lat []time.Duration
	for i := 0; i < 40; i++ {
		sp.Endpoints = orig[:len(orig)-1-i%2]
		dptest.Categorize(sp)
		s := time.Now()
		if err := p.Sync(ctx, snap, changedKey(sp.ID)); err != nil {
			t.Fatal(err)
		}
		lat = append(lat, time.Since(s))
	}
	// A restart: a new proxier's first (full) sync over the loaded table.
	p2, _ := New(labConfig(), WithExec(ex), WithSysctl(ExecSysctl{Exec: ex}), WithBackend(b))
	s, ru1 := time.Now(), childCPU()
	if err := p2.Sync(ctx, snap, dataplane.SyncRequest{Full: true}); err != nil {
		t.Fatal(err)
	}
	restart, restartCPU := time.Since(s), childCPU().sub(ru1)
	t.Logf("restart: full sync over the loaded table %v, child CPU %s", restart.Round(time.Millisecond), restartCPU)
	s = time.Now()
	if d, err := p.Drifted(ctx); d || err != nil {
		t.Fatalf("drifted: %v %v", d, err)
	}
	drift := time.Since(s)
	var nl, floor time.Duration
	if b == BackendNFT {
		// The kernel's floor under any nat commit: one new, unreferenced
		// chain with one RETURN still re-validates the whole table.
		w := &tableWrite{table: tableNAT, chains: []*Chain{{Name: "KUBE-PROXY-FLOOR", Rules: []rule{rb().ret()}}}}
		batch, err := encodeSections(model.IPv4, []*tableWrite{w}, nil)
		if err != nil {
			t.Fatal(err)
		}
		s := time.Now()
		if err := ex.InNamespace(batch.Send); err != nil {
			t.Fatal(err)
		}
		floor = time.Since(s)
		l.In(l.Node, func() {
			s := time.Now()
			for _, table := range []string{tableMangle, tableFilter, tableNAT} {
				if !netlinkCanaryOK(model.IPv4, table, canaryMarks[table]) {
					t.Errorf("netlink canary missing in %s", table)
				}
			}
			nl = time.Since(s)
		})
	}
	slices.Sort(lat)
	t.Logf("cold start child CPU: %s", coldCPU)
	t.Logf("backend=%s services=%d endpoints=%d cold=%v partial p50=%v p99=%v max=%v commit floor=%v drift-check exec=%v netlink=%v new-conn/s=%.0f",
		b, n, n*10, cold.Round(time.Millisecond), lat[len(lat)/2].Round(time.Millisecond),
		lat[len(lat)*99/100].Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond), floor.Round(time.Millisecond),
		drift.Round(time.Millisecond), nl.Round(time.Microsecond), rate)
}

// connRate opens and closes TCP connections to addr from the client
// namespace, one after the other, for d, and returns connections per second.
func connRate(t testing.TB, l *dptest.Lab, addr string, d time.Duration) float64 {
	var count, failed int
	l.In(l.Client, func() {
		end := time.Now().Add(d)
		for time.Now().Before(end) {
			c, err := net.DialTimeout("tcp", addr, time.Second)
			if err != nil {
				// Thousands of connections from one client to one address
				// reuse source ports whose conntrack entries still linger;
				// a rare lost SYN is that, not the rules.
				failed++
				if failed > 3 {
					t.Errorf("connection %d to %s: %v (%d failures)", count, addr, err, failed)
					return
				}
				continue
			}
			_, _ = io.ReadAll(c)
			c.Close()
			count++
		}
	})
	return float64(count) / d.Seconds()
}

// heapInuse returns the bytes of in-use heap spans, after a collection
// when gc is set.
func heapInuse(gc bool) uint64 {
	if gc {
		runtime.GC()
	}
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// sampleHeap samples the in-use heap every 5 ms until the returned function
// is called, which returns the largest sample.
func sampleHeap() func() uint64 {
	stop, done := make(chan struct{}), make(chan uint64)
	go func() {
		var max uint64
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			if h := heapInuse(false); h > max {
				max = h
			}
			select {
			case <-stop:
				done <- max
				return
			case <-tick.C:
			}
		}
	}()
	return func() uint64 { close(stop); return <-done }
}

// cpuTimes is the user and system CPU of a process's waited-for children.
type cpuTimes struct{ user, sys time.Duration }

func childCPU() cpuTimes {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru)
	return cpuTimes{time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano())}
}

func (c cpuTimes) sub(o cpuTimes) cpuTimes { return cpuTimes{c.user - o.user, c.sys - o.sys} }

func (c cpuTimes) String() string {
	return fmt.Sprintf("user %v sys %v", c.user.Round(time.Millisecond), c.sys.Round(time.Millisecond))
}
