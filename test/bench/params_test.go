//go:build e2e

package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kproxy/kproxy/test/testbed/controlplane"
)

// params is one invocation of the benchmark, read from the environment
// (the Makefile's bench-scale and bench-smoke targets set it).
type params struct {
	services    int           // BENCH_SERVICES
	endpoints   int           // BENCH_ENDPOINTS: endpoints per Service
	modes       []string      // BENCH_MODE: nftables,iptables
	proxies     []string      // BENCH_PROXY: kproxy,upstream
	runs        int           // BENCH_RUNS
	changes     int           // BENCH_CHANGES: timed endpoint changes per run
	idle        time.Duration // BENCH_IDLE: idle phase
	coldTimeout time.Duration // BENCH_COLD_TIMEOUT: bound of the cold start
	stormBound  time.Duration // BENCH_STORM_TIMEOUT: bound of the whole change storm
	changeBound time.Duration // BENCH_CHANGE_TIMEOUT: bound of one change
	changeGap   time.Duration // BENCH_CHANGE_GAP_MS: pause after each change is seen
	dpLength    time.Duration // BENCH_DP_SECONDS: connection-rate measurement length
	results     string        // BENCH_RESULTS: JSON store of every configuration's figures
	doc         string        // BENCH_DOC: markdown file with the generated tables ("" = none)
	command     string        // BENCH_COMMAND: the command line, for the document
	appendRuns  bool          // BENCH_APPEND=1: add the runs to the stored ones instead of replacing them
	profile     string        // BENCH_PROFILE: directory for kproxy CPU/heap profiles of the cold start ("" = none)
	affinity    int           // BENCH_AFFINITY: percent of bulk Services with ClientIP affinity (0 or 10)
	balancing   int           // BENCH_BALANCING: percent of bulk Services annotated round-robin or source-hash, half each (0 or 10)
	kproxyBin   string        // KPROXY_BIN, default bin/kproxy
	echoBin     string        // KPROXY_ECHO, default bin/kproxy-echo
	upstreamBin string        // KPROXY_UPSTREAM, default next to the cached kube-apiserver
	etcd        string        // the control plane's etcd version (KPROXY_ETCD chooses the binary)
	proxyFlags  []string      // BENCH_PROXY_FLAGS: more flags for the proxy (space-separated)
}

func loadParams() (params, error) {
	var errs []string
	num := func(key string, def int) int {
		v := os.Getenv(key)
		if v == "" {
			return def
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			errs = append(errs, fmt.Sprintf("%s=%q: want a non-negative integer", key, v))
		}
		return n
	}
	secs := func(key string, def int) time.Duration { return time.Duration(num(key, def)) * time.Second }
	p := params{
		services:    num("BENCH_SERVICES", 1000),
		endpoints:   num("BENCH_ENDPOINTS", 10),
		modes:       list("BENCH_MODE", "nftables"),
		proxies:     list("BENCH_PROXY", "kproxy,upstream"),
		runs:        max(num("BENCH_RUNS", 1), 1),
		changes:     num("BENCH_CHANGES", 200),
		idle:        secs("BENCH_IDLE", 60),
		coldTimeout: secs("BENCH_COLD_TIMEOUT", 300),
		stormBound:  secs("BENCH_STORM_TIMEOUT", 420),
		changeBound: secs("BENCH_CHANGE_TIMEOUT", 30),
		// Longer than the default minSyncPeriod (1 s): each change reaches an
		// idle proxy, so the figure is the proxy's latency, not its rate limit.
		changeGap:   time.Duration(num("BENCH_CHANGE_GAP_MS", 1100)) * time.Millisecond,
		dpLength:    secs("BENCH_DP_SECONDS", 10),
		results:     envOr("BENCH_RESULTS", repoPath("test/bench/results/results.json")),
		doc:         docPath(),
		command:     os.Getenv("BENCH_COMMAND"),
		appendRuns:  os.Getenv("BENCH_APPEND") == "1",
		profile:     os.Getenv("BENCH_PROFILE"),
		proxyFlags:  strings.Fields(os.Getenv("BENCH_PROXY_FLAGS")),
		affinity:    num("BENCH_AFFINITY", 10),
		balancing:   num("BENCH_BALANCING", 0),
		kproxyBin:   envOr("KPROXY_BIN", repoPath("bin/kproxy")),
		echoBin:     envOr("KPROXY_ECHO", repoPath("bin/kproxy-echo")),
		upstreamBin: envOr("KPROXY_UPSTREAM", filepath.Join(filepath.Dir(controlplane.APIServerPath()), "kube-proxy")),
	}
	errs = append(errs, p.check()...)
	if len(errs) > 0 {
		return p, fmt.Errorf("bench: bad parameters: %s", strings.Join(errs, "; "))
	}
	return p, nil
}

func (p params) check() []string {
	var errs []string
	if p.services < 1 || p.services > maxServices {
		errs = append(errs, fmt.Sprintf("BENCH_SERVICES=%d: want 1..%d", p.services, maxServices))
	}
	if p.endpoints < 1 || p.endpoints > fakeEndpointSpace {
		errs = append(errs, fmt.Sprintf("BENCH_ENDPOINTS=%d: want 1..%d", p.endpoints, fakeEndpointSpace))
	}
	if p.balancing != 0 && p.balancing != 10 {
		errs = append(errs, fmt.Sprintf("BENCH_BALANCING=%d: want 10 (every tenth Service) or 0", p.balancing))
	}
	if p.affinity != 0 && p.affinity != 10 {
		errs = append(errs, fmt.Sprintf("BENCH_AFFINITY=%d: want 10 (every tenth Service) or 0", p.affinity))
	}
	for _, m := range p.modes {
		if m != "nftables" && m != "iptables" && m != "ipvs" {
			errs = append(errs, fmt.Sprintf("BENCH_MODE: unknown mode %q", m))
		}
	}
	for _, x := range p.proxies {
		if x != "kproxy" && x != "upstream" {
			errs = append(errs, fmt.Sprintf("BENCH_PROXY: unknown proxy %q", x))
		}
	}
	for _, bin := range []string{p.kproxyBin, p.echoBin} {
		if _, err := os.Stat(bin); err != nil {
			errs = append(errs, fmt.Sprintf("%v (run: make build)", err))
		}
	}
	return errs
}

// binary returns the executable of proxy.
func (p params) binary(proxy string) string {
	if proxy == "upstream" {
		return p.upstreamBin
	}
	return p.kproxyBin
}

// size names the configuration's scale, e.g. "10000×10".
func (p params) size() string { return fmt.Sprintf("%d×%d", p.services, p.endpoints) }

func list(key, def string) []string {
	var out []string
	for _, s := range strings.Split(envOr(key, def), ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// docPath is BENCH_DOC: unset means docs/performance.md, set but empty
// means no document (as documented; envOr would read it as unset).
func docPath() string {
	if v, ok := os.LookupEnv("BENCH_DOC"); ok {
		return v
	}
	return repoPath("docs/performance.md")
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// repoPath resolves a path relative to the repository root (the test runs
// in test/bench).
func repoPath(rel string) string {
	abs, err := filepath.Abs(filepath.Join("..", "..", rel))
	if err != nil {
		return rel
	}
	return abs
}
