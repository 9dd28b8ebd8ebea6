//go:build e2e

// Package bench is kproxy's scale benchmark (issue 7): N Services × M
// endpoints in a real API server, kproxy or upstream kube-proxy in a node
// namespace, cold start, change latency, resources and data-plane cost.
// It prints figures and never fails on them. See README.md.
package bench

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/kproxy/kproxy/internal/dataplane/dptest"
	"github.com/kproxy/kproxy/test/testbed/controlplane"
	"github.com/kproxy/kproxy/test/testbed/netbed"
)

// baselineServices is how many bulk Services exist for the "10 Services"
// data-plane figures (plus probe and dp: 10).
const baselineServices = 8

func TestScale(t *testing.T) {
	if os.Getenv("KPROXY_BENCH") == "" {
		t.Skip("scale benchmark: run it with `make bench-scale` or `make bench-smoke` (KPROXY_BENCH=1)")
	}
	netbed.RequireRoot(t)
	p, err := loadParams()
	if err != nil {
		t.Fatal(err)
	}
	p.kproxyBin = privateCopy(t, p.kproxyBin) // bin/kproxy may be rebuilt meanwhile
	configs := p.configs(t)
	s := newSuite(t, p)
	p.etcd = s.cp.EtcdVersion
	figs := map[config][]*figures{}
	for _, c := range configs {
		for range p.runs {
			figs[c] = append(figs[c], newFigures())
		}
	}
	for _, c := range configs {
		for i, f := range figs[c] {
			t.Run(fmt.Sprintf("baseline/%s/%s/run%d", c.proxy, c.mode, i+1), func(t *testing.T) { s.baseline(t, c, f) })
		}
	}
	s.createBulk(t)
	for _, c := range configs {
		load := loadAverage()
		for i, f := range figs[c] {
			t.Run(fmt.Sprintf("%s/%s/%s/run%d", p.size(), c.proxy, c.mode, i+1), func(t *testing.T) { s.run(t, c, f) })
		}
		save(t, p, c, figs[c], load) // after each configuration: an interrupted invocation keeps what it measured
	}
	report(t, p, configs)
}

// configs are the modes × proxies asked for; upstream only when built.
func (p params) configs(t *testing.T) []config {
	var out []config
	for _, m := range p.modes {
		for _, x := range p.proxies {
			if _, err := os.Stat(p.binary(x)); err != nil {
				t.Logf("bench: skipping %s/%s: %v (run: make testbed-deps)", x, m, err)
				continue
			}
			out = append(out, config{proxy: x, mode: m})
		}
	}
	return out
}

// suite is the state shared by every run of one invocation.
type suite struct {
	p       params
	cp      *controlplane.ControlPlane
	objs    *objectSet
	writers []kubernetes.Interface
}

func newSuite(t *testing.T, p params) *suite {
	ctx := context.Background()
	cp, err := controlplane.Start(ctx, controlplane.Options{BindAddress: netip.IPv4Unspecified(), Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			_ = cp.SaveLogs(repoPath("bin/bench-logs"))
		}
		_ = cp.Stop()
	})
	ws, err := writers(cp)
	if err != nil {
		t.Fatal(err)
	}
	s := &suite{p: p, cp: cp, writers: ws, objs: newObjectSet(p.services, p.endpoints, p.affinity > 0, plannedPods())}
	s.objs.balancing = p.balancing > 0
	if err := cp.EnsureNamespace(ctx, benchNS); err != nil {
		t.Fatal(err)
	}
	if p.services > narrowServices {
		if err := ensureWideRange(ctx, cp); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range benchLayout().Nodes {
		if _, err := cp.CreateNode(ctx, n.Name, []netip.Prefix{n.PodCIDR4, n.PodCIDR6}, []netip.Addr{n.IP4, n.IP6}, n.Zone); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.objs.createFixed(ctx, cp); err != nil {
		t.Fatal(err)
	}
	if _, err := s.objs.createRange(ctx, ws, 0, min(baselineServices, p.services)); err != nil {
		t.Fatal(err)
	}
	return s
}

// createBulk creates the remaining bulk Services.
func (s *suite) createBulk(t *testing.T) {
	from := min(baselineServices, s.p.services)
	d, err := s.objs.createRange(context.Background(), s.writers, from, s.p.services)
	if err != nil {
		t.Fatal(err)
	}
	n := s.p.services - from
	t.Logf("bench: created %d Services and %d EndpointSlices (%d endpoints each) in %v: %.0f objects/s",
		n, n, s.p.endpoints, d.Round(time.Millisecond), float64(2*n)/d.Seconds())
}

// baseline measures the data plane with 10 Services installed.
func (s *suite) baseline(t *testing.T, c config, f *figures) {
	rb := newRunBed(t, s.p)
	if err := s.resetProbe(); err != nil {
		t.Fatal(err)
	}
	began, err := rb.start(s.p.binary(c.proxy), c.mode, kubeconfigFor(t, s.cp))
	if err != nil {
		t.Fatal(err)
	}
	defer rb.stop()
	dp := []netip.AddrPort{netip.AddrPortFrom(dpIP, servicePort)}
	if _, err := rb.prober.waitAnswering(dp, 10*time.Millisecond, began.Add(s.p.coldTimeout), rb.exited); err != nil {
		f.note("baseline (10 Services): %v", err)
		return
	}
	rb.measureDataplane(s.p, f, "10")
}

// run is one full run: cold start, change storm, idle, data plane.
func (s *suite) run(t *testing.T, c config, f *figures) {
	ctx := context.Background()
	rb := newRunBed(t, s.p)
	if err := s.resetProbe(); err != nil {
		t.Fatal(err)
	}
	var extra []string
	if s.p.profile != "" {
		extra = []string{"--profiling"}
	}
	// An earlier configuration's namespaces may still be torn down by the
	// kernel (seconds of CPU for a 10k-Service table): not this one's cost.
	if w := dptest.WaitKernelQuiet(60 * time.Second); w > time.Second {
		t.Logf("bench: waited %v for the kernel to finish earlier teardowns", w.Round(time.Millisecond))
	}
	// The floor of the proxy's initial list: a bare client's LIST of the
	// same objects, decoded, nothing kept.
	if d, err := bareList(ctx, s.writers[0]); err != nil {
		f.note("bare list: %v", err)
	} else {
		f.set("bare_list_s", d.Seconds())
	}
	began, err := rb.start(s.p.binary(c.proxy), c.mode, kubeconfigFor(t, s.cp), extra...)
	if err != nil {
		t.Fatal(err)
	}
	if s.p.profile != "" {
		go rb.captureProfile(t, s.profilePath(c, "cold.cpu"), "profile?seconds=20")
		go rb.captureProfile(t, s.profilePath(c, "cold.trace"), "trace?seconds=4")
	}
	smp := startSampler(rb.proc.PID(), 100*time.Millisecond)
	u0 := smp.phaseStart()
	defer smp.close()
	defer rb.stop()
	if !rb.measureColdStart(ctx, c, s.p, s.objs, f, began, smp, u0) {
		t.Logf("bench: %s: %s", c, strings.Join(f.notes, "; "))
		keep := repoPath(fmt.Sprintf("bin/bench-logs/%s-%s-%s.log", s.p.size(), c.proxy, c.mode))
		if err := os.MkdirAll(filepath.Dir(keep), 0o755); err == nil {
			_ = os.WriteFile(keep, []byte(rb.proc.Log()), 0o644)
			t.Logf("bench: proxy log kept in %s", keep)
		}
		return
	}
	if at, ok := inputsSynced(rb.proc.Log(), began); ok {
		f.set("inputs_s", at.Sub(began).Seconds())
	}
	t.Logf("bench: %s: cold start %.2f s", c, f.values["cold_start_s"])
	w, err := newProbeWriter(ctx, s.writers[0], s.objs.realPods[2])
	if err != nil {
		t.Fatal(err)
	}
	if s.p.profile != "" {
		go rb.captureProfile(t, s.profilePath(c, "storm.cpu"), "profile?seconds=20")
	}
	rb.measureChanges(ctx, s.p, w, f, smp)
	t.Logf("bench: %s: %v changes, p50 %.1f ms, p99 %.1f ms", c, f.values["changes"], f.values["change_p50_ms"], f.values["change_p99_ms"])
	rb.measureIdle(s.p, f, smp)
	rb.measureDataplane(s.p, f, "n")
	if s.p.profile != "" {
		// gc=1: the live heap after the run, not as of the last cycle.
		rb.captureProfile(t, s.profilePath(c, "end.heap"), "heap?gc=1")
	}
}

// profilePath names a profile file of configuration c.
func (s *suite) profilePath(c config, what string) string {
	return filepath.Join(s.p.profile, fmt.Sprintf("%d-%d-%s-%s-%s.pprof", s.p.services, s.p.endpoints, c.proxy, c.mode, what))
}

// resetProbe empties the probe Service's endpoints (before a proxy starts).
func (s *suite) resetProbe() error {
	w, err := newProbeWriter(context.Background(), s.writers[0], s.objs.realPods[2])
	if err != nil {
		return err
	}
	return w.set(context.Background(), stateAbsent)
}

// save stores one configuration's figures and rewrites the document.
func save(t *testing.T, p params, c config, runs []*figures, load string) {
	st, err := loadStore(p.results)
	if err != nil {
		t.Logf("bench: results store %s unreadable (%v): starting a new one", p.results, err)
		st = store{}
	}
	e := newEntry(p, c, runs, load)
	if old, ok := st[e.key()]; ok && p.appendRuns {
		e = old.merge(e)
	}
	st[e.key()] = e
	if err := st.save(p.results); err != nil {
		t.Errorf("bench: save %s: %v", p.results, err)
	}
	if p.doc != "" {
		if err := updateDoc(p.doc, st); err != nil {
			t.Errorf("bench: update %s: %v", p.doc, err)
		}
	}
}

// report prints the tables of this invocation's configurations.
func report(t *testing.T, p params, configs []config) {
	st, err := loadStore(p.results)
	if err != nil {
		t.Errorf("bench: %v", err)
		return
	}
	only := store{}
	for _, c := range configs {
		k := entry{Size: p.size(), Mode: c.mode, Proxy: c.proxy}.key()
		if e, ok := st[k]; ok {
			only[k] = e
		}
	}
	var out strings.Builder
	only.render(&out)
	fmt.Printf("\n==== bench: %s ====\n%s", p.size(), out.String())
	if p.doc != "" {
		fmt.Printf("bench: tables written to %s (data %s)\n", p.doc, p.results)
	}
}

// privateCopy copies the executable at path into a temporary directory, so
// that a rebuild of the original during the benchmark does not mix binaries.
func privateCopy(t *testing.T, path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), filepath.Base(path))
	if err := os.WriteFile(dst, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return dst
}
