//go:build e2e

package bench

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"time"
)

// figures are one run's measurements by metric key (see metricDefs); a
// missing key was not measured. notes say what did not finish and why.
type figures struct {
	values map[string]float64
	notes  []string
}

func newFigures() *figures { return &figures{values: map[string]float64{}} }

func (f *figures) set(key string, v float64) {
	if !math.IsNaN(v) && !math.IsInf(v, 0) {
		f.values[key] = v
	}
}

func (f *figures) note(format string, args ...any) {
	f.notes = append(f.notes, fmt.Sprintf(format, args...))
}

const mib = 1 << 20

// measureColdStart: proxy start -> every Service's IP in the kernel and the
// sample Services answering real traffic.
func (r *runBed) measureColdStart(ctx context.Context, c config, p params, objs *objectSet, f *figures, began time.Time, smp *sampler, u0 usage) bool {
	deadline := began.Add(p.coldTimeout)
	var targets []netip.AddrPort
	for _, i := range sampleIndexes(objs.n) {
		targets = append(targets, netip.AddrPortFrom(clusterIP(i), servicePort))
	}
	targets = append(targets, netip.AddrPortFrom(dpIP, servicePort))
	answered, err := r.prober.waitAnswering(targets, 10*time.Millisecond, deadline, r.exited)
	if err == nil {
		f.set("cold_traffic_s", answered.Sub(began).Seconds())
		var programmed time.Time
		programmed, err = r.waitKernel(ctx, c, objs.allIPs(), deadline)
		if err == nil {
			done := programmed
			if answered.After(done) {
				done = answered
			}
			f.set("cold_start_s", done.Sub(began).Seconds())
		}
	}
	cpu, peak, _ := smp.phaseEnd(u0)
	f.set("cpu_cold_s", cpu.Seconds())
	f.set("rss_peak_cold_mib", float64(peak)/mib)
	if err != nil {
		f.note("cold start did not finish in %v: %v", p.coldTimeout, err)
		return false
	}
	return true
}

// allIPs are the ClusterIPs every proxy must program at cold start (the
// probe Service has no endpoints then, and lives in other maps: counted too).
func (s *objectSet) allIPs() map[netip.Addr]bool {
	out := map[netip.Addr]bool{dpIP: true, probeIP: true}
	for i := range s.n {
		out[clusterIP(i)] = true
	}
	return out
}

// changeStep is one step of the change cycle on the probe Service.
type changeStep struct {
	kind string
	to   endpointState
	want outcome
}

// changeCycle: add the endpoint, flip it not ready, flip it ready again,
// remove it. Each step is one endpoint changing; each makes fresh
// connections change outcome (answer <-> reject).
var changeCycle = []changeStep{
	{"add", stateReady, ok},
	{"flip", stateNotReady, refused},
	{"flip", stateReady, ok},
	{"remove", stateAbsent, refused},
}

// settleSyncs waits a change gap at a time, at most ten, until the
// proxy's sync count held still over one, and returns the histograms read
// last (nil when they could not be read).
func (r *runBed) settleSyncs(ctx context.Context, p params) map[string]histogram {
	var last map[string]histogram
	for range 10 {
		time.Sleep(p.changeGap)
		h, err := scrapeHistograms(ctx, r.node.Netns, metricProgramming, metricSync)
		if err != nil {
			return nil
		}
		if last != nil && h[metricSync].count == last[metricSync].count {
			return h
		}
		last = h
	}
	return last
}

// measureChanges runs the change storm and records the latencies and the
// proxy's own histograms over the storm.
func (r *runBed) measureChanges(ctx context.Context, p params, w *probeWriter, f *figures, smp *sampler) {
	dst := netip.AddrPortFrom(probeIP, servicePort)
	// The cold start ends with the proxy's first sync just done: a change
	// now would wait out minSyncPeriod (1 s) behind it, in either proxy,
	// and time the rate limiter (one such change among 20 was the p99).
	// A second sync can follow a minimum sync period later, for events
	// that came during the first (a storm with one sync more than its
	// changes had a 0.7 s change): wait until the count holds still.
	before := r.settleSyncs(ctx, p)
	if before == nil {
		f.note("metrics before the storm: not read")
	}
	bare, err := watchProbeSlice(ctx, w.client, w.cur.ResourceVersion)
	if err != nil {
		f.note("bare watcher: %v", err)
	} else {
		defer bare.stop()
	}
	u0 := smp.phaseStart()
	start := time.Now()
	var lat, watchLat, afterWatch []time.Duration
	for k := range p.changes {
		if time.Since(start) > p.stormBound {
			f.note("change storm stopped after %d of %d changes: %v bound", k, p.changes, p.stormBound)
			break
		}
		step := changeCycle[k%len(changeCycle)]
		res, err := r.prober.timeChange(dst, step.want, time.Millisecond, p.changeBound,
			func() error { return w.set(ctx, step.to) })
		if err != nil {
			f.note("change %d (%s) not seen within %v: %v; storm stopped", k, step.kind, p.changeBound, err)
			break
		}
		lat = append(lat, res.latency)
		if bare != nil {
			if at, ok := bare.arrival(w.cur.ResourceVersion, time.Second); ok {
				watchLat = append(watchLat, at.Sub(res.start))
				afterWatch = append(afterWatch, res.latency-at.Sub(res.start))
			}
		}
		if (k+1)%50 == 0 {
			r.t.Logf("bench: %d changes done, last %v", k+1, res.latency)
		}
		time.Sleep(p.changeGap)
	}
	storm := time.Since(start)
	cpu, peak, _ := smp.phaseEnd(u0)
	f.set("cpu_storm_s", cpu.Seconds())
	f.set("rss_peak_storm_mib", float64(peak)/mib)
	f.set("changes", float64(len(lat)))
	f.set("storm_s", storm.Seconds())
	recordLatencies(f, lat)
	setQuantiles(f, "watch", watchLat, 0.50, 0.99)
	setQuantiles(f, "after_watch", afterWatch, 0.50, 0.99)
	after, err := scrapeHistograms(ctx, r.node.Netns, metricProgramming, metricSync)
	if err != nil || before == nil {
		f.note("metrics after the storm: %v", err)
		return
	}
	prog := after[metricProgramming].sub(before[metricProgramming])
	sync := after[metricSync].sub(before[metricSync])
	f.set("prog_mean_ms", prog.mean()*1000)
	f.set("prog_p99_ms", prog.quantile(0.99)*1000)
	f.set("sync_count", sync.count)
	f.set("sync_mean_ms", sync.mean()*1000)
	f.set("sync_p50_ms", sync.quantile(0.5)*1000)
	f.set("sync_p99_ms", sync.quantile(0.99)*1000)
}

func recordLatencies(f *figures, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	setQuantiles(f, "change", lat, 0.50, 0.90, 0.99)
	f.set("change_max_ms", ms(slices.Max(lat)))
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// setQuantiles sets NAME_pNN_ms for each quantile q of d (nothing when d
// is empty).
func setQuantiles(f *figures, name string, d []time.Duration, qs ...float64) {
	if len(d) == 0 {
		return
	}
	s := slices.Clone(d)
	slices.Sort(s)
	for _, q := range qs {
		f.set(fmt.Sprintf("%s_p%02.0f_ms", name, q*100), ms(percentile(s, q)))
	}
}

// percentile of sorted s (nearest rank).
func percentile[T any](s []T, q float64) T {
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// measureIdle: CPU over an idle period, RSS at its end.
func (r *runBed) measureIdle(p params, f *figures, smp *sampler) {
	u0 := smp.phaseStart()
	time.Sleep(p.idle)
	cpu, _, now := smp.phaseEnd(u0)
	f.set("cpu_idle_s", cpu.Seconds())
	f.set("rss_steady_mib", float64(now)/mib)
}

// measureDataplane: first-packet (handshake) latency over 1000 sequential
// new connections and the new-connection rate with 16 in flight, to the dp
// Service; suffix names the Service count ("10" or "n").
func (r *runBed) measureDataplane(p params, f *figures, suffix string) {
	dst := netip.AddrPortFrom(dpIP, servicePort)
	lat, err := r.prober.connectLatencies(dst, 1000)
	if err != nil {
		f.note("first-packet latency (%s): %v", suffix, err)
	}
	if len(lat) > 0 {
		slices.Sort(lat)
		us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
		f.set("fp_p50_us_"+suffix, us(percentile(lat, 0.5)))
		f.set("fp_p99_us_"+suffix, us(percentile(lat, 0.99)))
	}
	rate, err := r.prober.connectRate(dst, 16, p.dpLength)
	if err != nil {
		f.note("connection rate (%s): %v", suffix, err)
	}
	f.set("conn_rate_"+suffix, rate)
}
