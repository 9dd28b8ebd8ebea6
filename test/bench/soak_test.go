//go:build e2e

package bench

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/kproxy/kproxy/test/testbed/netbed"
)

// TestSoak is the long run: kproxy on node1 with BENCH_SERVICES ×
// BENCH_ENDPOINTS, then SOAK_DURATION (default 5m) of steady churn at
// SOAK_RATE changes per second (default 10): three in four changes move
// one bulk Service's endpoints, one in four creates a Service (and, once
// 50 exist, deletes the oldest it created); SOAK_CREATE_EVERY=N makes it
// one in N, and 0 endpoint changes only (the sustained-churn
// shape). It samples kproxy's RSS and
// goroutines every 10 s and its sync durations per window, and reports
// the slopes over the run after the first tenth (warm-up). It fails when
// kproxy exits, when its goroutines grow past the warm-up count + 20 (a
// leak), when syncs do not coalesce the changes (more syncs than half the
// changes), or when the kernel does not hold every live Service within
// 30 s of the last change. Timings, CPU and RSS are reported, not judged:
// sync durations, and the network programming latency of the endpoint
// changes (the slices carry the EndpointSlice controller's trigger-time
// annotation) with kproxy's CPU over the churn. The sustained-churn
// figure of docs/performance.md:
//
//	make e2e-long SOAK_SERVICES=10000 SOAK_DURATION=60s SOAK_RATE=100
//	make e2e-long SOAK_SERVICES=10000 SOAK_DURATION=60s SOAK_RATE=100 SOAK_CREATE_EVERY=0 \
//		BENCH_PROXY_FLAGS=--iptables-min-sync-period=0
//
// BENCH_PROFILE=<dir> saves a CPU profile of kproxy over the churn's
// first minute there (four fifths of it). BENCH_PROXY_FLAGS adds flags to kproxy's (e.g.
// --iptables-min-sync-period=0, which nftables mode takes too, as
// upstream); the coalescing check is then skipped.
//
//	make e2e-long                                         # 1k Services, 5 min (CI)
//	make e2e-long SOAK_SERVICES=10000 SOAK_DURATION=60m   # the hour at 10k
func TestSoak(t *testing.T) {
	if os.Getenv("KPROXY_SOAK") == "" {
		t.Skip("long run: run it with `make e2e-long` (KPROXY_SOAK=1)")
	}
	netbed.RequireRoot(t)
	p, err := loadParams()
	if err != nil {
		t.Fatal(err)
	}
	duration, err := time.ParseDuration(envOr("SOAK_DURATION", "5m"))
	if err != nil {
		t.Fatalf("SOAK_DURATION: %v", err)
	}
	rate, err := strconv.ParseFloat(envOr("SOAK_RATE", "10"), 64)
	if err != nil || rate <= 0 {
		t.Fatalf("SOAK_RATE: %q is not a positive rate", os.Getenv("SOAK_RATE"))
	}
	createEvery, err := strconv.Atoi(envOr("SOAK_CREATE_EVERY", "4"))
	if err != nil || createEvery < 0 {
		t.Fatalf("SOAK_CREATE_EVERY: %q is not a count (0: no Service created)", os.Getenv("SOAK_CREATE_EVERY"))
	}
	p.kproxyBin = privateCopy(t, p.kproxyBin)
	c := config{proxy: "kproxy", mode: p.modes[0]}
	s := newSuite(t, p)
	s.createBulk(t)
	ctx := context.Background()
	rb := newRunBed(t, p)
	if err := s.resetProbe(); err != nil {
		t.Fatal(err)
	}
	var extra []string
	if p.profile != "" {
		extra = []string{"--profiling"}
	}
	began, err := rb.start(p.binary(c.proxy), c.mode, kubeconfigFor(t, s.cp), extra...)
	if err != nil {
		t.Fatal(err)
	}
	defer rb.stop()
	smp := startSampler(rb.proc.PID(), time.Second)
	defer smp.close()
	f := newFigures()
	if !rb.measureColdStart(ctx, c, p, s.objs, f, began, smp, smp.phaseStart()) {
		t.Fatalf("cold start: %s", strings.Join(f.notes, "; "))
	}
	t.Logf("soak: %s %s: cold start %.2f s; churn for %v at %.0f changes/s", p.size(), c, f.values["cold_start_s"], duration, rate)

	limit := narrowServices
	if p.services > narrowServices {
		limit = maxServices // the bench added the wide range
	}
	ch := newChurn(s, p.services, limit)
	ch.createEvery = createEvery
	var samples []soakSample
	var windows []float64 // sync p99 per window, ms
	window := max(duration/10, time.Minute)
	syncs0, err := scrapeHistograms(ctx, rb.node.Netns, metricSync, metricProgrammingFine)
	if err != nil {
		t.Fatal(err)
	}
	u0 := smp.phaseStart()
	if p.profile != "" {
		go rb.captureProfile(t, filepath.Join(p.profile, "soak-churn.cpu.pprof"), fmt.Sprintf("profile?seconds=%d", max(1, int(min(duration, time.Minute).Seconds()*0.8))))
	}
	prevSyncs := syncs0
	start := time.Now()
	tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer tick.Stop()
	nextSample, nextWindow := start, start.Add(window)
	for now := range tick.C {
		if now.Sub(start) >= duration {
			break
		}
		if err := rb.exited(); err != nil {
			t.Fatal(err)
		}
		if err := ch.step(ctx); err != nil {
			t.Fatalf("change %d: %v", ch.changes, err)
		}
		if now.After(nextSample) {
			samples = append(samples, rb.soakSample(ctx, now.Sub(start)))
			nextSample = nextSample.Add(10 * time.Second)
		}
		if now.After(nextWindow) {
			if h, err := scrapeHistograms(ctx, rb.node.Netns, metricSync); err == nil {
				d := h[metricSync].sub(prevSyncs[metricSync])
				windows = append(windows, d.quantile(0.99)*1000)
				prevSyncs = h
			}
			nextWindow = nextWindow.Add(window)
		}
	}
	if err := ch.wait(); err != nil {
		t.Fatalf("churn: %v", err)
	}
	churned := time.Since(start)
	cpu, _, _ := smp.phaseEnd(u0)
	samples = append(samples, rb.soakSample(ctx, churned))

	// No backlog: the kernel holds every live Service soon after.
	want := ch.liveIPs()
	if _, err := rb.waitKernel(ctx, c, want, time.Now().Add(30*time.Second)); err != nil {
		t.Errorf("30 s after the churn the kernel lacks live Services: %v", err)
	}
	end, err := scrapeHistograms(ctx, rb.node.Netns, metricSync, metricProgrammingFine)
	if err != nil {
		t.Fatal(err)
	}
	syncs := end[metricSync].sub(syncs0[metricSync])
	prog := end[metricProgrammingFine].sub(syncs0[metricProgrammingFine])

	warm := samples[:0:0]
	for _, x := range samples {
		if x.at >= churned/10 {
			warm = append(warm, x)
		}
	}
	rssSlope := slope(warm, func(x soakSample) float64 { return x.rssMiB }) * 3600
	grSlope := slope(warm, func(x soakSample) float64 { return float64(x.goroutines) }) * 3600
	first, last := warm[0], warm[len(warm)-1]
	// Each sync is observed once per IP family.
	nSyncs := syncs.count / float64(max(syncs.series, 1))
	t.Logf("soak: %d changes in %v, %.1f/s (%d Services created, %d deleted); %0.f syncs (%.1f changes per sync); proxy flags %q",
		ch.changes, churned.Round(time.Second), float64(ch.changes)/churned.Seconds(), ch.created, ch.deleted, nSyncs,
		float64(ch.changes)/math.Max(nSyncs, 1), p.proxyFlags)
	t.Logf("soak: RSS %.1f MiB after warm-up, %.1f MiB at the end, slope %+.1f MiB/h; goroutines %d -> %d, slope %+.1f/h",
		first.rssMiB, last.rssMiB, rssSlope, first.goroutines, last.goroutines, grSlope)
	t.Logf("soak: sync p99 per %v window (ms): %s; over the run: p50 %.1f ms, p99 %.1f ms",
		window, fmtList(windows), syncs.quantile(0.5)*1000, syncs.quantile(0.99)*1000)
	t.Logf("soak: endpoint changes live (network programming, slice trigger time -> synced): %.0f observed, p50 %.1f ms, p99 %.1f ms (histogram buckets); kproxy CPU during the churn %.2f s = %.2f cores",
		prog.count, prog.quantile(0.5)*1000, prog.quantile(0.99)*1000, cpu.Seconds(), cpu.Seconds()/churned.Seconds())
	for _, x := range samples {
		if x.goroutines > first.goroutines+20 {
			t.Errorf("goroutines grew from %d after warm-up to %d at %v: a leak", first.goroutines, x.goroutines, x.at.Round(time.Second))
			break
		}
	}
	if len(p.proxyFlags) == 0 && nSyncs > float64(ch.changes)/2 { // minSyncPeriod 1 s
		t.Errorf("%.0f syncs for %d changes: the queue does not coalesce", nSyncs, ch.changes)
	}
}

// churn makes the soak's changes. The loop decides each change in turn;
// its API calls run in the background, at most churnInFlight at once, so
// the rate does not depend on the API server's round trip.
type churn struct {
	s                         *suite
	changes, created, deleted int
	next                      int   // index of the next Service to create
	limit                     int   // index past the last Service it may create
	extra                     []int // created Services, oldest first
	createEvery               int   // every createEvery-th change creates a Service; 0: none
	wg                        sync.WaitGroup
	inFlight                  chan struct{}
	failed                    chan error
}

// maxExtra is how many created Services live at once.
const maxExtra = 50

// churnInFlight bounds the changes under way: a step waits for a free
// place (and the achieved rate, reported, falls short of the asked one).
const churnInFlight = 16

func newChurn(s *suite, next, limit int) *churn {
	return &churn{s: s, next: next, limit: limit, inFlight: make(chan struct{}, churnInFlight), failed: make(chan error, 1)}
}

// step starts the next change; it returns the first error of an earlier one.
func (c *churn) step(ctx context.Context) error {
	select {
	case err := <-c.failed:
		return err
	default:
	}
	c.changes++
	w := c.s.writers[c.changes%len(c.s.writers)]
	var do func() error
	if c.createEvery > 0 && c.changes%c.createEvery == 0 && c.next < c.limit {
		old := -1
		if len(c.extra) == maxExtra {
			old = c.extra[0]
			c.extra = c.extra[1:]
			c.deleted++
		}
		i := c.next
		c.extra = append(c.extra, i)
		c.next++
		c.created++
		do = func() error {
			if old >= 0 {
				if err := w.CoreV1().Services(benchNS).Delete(ctx, serviceName(old), metav1.DeleteOptions{}); err != nil {
					return err
				}
				if err := w.DiscoveryV1().EndpointSlices(benchNS).Delete(ctx, serviceName(old)+"-1", metav1.DeleteOptions{}); err != nil {
					return err
				}
			}
			return c.s.objs.create(ctx, w, i)
		}
	} else {
		// Move one bulk Service's endpoints by one place in the fake range.
		o := c.s.objs
		i := (c.changes * 7919) % o.n
		for o.sample[i] {
			i = (i + 1) % o.n
		}
		shift := c.changes
		do = func() error {
			slices := w.DiscoveryV1().EndpointSlices(benchNS)
			return retry.RetryOnConflict(retry.DefaultRetry, func() error {
				cur, err := slices.Get(ctx, serviceName(i)+"-1", metav1.GetOptions{})
				if err != nil {
					return err
				}
				want := o.slice(o.service(i), i)
				for j := range want.Endpoints {
					want.Endpoints[j] = fakeEndpoint((i*o.m + j + shift) % fakeEndpointSpace)
				}
				want.ResourceVersion = cur.ResourceVersion
				// As the EndpointSlice controller does: proxies time
				// network programming from it.
				want.Annotations = map[string]string{triggerTime: time.Now().UTC().Format(time.RFC3339Nano)}
				_, err = slices.Update(ctx, want, metav1.UpdateOptions{})
				return err
			})
		}
	}
	c.inFlight <- struct{}{}
	c.wg.Go(func() {
		defer func() { <-c.inFlight }()
		if err := do(); err != nil {
			select {
			case c.failed <- err:
			default:
			}
		}
	})
	return nil
}

// wait waits for the changes under way and returns the first error.
func (c *churn) wait() error {
	c.wg.Wait()
	select {
	case err := <-c.failed:
		return err
	default:
		return nil
	}
}

// liveIPs are the ClusterIPs of every Service that exists now.
func (c *churn) liveIPs() map[netip.Addr]bool {
	out := c.s.objs.allIPs()
	for _, i := range c.extra {
		out[clusterIP(i)] = true
	}
	return out
}

// soakSample is kproxy's state at one moment of the soak.
type soakSample struct {
	at         time.Duration
	rssMiB     float64
	goroutines int
}

func (r *runBed) soakSample(ctx context.Context, at time.Duration) soakSample {
	x := soakSample{at: at, goroutines: -1}
	if u, ok := readUsage(r.proc.PID()); ok {
		x.rssMiB = float64(u.rss) / mib
	}
	if code, body, err := r.node.Netns.HTTPGet(ctx, metricsURL); err == nil && code == 200 {
		for _, line := range strings.Split(body, "\n") {
			if v, ok := strings.CutPrefix(line, "go_goroutines "); ok {
				n, _ := strconv.ParseFloat(v, 64)
				x.goroutines = int(n)
			}
		}
	}
	return x
}

// slope is the least-squares slope of value over time, per second.
func slope(xs []soakSample, value func(soakSample) float64) float64 {
	var n, sx, sy, sxx, sxy float64
	for _, x := range xs {
		t, v := x.at.Seconds(), value(x)
		n++
		sx += t
		sy += v
		sxx += t * t
		sxy += t * v
	}
	if d := n*sxx - sx*sx; d != 0 {
		return (n*sxy - sx*sy) / d
	}
	return 0
}

func fmtList(v []float64) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = fmt.Sprintf("%.1f", x)
	}
	return strings.Join(parts, " ")
}
