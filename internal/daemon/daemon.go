// Package daemon wires kproxy together: sources feed the change tracker, the
// runner rebuilds the model and hands each Snapshot to the dataplane, and the
// health and metrics servers report on it.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/conntrack"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/traffic"
)

// Run runs kproxy until ctx is cancelled. It honours o.CleanupAndExit,
// o.InitOnly and o.DryRun.
func Run(ctx context.Context, o *config.Options) error {
	return run(ctx, o, defaultEnv())
}

// defaultMemoryLimit is the floor of the Go runtime's soft memory limit when
// GOMEMLIMIT is not set. It is applied only after a sync, once the live heap
// is known: a limit below the live heap during the first sync makes the
// collector run continuously (half the CPU of a 10k cold start, 2b945f5).
// At 10k Services × 10 endpoints (live heap ~48 MB) the floor is what
// binds: 128 MiB let RSS sit at ~124 MiB; 64 MiB held it at ~87 MiB but
// the collector then cost 0.08 cores more under 100 endpoint changes/s;
// 96 MiB gives ~97–110 MiB at the same CPU. Measure with the soak
// (test/bench/README.md): make e2e-long SOAK_SERVICES=10000
// SOAK_DURATION=60s SOAK_RATE=100 SOAK_CREATE_EVERY=0 BENCH_AFFINITY=0
// BENCH_PROXY_FLAGS=--iptables-min-sync-period=0.
const defaultMemoryLimit = 96 << 20

var ownMemoryLimit = os.Getenv("GOMEMLIMIT") == ""

// coldGCPercent is the collector's pace until the first sync is done (when
// GOGC and GOMEMLIMIT are not set): the list decoding and the first sync
// allocate several times the live state, and GOGC=100 would let the heap
// reach twice that peak. Afterwards the soft limit governs. A freshly
// touched page costs a fault, so the extra heap of a higher GOGC costs time
// as well as memory; a much lower one makes the collector's CPU the cost.
// 40 gave a lower peak RSS and a faster 10k cold start than 50 (25,
// measured on older code, was slower than both).
// Measure with the cold-start-only bench (test/bench/README.md):
// KPROXY_BENCH=1 BENCH_SERVICES=10000 BENCH_MODE=nftables BENCH_PROXY=kproxy
// BENCH_RUNS=3 BENCH_IDLE=0 BENCH_CHANGES=0, once per value of this constant.
// The figures behind the choice: docs/history.md, "Cold-start GC pace".
const coldGCPercent = 40

var ownGCPercent = os.Getenv("GOGC") == "" && ownMemoryLimit

// startMemoryPolicy sets the cold-start collector pace.
func startMemoryPolicy() {
	if ownGCPercent {
		debug.SetGCPercent(coldGCPercent)
	}
}

// adaptMemoryLimit sets the soft limit to 1.5 times the live heap after each
// sync (at least the floor), and after the first returns the cold start's
// garbage to the kernel: between syncs little is allocated, so the
// collector rarely runs, and the process stays well under GOGC=100's twice
// the live heap (10k Services × 10 endpoints: ~48 MB live after a sync;
// measured by GODEBUG=gctrace=1 under make bench-scale). A cluster whose live state
// grows gets a higher limit at the next sync instead of a collector that
// runs continuously.
func adaptMemoryLimit(first bool) {
	if !ownMemoryLimit {
		return
	}
	live := liveHeap()
	if live == 0 {
		return
	}
	debug.SetMemoryLimit(max(defaultMemoryLimit, live+live/2))
	if ownGCPercent {
		debug.SetGCPercent(100)
	}
	if first {
		// The cold start's garbage (decoded lists, the first batches) is
		// several times the state kept; return it to the kernel now rather
		// than as the scavenger finds it.
		go debug.FreeOSMemory()
	}
}

// coldLimitFactor sets the soft memory limit during the first sync's
// dataplane work, as a multiple of the live heap once its model is built
// (when GOMEMLIMIT is not set). The render and the batches grow the live
// heap to ~1.7–1.8 times that point (10k Services × 100 endpoints: 117–128
// MB then, 207–230 MB at the sync's last collection), and at GOGC 40 the
// heap's goal, over ~80 % span utilisation, set a 313–340 MiB peak; the
// limit caps the late goals instead: 2.2 gives 287–288 MiB for 1.6–2.9 s
// more of the collector's CPU (cold start within its run-to-run spread);
// without affinity and at 10k × 10 it does not bind, at 50k × 10 it held
// the goals at 260–269 MB (peak 316 MiB). Below the sync's own live peak a limit makes the collector run
// back to back (1.9: cold start +1–3 s), which guardColdLimit prevents on
// shapes whose sync grows the heap more. Measure with the scale bench
// (test/bench/README.md): make bench-scale SERVICES=10000 ENDPOINTS=100
// MODE=nftables PROXY=kproxy RUNS=1 CHANGES=20, its peak RSS, cold start
// and CPU; docs/performance.md has the figures.
const coldLimitFactor = 2.2

// coldLimit is the first sync's soft memory limit for a live heap of live
// bytes.
func coldLimit(live int64) int64 {
	return max(defaultMemoryLimit, int64(float64(live)*coldLimitFactor))
}

// raisedLimit is the soft limit guardColdLimit sets for the live heap at
// the last collection: limit while it leaves a quarter of the live heap
// free, else 1.5 times live, which GOGC 40's goal (1.4 times) stays under,
// so the pace rules again.
func raisedLimit(live, limit int64) int64 {
	if live+live/4 <= limit {
		return limit
	}
	return live + live/2
}

// liveHeap is the heap marked live by the last collection (0 if the
// runtime does not say).
func liveHeap() int64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return int64(s[0].Value.Uint64())
}

// startColdLimit sets the first sync's soft limit and starts its guard,
// once (a failed first sync is retried under the same limit); stop ends the
// guard before adaptMemoryLimit sets the limit for the syncs after.
func startColdLimit(ctx context.Context) (stop func()) {
	live := liveHeap()
	if !ownMemoryLimit || live == 0 {
		return func() {}
	}
	debug.SetMemoryLimit(coldLimit(live))
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		guardColdLimit(ctx, 10*time.Millisecond)
	}()
	return func() {
		cancel()
		<-done
	}
}

// guardColdLimit raises the soft limit whenever the live heap comes within
// a quarter of it, until ctx ends: the collector then never runs more often
// than a GOGC of 25 would make it.
func guardColdLimit(ctx context.Context, every time.Duration) {
	wait.UntilWithContext(ctx, func(context.Context) {
		limit := debug.SetMemoryLimit(-1)
		if next := raisedLimit(liveHeap(), limit); next != limit {
			debug.SetMemoryLimit(next)
		}
	}, every)
}

// env is everything the daemon takes from the outside world; tests replace
// parts of it.
type env struct {
	hostname   func() (string, error)
	inputs     InputsFunc
	dataplanes map[string]DataplaneFunc
	// servers builds the healthz and metrics servers and the observers that
	// feed them.
	servers   func(p ServerParams) ([]Server, []Observer, error)
	conntrack conntrack.Table
	sysctls   conntrack.IntFiles
	numCPU    func() int
	ipv6      func() bool
	clock     clock.Clock
	stdout    io.Writer
	// ipvsSupport lists what the node lacks for IPVS mode with the given
	// scheduler (nil: nothing); nil skips the check.
	ipvsSupport func(scheduler string) []string
	// ipvsCleanup removes upstream ipvs mode's non-iptables leftovers
	// (kube-ipvs0, IPVS virtual servers, ip sets); nil skips it.
	ipvsCleanup func(ctx context.Context) error
	// firewallCleanup removes the iptables mode's KUBE-FIREWALL when no
	// kubelet owns it (firewall.go); nil skips it.
	firewallCleanup func(ctx context.Context) error
	// trafficTables builds the Service traffic counter tables
	// (--service-traffic-metrics); nil runs none.
	trafficTables func(fams []model.Family, logger klog.Logger) TrafficTables
	// trafficCleanup removes those tables; nil skips it.
	trafficCleanup func(fams []model.Family) error
	// oomScoreAdj sets this process's oom_score_adj; nil skips it.
	oomScoreAdj func(adj int) error
	// nodeIPsWait and podCIDRsWait bound the wait for this node's Node object
	// (upstream: 30 s for its IPs, 5 min for its podCIDRs in NodeCIDR mode).
	nodeIPsWait  time.Duration
	podCIDRsWait time.Duration
	pollInterval time.Duration
	// waitInterval is how often the start-up waits (inputs synced, the
	// Node's IPs) look again: short, as the first sync waits for them.
	waitInterval time.Duration
}

func defaultEnv() env {
	return env{
		hostname:        os.Hostname,
		inputs:          defaultInputs,
		dataplanes:      defaultDataplanes(),
		servers:         defaultServers,
		conntrack:       conntrack.NewNetlinkTable(),
		sysctls:         conntrack.HostFiles(),
		numCPU:          conntrack.NumCPU,
		ipv6:            kernelIPv6Supported,
		clock:           clock.RealClock{},
		stdout:          os.Stdout,
		ipvsSupport:     kernelIPVSSupport,
		ipvsCleanup:     removeIPVSLeftovers,
		firewallCleanup: removeFirewallLeftovers,
		oomScoreAdj:     writeOOMScoreAdj,
		trafficTables:   newTrafficTables,
		trafficCleanup:  traffic.Cleanup,
		nodeIPsWait:     30 * time.Second,
		podCIDRsWait:    5 * time.Minute,
		pollInterval:    time.Second,
		waitInterval:    50 * time.Millisecond,
	}
}

func run(ctx context.Context, o *config.Options, e env) error {
	if o == nil || o.Config == nil {
		return errors.New("daemon: no configuration")
	}
	switch {
	case o.CleanupAndExit:
		return cleanupAll(ctx, e)
	case o.InitOnly:
		return initNode(ctx, o, e)
	}
	d, err := newDaemon(o, e)
	if err != nil {
		return err
	}
	if o.DryRun {
		return d.dryRun(ctx)
	}
	return d.serve(ctx)
}

// cleanupAll is --cleanup: every backend removes what it (or upstream
// kube-proxy in that mode) left in the kernel, then upstream ipvs mode's
// remnants and the Service traffic counters go. Every step runs even when an earlier one failed.
func cleanupAll(ctx context.Context, e env) error {
	var errs []error
	for _, mode := range sortedModes(e.dataplanes) {
		if err := cleanupMode(ctx, e, mode); err != nil {
			errs = append(errs, err)
		}
	}
	if e.firewallCleanup != nil {
		errs = append(errs, e.firewallCleanup(ctx))
	}
	if e.ipvsCleanup != nil {
		if err := e.ipvsCleanup(ctx); err != nil {
			errs = append(errs, fmt.Errorf("cleaning up ipvs state: %w", err))
		}
	}
	if e.trafficCleanup != nil {
		if err := e.trafficCleanup(cleanupConfig(e).Families); err != nil {
			errs = append(errs, fmt.Errorf("cleaning up the Service traffic counters: %w", err))
		}
	}
	return errors.Join(errs...)
}

// writeOOMScoreAdj writes this process's /proc/self/oom_score_adj.
func writeOOMScoreAdj(adj int) error {
	return os.WriteFile("/proc/self/oom_score_adj", []byte(strconv.Itoa(adj)), 0o644)
}

// cleanupMode runs one backend's Cleanup.
func cleanupMode(ctx context.Context, e env, mode string) error {
	dp, err := e.dataplanes[mode](cleanupConfig(e))
	if err == nil {
		err = dp.Cleanup(ctx)
	}
	if err != nil {
		return fmt.Errorf("cleaning up %s state: %w", mode, err)
	}
	klog.FromContext(ctx).V(2).Info("Cleaned up leftovers", "mode", mode)
	return nil
}

// initNode is --init-only: the privileged node setup, then exit. As
// upstream: the conntrack sysctls, in iptables mode route_localnet=1 when
// NodePorts answer on localhost, and in ipvs mode (when the node can run
// it, else as the iptables mode it falls back to) that mode's sysctls and
// IPVS timeouts. Unlike upstream it leaves other modes' leftovers alone:
// the proxy removes them after its first sync, without a window.
func initNode(ctx context.Context, o *config.Options, e env) error {
	if err := conntrack.ApplySysctls(ctx, &o.Config.Conntrack, e.numCPU(), e.sysctls); err != nil {
		return fmt.Errorf("could not set conntrack parameters from kube-proxy configuration: %w", err)
	}
	o = ipvsFallback(o, e)
	if string(o.Config.Mode) == ModeIPVS {
		if err := initIPVS(ctx, o, e); err != nil {
			return err
		}
	}
	if localhostNodePorts(o.Config) {
		klog.FromContext(ctx).Info("Setting route_localnet=1 to allow node-ports on localhost")
		if err := e.sysctls.WriteInt(sysctlRouteLocalnet, 1); err != nil {
			return fmt.Errorf("setting route_localnet: %w", err)
		}
	}
	klog.FromContext(ctx).Info("System initialized and --init-only specified")
	return nil
}

// initIPVS makes IPVS mode's node settings (its dataplane's InitNode).
func initIPVS(ctx context.Context, o *config.Options, e env) error {
	cfg, err := dataplaneConfig(o.Config, nodeIPs{}, cleanupConfig(e).Families)
	if err != nil {
		return err
	}
	dp, err := e.dataplanes[ModeIPVS](cfg)
	if err != nil {
		return err
	}
	if ni, ok := dp.(interface{ InitNode(context.Context) error }); ok {
		return ni.InitNode(ctx)
	}
	return nil
}
