package metrics

import (
	"context"
	"fmt"
	"net/url"
	"runtime"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientmetrics "k8s.io/client-go/tools/metrics"
	"k8s.io/component-base/featuregate"
	k8smetrics "k8s.io/component-base/metrics"
)

// The metrics below are not kube-proxy's own but come with every
// Kubernetes component, and dashboards for kube-proxy use them:
// kubernetes_build_info, kubernetes_feature_enabled and client-go's
// rest_client_* metrics. Same names, types, labels and buckets as
// component-base v0.36.

// registerBuildInfo registers kubernetes_build_info, labelled with the
// kube-proxy version kproxy is compatible with (what version dashboards
// expect) and kproxy's own build facts.
func registerBuildInfo(reg k8smetrics.KubeRegistry, version string) {
	g := k8smetrics.NewGaugeVec(&k8smetrics.GaugeOpts{
		Name:           "kubernetes_build_info",
		Help:           "A metric with a constant '1' value labeled by major, minor, git version, git commit, git tree state, build date, Go version, and compiler from which Kubernetes was built, and platform on which it is running.",
		StabilityLevel: k8smetrics.BETA,
	}, []string{"major", "minor", "git_version", "git_commit", "git_tree_state", "build_date", "go_version", "compiler", "platform"})
	reg.MustRegister(g)
	major, minor := majorMinor(version)
	commit, tree, date := vcsInfo()
	g.WithLabelValues(major, minor, version, commit, tree, date, runtime.Version(), runtime.Compiler, runtime.GOOS+"/"+runtime.GOARCH).Set(1)
}

// majorMinor splits "v1.36.3" into "1" and "36".
func majorMinor(v string) (string, string) {
	parts := strings.SplitN(strings.TrimPrefix(v, "v"), ".", 3)
	if len(parts) < 2 {
		return "", ""
	}
	return parts[0], parts[1]
}

// vcsInfo returns the commit, tree state and commit time of the build.
func vcsInfo() (commit, tree, date string) {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "", "", ""
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			commit = s.Value
		case "vcs.modified":
			tree = map[string]string{"true": "dirty", "false": "clean"}[s.Value]
		case "vcs.time":
			date = s.Value
		}
	}
	return commit, tree, date
}

// allGates is the part of a feature gate that lists every gate's spec.
type allGates interface {
	GetAll() map[featuregate.Feature]featuregate.FeatureSpec
}

// registerFeatures registers kubernetes_feature_enabled with one series per
// known gate: 1 when enabled, labelled with its stage ("" for GA). A gate
// that cannot list its features registers nothing.
func registerFeatures(reg k8smetrics.KubeRegistry, gate featuregate.FeatureGate) error {
	all, ok := gate.(allGates)
	if !ok {
		return nil
	}
	g := k8smetrics.NewGaugeVec(&k8smetrics.GaugeOpts{
		Namespace:      "kubernetes",
		Name:           "feature_enabled",
		Help:           "This metric records the data about the stage and enablement of a k8s feature.",
		StabilityLevel: k8smetrics.BETA,
	}, []string{"name", "stage"})
	if err := reg.Register(g); err != nil {
		return fmt.Errorf("registering %s: %w", g.FQName(), err)
	}
	specs := all.GetAll()
	names := make([]string, 0, len(specs))
	for f := range specs {
		names = append(names, string(f))
	}
	sort.Strings(names)
	for _, n := range names {
		v := 0.0
		if gate.Enabled(featuregate.Feature(n)) {
			v = 1
		}
		g.WithLabelValues(n, string(specs[featuregate.Feature(n)].PreRelease)).Set(v)
	}
	return nil
}

// restClient holds client-go's request metrics on one registry.
type restClient struct {
	latency, rateLimiter  *k8smetrics.HistogramVec
	requestSize, respSize *k8smetrics.HistogramVec
	results, retries      *k8smetrics.CounterVec
	cacheEntries          *k8smetrics.Gauge
	createCalls           *k8smetrics.CounterVec
}

var (
	latencyBuckets = []float64{0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0}
	sizeBuckets    = []float64{64, 256, 512, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216}
)

func newRestClient() *restClient {
	hist := func(name, help string, buckets []float64) *k8smetrics.HistogramVec {
		return k8smetrics.NewHistogramVec(&k8smetrics.HistogramOpts{Name: name, Help: help, Buckets: buckets, StabilityLevel: k8smetrics.ALPHA}, []string{"verb", "host"})
	}
	counter := func(name, help string, labels ...string) *k8smetrics.CounterVec {
		return k8smetrics.NewCounterVec(&k8smetrics.CounterOpts{Name: name, Help: help, StabilityLevel: k8smetrics.ALPHA}, labels)
	}
	return &restClient{
		latency:      hist("rest_client_request_duration_seconds", "Request latency in seconds. Broken down by verb, and host.", latencyBuckets),
		rateLimiter:  hist("rest_client_rate_limiter_duration_seconds", "Client side rate limiter latency in seconds. Broken down by verb, and host.", latencyBuckets),
		requestSize:  hist("rest_client_request_size_bytes", "Request size in bytes. Broken down by verb and host.", sizeBuckets),
		respSize:     hist("rest_client_response_size_bytes", "Response size in bytes. Broken down by verb and host.", sizeBuckets),
		results:      counter("rest_client_requests_total", "Number of HTTP requests, partitioned by status code, method, and host.", "code", "method", "host"),
		retries:      counter("rest_client_request_retries_total", "Number of request retries, partitioned by status code, verb, and host.", "code", "verb", "host"),
		cacheEntries: k8smetrics.NewGauge(&k8smetrics.GaugeOpts{Name: "rest_client_transport_cache_entries", Help: "Number of transport entries in the internal cache.", StabilityLevel: k8smetrics.ALPHA}),
		createCalls: counter("rest_client_transport_create_calls_total", "Number of calls to get a new transport, partitioned by the result of the operation "+
			"hit: obtained from the cache, miss: created and added to the cache, miss-gc: recreated and added back to the cache after being garbage collected, uncacheable: created and not cached", "result"),
	}
}

func (r *restClient) registerOn(reg k8smetrics.KubeRegistry) {
	reg.MustRegister(r.latency, r.rateLimiter, r.requestSize, r.respSize, r.results, r.retries, r.cacheEntries, r.createCalls)
}

// client-go reports request metrics through process-wide hooks that can be
// installed once. They forward to the restClient of the registry most
// recently set up by registerRestClient (in a running kproxy, the only one).
var (
	currentRestClient atomic.Pointer[restClient]
	installHooks      sync.Once
)

// registerRestClient registers client-go's rest_client_* metrics on reg and
// makes client-go report to them.
func registerRestClient(reg k8smetrics.KubeRegistry) {
	r := newRestClient()
	r.registerOn(reg)
	currentRestClient.Store(r)
	installHooks.Do(func() {
		clientmetrics.Register(clientmetrics.RegisterOpts{
			RequestLatency:        latencyHook(func(r *restClient) *k8smetrics.HistogramVec { return r.latency }),
			RateLimiterLatency:    latencyHook(func(r *restClient) *k8smetrics.HistogramVec { return r.rateLimiter }),
			RequestSize:           sizeHook(func(r *restClient) *k8smetrics.HistogramVec { return r.requestSize }),
			ResponseSize:          sizeHook(func(r *restClient) *k8smetrics.HistogramVec { return r.respSize }),
			RequestResult:         resultHook(func(r *restClient) *k8smetrics.CounterVec { return r.results }),
			RequestRetry:          retryHook{},
			TransportCacheEntries: cacheHook{},
			TransportCreateCalls:  createHook{},
		})
	})
}

type latencyHook func(*restClient) *k8smetrics.HistogramVec

func (h latencyHook) Observe(ctx context.Context, verb string, u url.URL, d time.Duration) {
	if r := currentRestClient.Load(); r != nil {
		h(r).WithContext(ctx).WithLabelValues(verb, u.Host).Observe(d.Seconds())
	}
}

type sizeHook func(*restClient) *k8smetrics.HistogramVec

func (h sizeHook) Observe(ctx context.Context, verb, host string, size float64) {
	if r := currentRestClient.Load(); r != nil {
		h(r).WithContext(ctx).WithLabelValues(verb, host).Observe(size)
	}
}

type resultHook func(*restClient) *k8smetrics.CounterVec

func (h resultHook) Increment(ctx context.Context, code, method, host string) {
	if r := currentRestClient.Load(); r != nil {
		h(r).WithContext(ctx).WithLabelValues(code, method, host).Inc()
	}
}

type retryHook struct{}

func (retryHook) IncrementRetry(ctx context.Context, code, verb, host string) {
	if r := currentRestClient.Load(); r != nil {
		r.retries.WithContext(ctx).WithLabelValues(code, verb, host).Inc()
	}
}

type cacheHook struct{}

func (cacheHook) Observe(n int) {
	if r := currentRestClient.Load(); r != nil {
		r.cacheEntries.Set(float64(n))
	}
}

type createHook struct{}

func (createHook) Increment(result string) {
	if r := currentRestClient.Load(); r != nil {
		r.createCalls.WithLabelValues(result).Inc()
	}
}
