package nftables

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/dataplane/dptest"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/nfnl"
	"github.com/kproxy/kproxy/internal/objects"
)

// scaleSnapshot is the scale tests' shape, shared with every dataplane
// (dptest.ScaleSnapshot).
func scaleSnapshot(n, eps int) *model.Snapshot { return dptest.ScaleSnapshot(n, eps) }

// withChangedEndpoint returns snap with Service i's endpoints replaced by a
// new (version-numbered) list; every other port is shared.
func withChangedEndpoint(snap *model.Snapshot, i, version int) *model.Snapshot {
	fs := *snap.V4
	fs.Ports = slices.Clone(fs.Ports)
	old := fs.Ports[i]
	next := *old
	next.Endpoints = append(slices.Clone(old.Endpoints[1:]), dptest.EP(fmt.Sprintf("198.18.127.%d", version%250+1), 8080, false))
	dptest.Categorize(&next)
	fs.Ports[i] = &next
	out := *snap
	out.V4 = &fs
	return &out
}

// withEndpoints returns snap with port i's endpoints set to eps; every
// other port is shared.
func withEndpoints(snap *model.Snapshot, i int, eps []*model.Endpoint) *model.Snapshot {
	fs := *snap.V4
	fs.Ports = slices.Clone(fs.Ports)
	next := *fs.Ports[i]
	next.Endpoints = eps
	dptest.Categorize(&next)
	fs.Ports[i] = &next
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
	cfg := dptest.Config()
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
	p, _ := New(dptest.Config(), WithNFT(func(knftables.Family, string) (knftables.Interface, error) { return fake, nil }))
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

// BenchmarkColdSync10k measures the user-space part of a cold full sync at
// 10k Services x 10 endpoints: render, diff against an empty kernel, and
// encoding the netlink batches (not sent): the stages and the final one.
func BenchmarkColdSync10k(b *testing.B) {
	snap := scaleSnapshot(10000, 10)
	cfg := dptest.Config()
	ctx := context.Background()
	fake := &knftKernel{nft: knftables.NewFake(knftables.IPv4Family, DefaultTableName)}
	sets := newNLKernel(model.IPv4, DefaultTableName, &genTracker{}).sets
	b.ReportAllocs()
	for b.Loop() {
		st := newFamState(model.IPv4, fake)
		var t txn
		pool := &nfnl.Pool{}
		encode := func(stage func() opList) bool {
			nl := newNetlinkReader(model.IPv4, DefaultTableName)
			batch, err := nl.encodePooled(stage(), sets, pool)
			if err != nil {
				b.Fatal(err)
			}
			batch.Release()
			return true
		}
		if err := st.readIfUnsure(ctx); err != nil {
			b.Fatal(err)
		}
		st.renderFull(cfg, snap.V4, snap.Node, &t, encode)
	}
}

// TestPrivilegedScale loads n Services x 10 endpoints into a fresh
// namespace over netlink and reports: the kernel's commit of the cold
// sync's batches alone (encoded beforehand, the floor of a cold sync) and
// the user-space work that made them; cold sync time and the process's
// peak RSS during it, single-endpoint change latency (p50/p99 of 200),
// Drifted cost (nothing committed since the last check, and after a
// foreign commit), a new-chain change, and a restart sync. It runs only
// with KPROXY_SCALE=1 (sizes: KPROXY_SCALE_SIZES, default "1000,10000";
// endpoints per Service: KPROXY_SCALE_ENDPOINTS, default 10; TCP
// endpoint-ranges maps: KPROXY_SCALE_TCP_SHARDS, default shardCount's;
// KPROXY_SCALE_CPU=file writes the cold sync's CPU profile).
//
//	sudo KPROXY_SCALE=1 KPROXY_SCALE_SIZES=10000 KPROXY_SCALE_ENDPOINTS=100 \
//	  go test -run 'TestPrivilegedScale$' -v -timeout 30m ./internal/dataplane/nftables/
func TestPrivilegedScale(t *testing.T) {
	if os.Getenv("KPROXY_SCALE") == "" {
		t.Skip("set KPROXY_SCALE=1 to measure cold load and single-change latency")
	}
	for _, n := range dptest.ScaleSizes(t, "1000,10000") {
		t.Run(fmt.Sprint(n), func(t *testing.T) { scaleRun(t, n) })
	}
}

// setTCPShards changes how many TCP endpoint-ranges maps there are, for
// measuring shardCount (KPROXY_SCALE_TCP_SHARDS in the scale tests).
func setTCPShards(t testing.TB) {
	env := os.Getenv("KPROXY_SCALE_TCP_SHARDS")
	if env == "" {
		return
	}
	n, err := strconv.Atoi(env)
	if err != nil || n < 1 || n > 9999 {
		t.Fatalf("KPROXY_SCALE_TCP_SHARDS: %q is not a map count", env)
	}
	shardCount["tcp"] = n
	shardNames = makeShardNames()
	sharedSets = makeSharedSets()
	sharedMaps = makeSharedMaps()
}

// scaleEndpoints is the endpoints per Service of the scale tests.
func scaleEndpoints(t testing.TB) int {
	env := cmp.Or(os.Getenv("KPROXY_SCALE_ENDPOINTS"), "10")
	eps, err := strconv.Atoi(env)
	if err != nil || eps < 0 {
		t.Fatalf("KPROXY_SCALE_ENDPOINTS: %q is not an endpoint count", env)
	}
	return eps
}

func scaleRun(t *testing.T, n int) {
	tn := newTestNet(t)
	eps := scaleEndpoints(t)
	setTCPShards(t)
	commitFloor(t, tn, "no table loaded")
	for _, phase := range []string{"prepared", "cold", "restart"} {
		if w := dptest.WaitKernelQuiet(30 * time.Second); w > time.Second {
			t.Logf("waited %v for the kernel to finish earlier teardowns", w.Round(time.Millisecond))
		}
		r := scaleChild(t, tn.Node, phase, n)
		if phase == "prepared" {
			t.Logf("%d Services x %d endpoints: the cold sync's %d batches (%d operations) committed alone %v (the kernel's floor); making them took %v",
				n, eps, r.batches, r.ops, r.commit.Round(time.Millisecond), r.sync.Round(time.Millisecond))
			dptest.Run(t, "ip", "netns", "exec", tn.Node, "nft", "delete", "table", "ip", DefaultTableName)
			continue
		}
		t.Logf("%d Services x %d endpoints: %s sync %v in a fresh process; its peak RSS %d MiB (GOMEMLIMIT=%q)",
			n, eps, phase, r.sync.Round(time.Millisecond), r.rss>>20, os.Getenv("GOMEMLIMIT"))
	}
	snap := scaleSnapshot(n, eps)
	p, _ := New(privConfig())
	start := time.Now()
	tn.sync(p, snap, dataplane.SyncRequest{Full: true})
	t.Logf("%d Services: restart sync in this process (read table, reuse) %v", n, time.Since(start).Round(time.Millisecond))
	drifted := func(label string, want bool) {
		var d bool
		var err error
		s0 := time.Now()
		tn.In(tn.Node, func() { d, err = p.Drifted(context.Background()) })
		if err != nil || d != want {
			t.Fatalf("Drifted %s = %v, %v; want %v", label, d, err, want)
		}
		t.Logf("%d Services: Drifted %s: %v", n, label, time.Since(s0))
	}
	changes := func(label string, from int) {
		var lat []time.Duration
		for v := from; v < from+200; v++ {
			i := (v * 397) % n
			snap = withChangedEndpoint(snap, i, v)
			req := changed(snap, i)
			s := time.Now()
			tn.sync(p, snap, req)
			lat = append(lat, time.Since(s))
		}
		slices.Sort(lat)
		t.Logf("%d Services: one endpoint change, Sync to kernel, %s: p50 %v, p99 %v, max %v (of %d)", n, label,
			lat[len(lat)/2], lat[len(lat)*99/100], lat[len(lat)-1], len(lat))
	}
	changes("no monitor", 0)
	// The daemon bench's change: a Service's only endpoint comes and goes
	// (its frontends move in and out of the no-endpoints sets).
	var emptied, refilled []time.Duration
	for v := range 200 {
		i := (v / 2 * 397) % n
		if v%2 == 0 {
			snap = withEndpoints(snap, i, nil)
		} else {
			snap = withEndpoints(snap, i, []*model.Endpoint{dptest.EP("198.18.126.1", 8080, false)})
		}
		req := changed(snap, i)
		s := time.Now()
		tn.sync(p, snap, req)
		if v%2 == 0 {
			emptied = append(emptied, time.Since(s))
		} else {
			refilled = append(refilled, time.Since(s))
		}
	}
	for _, l := range [][]time.Duration{emptied, refilled} {
		slices.Sort(l)
	}
	t.Logf("%d Services: a Service's last endpoint removed / its first added, Sync to kernel: p50 %v / %v, p99 %v / %v",
		n, emptied[len(emptied)/2], refilled[len(refilled)/2], emptied[len(emptied)*99/100], refilled[len(refilled)*99/100])
	commitFloor(t, tn, fmt.Sprintf("%d Services", n))
	// The first Drifted opens the monitor: the kernel then builds a
	// notification of every change kproxy commits.
	drifted("first check (opens the monitor, checks by name)", false)
	changes("monitor listening", 200)
	drifted("after kproxy's own syncs", false)
	drifted("nothing committed since", false)
	dptest.Run(t, "ip", "netns", "exec", tn.Node, "nft", "add", "table", "ip", "someone-else")
	drifted("after a foreign commit to another table", false)
	var victim string
	for name := range p.fams[model.IPv4].kChains {
		if strings.HasPrefix(name, "svc-") {
			victim = name
			break
		}
	}
	dptest.Run(t, "ip", "netns", "exec", tn.Node, "nft", "flush", "chain", "ip", DefaultTableName, victim)
	drifted("after one Service chain was flushed", true)
	s1 := time.Now()
	tn.sync(p, snap, dataplane.SyncRequest{Full: true})
	t.Logf("%d Services: repair (full sync re-reading the kernel, rewriting the flushed chain) %v", n, time.Since(s1))
	drifted("after the repair", false)
	// A new endpoint count, then none at all, then one again: map and set
	// elements only (no chain, rule or goto element, so no re-validation
	// of the table by the kernel).
	for _, count := range []int{5, 0, 1} {
		next := withChangedEndpoint(snap, 1, 999)
		next.V4.Ports[1].Endpoints = next.V4.Ports[1].Endpoints[:count]
		dptest.Categorize(next.V4.Ports[1])
		s0 := time.Now()
		tn.sync(p, next, changed(next, 1))
		t.Logf("%d Services: endpoint count change to %d %v", n, count, time.Since(s0))
	}
}

// childResult is what one scaleChild process measured.
type childResult struct {
	sync, commit time.Duration
	batches, ops int
	rss          int
}

// scaleChild runs one full sync of the scale snapshot in a child process
// (so that its peak RSS is the sync's alone) inside namespace ns. Phase
// "prepared" encodes the sync's batches without sending them, then times
// their commit alone.
func scaleChild(t *testing.T, ns, phase string, n int) childResult {
	cmd := exec.Command(os.Args[0], "-test.run", "^TestPrivilegedScaleChild$", "-test.v")
	cmd.Env = append(os.Environ(), "KPROXY_SCALE_CHILD="+fmt.Sprintf("%s,%d,%s", phase, n, ns))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s child: %v\n%s", phase, err, out)
	}
	var r childResult
	for _, l := range strings.Split(string(out), "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(l), "=")
		if !ok {
			continue
		}
		i, _ := strconv.ParseInt(v, 10, 64)
		switch k {
		case "SYNC_NS":
			r.sync = time.Duration(i)
		case "COMMIT_NS":
			r.commit = time.Duration(i)
		case "BATCHES":
			r.batches = int(i)
		case "OPS":
			r.ops = int(i)
		}
	}
	r.rss = int(cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss) << 10
	return r
}

// preparedKernel encodes the batches a sync would send and keeps them
// instead of sending them.
type preparedKernel struct {
	*nlKernel
	batches []*nlBatch
	ops     int
}

func (k *preparedKernel) Apply(_ context.Context, ops opList) error {
	if ops.len() == 0 {
		return nil
	}
	b, err := k.nl.encode(ops, k.sets)
	if err != nil {
		return err
	}
	k.batches, k.ops = append(k.batches, b), k.ops+ops.len()
	return nil
}

func (k *preparedKernel) ApplyStages(ctx context.Context, stages <-chan func() opList) error {
	for stage := range stages {
		if err := k.Apply(ctx, stage()); err != nil {
			return err
		}
	}
	return nil
}

// TestPrivilegedScaleChild is scaleChild's process: one full sync.
func TestPrivilegedScaleChild(t *testing.T) {
	env := os.Getenv("KPROXY_SCALE_CHILD")
	if env == "" {
		t.Skip("only run by TestPrivilegedScale")
	}
	f := strings.Split(env, ",")
	n, _ := strconv.Atoi(f[1])
	setTCPShards(t)
	snap := scaleSnapshot(n, scaleEndpoints(t))
	p, _ := New(privConfig())
	var prepared *preparedKernel
	if f[0] == "prepared" {
		st, err := p.family(model.IPv4)
		if err != nil {
			t.Fatal(err)
		}
		prepared = &preparedKernel{nlKernel: st.kern.(*nlKernel)}
		st.kern = prepared
	}
	if path := os.Getenv("KPROXY_SCALE_CPU"); path != "" && f[0] == "cold" {
		if err := pprof.StartCPUProfile(profileFile(t, path)); err != nil {
			t.Fatal(err)
		}
		defer pprof.StopCPUProfile()
	}
	start := time.Now()
	var err error
	dptest.InNamespace(t, f[2], func() { err = p.Sync(context.Background(), snap, dataplane.SyncRequest{Full: true}) })
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("SYNC_NS=%d\n", time.Since(start).Nanoseconds())
	if prepared != nil {
		start = time.Now()
		dptest.InNamespace(t, f[2], func() {
			for _, b := range prepared.batches {
				if err = b.send(); err != nil {
					return
				}
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("COMMIT_NS=%d\nBATCHES=%d\nOPS=%d\n", time.Since(start).Nanoseconds(), len(prepared.batches), prepared.ops)
	}
	if path := os.Getenv("KPROXY_SCALE_HEAP"); path != "" {
		// What a synced proxier keeps (the snapshot is the model's, not ours).
		runtime.GC()
		if err := pprof.WriteHeapProfile(profileFile(t, path)); err != nil {
			t.Fatal(err)
		}
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		fmt.Printf("HEAP_INUSE=%d (%d MiB)\n", ms.HeapAlloc, ms.HeapAlloc>>20)
		runtime.KeepAlive(p)
		runtime.KeepAlive(snap)
	}
}

// profileFile creates a profile's file, closed when the test ends.
func profileFile(t *testing.T, path string) *os.File {
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// commitFloor logs what the kernel takes to commit a transaction that
// changes nothing of kproxy's: one element added to (and, the next time,
// deleted from) a set of a table of its own. It is the floor under any
// change kproxy commits in that namespace.
func commitFloor(t *testing.T, tn *testNet, label string) {
	t.Helper()
	const table, set = "kproxy-commit-floor", "s"
	dptest.Run(t, "ip", "netns", "exec", tn.Node, "nft", "add table ip "+table+"; add set ip "+table+" "+set+" { type ipv4_addr; }")
	var lat, cold []time.Duration
	var err error
	evict := make([]byte, 256<<20)
	tn.In(tn.Node, func() {
		for i := range 400 {
			if i >= 200 {
				// The daemon commits a change now and then, between
				// other work: its commit finds the kernel's objects out
				// of the CPU caches. Evict them as that work would.
				for j := 0; j < len(evict); j += 64 {
					evict[j]++
				}
			}
			typ := uint16(unix.NFT_MSG_NEWSETELEM)
			if i%2 == 1 {
				typ = unix.NFT_MSG_DELSETELEM
			}
			b := nfnl.NewBatch(unix.NFPROTO_IPV4, nil, 0)
			m := b.Msg(typ, unix.NLM_F_CREATE)
			b.AttrStr(unix.NFTA_SET_ELEM_LIST_TABLE, table)
			b.AttrStr(unix.NFTA_SET_ELEM_LIST_SET, set)
			l := b.Nest(unix.NFTA_SET_ELEM_LIST_ELEMENTS)
			e := b.Nest(unix.NFTA_LIST_ELEM)
			b.Value(unix.NFTA_SET_ELEM_KEY, []byte{198, 18, 0, 1})
			b.End(e)
			b.End(l)
			b.Finish(m)
			s := time.Now()
			if err = b.Send(); err != nil {
				return
			}
			if i < 200 {
				lat = append(lat, time.Since(s))
			} else {
				cold = append(cold, time.Since(s))
			}
		}
	})
	if err != nil {
		t.Fatalf("committing an element of a table of its own: %v", err)
	}
	dptest.Run(t, "ip", "netns", "exec", tn.Node, "nft", "delete", "table", "ip", table)
	var chains []string
	tn.In(tn.Node, func() { chains, err = nfnl.ChainNames(unix.NFPROTO_IPV4, DefaultTableName) })
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(lat)
	slices.Sort(cold)
	t.Logf("%s (%d chains): a commit that changes nothing of kproxy's (the kernel's floor under a change): back to back p50 %v, p99 %v; after 256 MiB of other memory p50 %v, p99 %v (of %d each)",
		label, len(chains), lat[len(lat)/2], lat[len(lat)*99/100], cold[len(cold)/2], cold[len(cold)*99/100], len(lat))
}
