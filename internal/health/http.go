package health

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"k8s.io/klog/v2"
)

// ListenFunc opens a listener; net.ListenConfig.Listen has this shape.
type ListenFunc func(ctx context.Context, network, addr string) (net.Listener, error)

func defaultListen(ctx context.Context, network, addr string) (net.Listener, error) {
	var lc net.ListenConfig
	return lc.Listen(ctx, network, addr)
}

// Handler returns the /healthz and /livez routes.
func (s *ProxyHealthServer) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", s.serveHealthz)
	mux.HandleFunc("/livez", s.serveLivez)
	return mux
}

// Run listens on Addr and serves /healthz and /livez until ctx is done
// (then it returns nil), or returns the error that stopped it.
func (s *ProxyHealthServer) Run(ctx context.Context) error {
	if s.cfg.Addr == "" {
		// Disabled (an empty address, e.g. port 0): nothing to serve, but
		// the daemon runs on, as upstream's does without this server.
		<-ctx.Done()
		return nil
	}
	l, err := s.cfg.Listen(ctx, "tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("failed to start proxy healthz on %s: %w", s.cfg.Addr, err)
	}
	klog.FromContext(ctx).V(3).Info("Starting healthz HTTP server", "address", l.Addr().String())
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second}
	stop := context.AfterFunc(ctx, func() { _ = srv.Close() })
	defer stop()
	err = srv.Serve(l)
	if ctx.Err() != nil && errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("proxy healthz closed with error: %w", err)
}

// serveHealthz answers 200 when the proxy is healthy and the node eligible,
// else 503.
func (s *ProxyHealthServer) serveHealthz(w http.ResponseWriter, _ *http.Request) {
	h := s.Health()
	eligible := s.NodeEligible()
	h.NodeEligible = &eligible
	code := s.write(w, h, h.Healthy && eligible)
	if s.cfg.Counter != nil {
		s.cfg.Counter.HealthzRequest(code)
	}
}

// serveLivez answers 200 when the proxy is healthy, else 503; the node
// does not matter.
func (s *ProxyHealthServer) serveLivez(w http.ResponseWriter, _ *http.Request) {
	h := s.Health()
	code := s.write(w, h, h.Healthy)
	if s.cfg.Counter != nil {
		s.cfg.Counter.LivezRequest(code)
	}
}

// write sends h with 200 or 503 and returns the code. A healthy answer
// reports the current time as lastUpdated, for compatibility with clients
// of old releases that read it as "the sync loop is alive".
func (s *ProxyHealthServer) write(w http.ResponseWriter, h ProxyHealth, healthy bool) int {
	code := http.StatusServiceUnavailable
	if healthy {
		code = http.StatusOK
		h.LastUpdated = s.cfg.Clock.Now()
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	body, _ := json.Marshal(h) // plain struct: cannot fail
	_, _ = w.Write(body)
	return code
}
