package metrics

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/component-base/logs"
	k8smetrics "k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/prometheus/slis"
	"k8s.io/klog/v2"
)

// ConfigzGroup is the key under which /configz shows the configuration, as
// upstream's configz registry does.
const ConfigzGroup = "kubeproxy.config.k8s.io"

// ListenFunc opens a listener; net.ListenConfig.Listen has this shape.
type ListenFunc func(ctx context.Context, network, addr string) (net.Listener, error)

// ServerConfig configures the metrics HTTP server.
type ServerConfig struct {
	// Addr is metricsBindAddress, host:port. Empty: Run returns at once.
	Addr string
	// Gatherer is what /metrics exposes (a KubeRegistry, usually the one
	// New registered on).
	Gatherer k8smetrics.Gatherer
	// Mode is the text of /proxyMode.
	Mode string
	// Configz returns the effective configuration (a v1alpha1
	// KubeProxyConfiguration with apiVersion and kind set) for /configz;
	// nil serves {}.
	Configz func() any
	// Profiling installs /debug/pprof/* (enableProfiling).
	Profiling bool
	// Statusz serves /statusz (the ComponentStatusz gate); nil: not.
	Statusz *Statusz
	// Flagz returns every command-line flag's value for /flagz (the
	// ComponentFlagz gate); nil: not served.
	Flagz func() map[string]string
	// Listen defaults to net.ListenConfig.Listen.
	Listen ListenFunc
}

// Server serves /metrics, /proxyMode, /configz, /healthz (and /healthz/ping),
// /metrics/slis, /statusz and /flagz (zpages.go) and, with profiling,
// /debug/pprof/* on the metrics address.
type Server struct {
	cfg ServerConfig
}

// NewServer returns a metrics server; it does not listen until Run.
func NewServer(cfg ServerConfig) *Server {
	if cfg.Listen == nil {
		var lc net.ListenConfig
		cfg.Listen = lc.Listen
	}
	return &Server{cfg: cfg}
}

// Handler returns the server's routes.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", serveHealthz)
	mux.HandleFunc("/healthz/ping", servePing)
	mux.HandleFunc("/proxyMode", s.serveProxyMode)
	if s.cfg.Gatherer != nil {
		mux.Handle("/metrics", k8smetrics.HandlerFor(s.cfg.Gatherer, k8smetrics.HandlerOpts{}))
	}
	// The component SLI endpoint upstream serves: the health checks that
	// /healthz records (serveHealthz).
	slis.SLIMetricsWithReset{}.Install(mux)
	mux.HandleFunc("/configz", s.serveConfigz)
	if s.cfg.Flagz != nil {
		mux.HandleFunc("/flagz", s.serveFlagz)
	}
	if s.cfg.Statusz != nil {
		mux.HandleFunc("/statusz", s.serveStatusz)
	}
	if s.cfg.Profiling {
		installProfiling(mux)
	}
	return mux
}

// Run listens on Addr and serves until ctx is done (then it returns nil),
// or returns the error that stopped it.
func (s *Server) Run(ctx context.Context) error {
	if s.cfg.Addr == "" {
		// Disabled (an empty address, e.g. port 0): nothing to serve, but
		// the daemon runs on, as upstream's does without this server.
		<-ctx.Done()
		return nil
	}
	l, err := s.cfg.Listen(ctx, "tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("starting metrics server on %s: %w", s.cfg.Addr, err)
	}
	klog.FromContext(ctx).V(3).Info("Starting metrics server", "address", l.Addr().String())
	return serve(ctx, &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second}, l)
}

// serve runs srv on l until ctx is done.
func serve(ctx context.Context, srv *http.Server, l net.Listener) error {
	stop := context.AfterFunc(ctx, func() { _ = srv.Close() })
	defer stop()
	err := srv.Serve(l)
	if ctx.Err() != nil && errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("metrics server stopped: %w", err)
}

func textHeaders(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
}

// serveHealthz answers like the apiserver healthz handler with its one
// default check (ping), which upstream installs on the metrics mux: the
// check's result goes to the SLI metrics (kubernetes_healthcheck and
// kubernetes_healthchecks_total on /metrics/slis) unless ?exclude=ping
// skips it; ?verbose lists the checks, and excluded names that match no
// check are warned about.
func serveHealthz(w http.ResponseWriter, r *http.Request) {
	var out strings.Builder
	var unknown []string
	pingExcluded := false
	for _, name := range slices.Sorted(maps.Keys(excludedChecks(r))) {
		if name == "ping" {
			pingExcluded = true
			continue
		}
		unknown = append(unknown, strconv.Quote(name))
	}
	if pingExcluded {
		out.WriteString("[+]ping excluded: ok\n")
	} else {
		_ = slis.ObserveHealthcheck(context.Background(), "ping", "healthz", slis.Success)
		out.WriteString("[+]ping ok\n")
	}
	if len(unknown) > 0 {
		fmt.Fprintf(&out, "warn: some health checks cannot be excluded: no matches for %s\n", strings.Join(unknown, ","))
	}
	textHeaders(w)
	if _, verbose := r.URL.Query()["verbose"]; !verbose {
		fmt.Fprint(w, "ok")
		return
	}
	fmt.Fprint(w, out.String()+"healthz check passed\n")
}

// excludedChecks are the ?exclude= names of a healthz request.
func excludedChecks(r *http.Request) map[string]bool {
	out := map[string]bool{}
	for _, name := range r.URL.Query()["exclude"] {
		out[name] = true
	}
	return out
}

func servePing(w http.ResponseWriter, _ *http.Request) {
	textHeaders(w)
	fmt.Fprint(w, "ok")
}

func (s *Server) serveProxyMode(w http.ResponseWriter, _ *http.Request) {
	textHeaders(w)
	fmt.Fprint(w, s.cfg.Mode)
}

func (s *Server) serveConfigz(w http.ResponseWriter, _ *http.Request) {
	sections := map[string]any{}
	if s.cfg.Configz != nil {
		if c := s.cfg.Configz(); c != nil {
			sections[ConfigzGroup] = c
		}
	}
	b, err := json.Marshal(sections)
	if err != nil {
		http.Error(w, fmt.Sprintf("error marshaling json: %v", err), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	_, _ = w.Write(b)
}

// installProfiling adds the pprof routes the apiserver's Profiling installs.
func installProfiling(mux *http.ServeMux) {
	mux.HandleFunc("/debug/pprof", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/debug/pprof/", http.StatusFound)
	})
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("/debug/flags", serveDebugFlags)
	mux.HandleFunc("/debug/flags/", serveDebugFlags)
	mux.HandleFunc("/debug/flags/v", serveVerbosity)
}

// setVerbosity sets klog's verbosity (component-base's setter, which
// upstream's /debug/flags/v calls).
var setVerbosity = logs.GlogSetter

// serveVerbosity is /debug/flags/v: a PUT whose body is a number sets the
// log verbosity, as upstream's with profiling on.
func serveVerbosity(w http.ResponseWriter, r *http.Request) {
	reply := func(code int, text string) {
		textHeaders(w)
		w.WriteHeader(code)
		_, _ = fmt.Fprintln(w, text)
	}
	if r.Method != http.MethodPut {
		reply(http.StatusNotAcceptable, "unsupported http method")
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 64))
	if err != nil {
		reply(http.StatusBadRequest, "error reading request body: "+err.Error())
		return
	}
	msg, err := setVerbosity(strings.TrimSpace(string(body)))
	if err != nil {
		reply(http.StatusBadRequest, err.Error())
		return
	}
	reply(http.StatusOK, msg)
}

// serveDebugFlags is /debug/flags: the flags /debug/flags/ can set.
func serveDebugFlags(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, _ = fmt.Fprint(w, "<html>\n<head>\n<title>/debug/flags/</title>\n</head>\n<body>\n/debug/flags/<br>\n<br>\nflags:<br>\n<table>\n<tr>v<br>\n</table>\n<br>\nfull flags configurable<br>\n</body>\n</html>\n")
}
