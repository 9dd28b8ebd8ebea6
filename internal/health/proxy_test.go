package health

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kproxy/kproxy/internal/metrics"
	"github.com/kproxy/kproxy/internal/model"
)

var (
	_ RequestCounter = (*metrics.Metrics)(nil)
	_ HealthChecker  = (*ProxyHealthServer)(nil)
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

const timeout = 60 * time.Second // 2 × a 30 s syncPeriod

type codeCounter struct{ healthz, livez map[int]int }

func (c *codeCounter) HealthzRequest(code int) { c.healthz[code]++ }
func (c *codeCounter) LivezRequest(code int)   { c.livez[code]++ }

func newTestProxy(nodeOptional bool) (*ProxyHealthServer, *clocktesting.FakeClock, *codeCounter) {
	clk := clocktesting.NewFakeClock(t0)
	cnt := &codeCounter{healthz: map[int]int{}, livez: map[int]int{}}
	s := NewProxyHealthServer(ProxyConfig{Timeout: timeout, NodeOptional: nodeOptional, Counter: cnt, Clock: clk})
	return s, clk, cnt
}

// get calls path and decodes the answer.
func get(t *testing.T, s *ProxyHealthServer, path string) (int, ProxyHealth, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	var h ProxyHealth
	if err := json.Unmarshal(rec.Body.Bytes(), &h); err != nil {
		t.Fatalf("%s: body %q: %v", path, rec.Body, err)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s: content type %q", path, ct)
	}
	if rec.Header().Get("X-Content-Type-Options") != "nosniff" {
		t.Errorf("%s: no nosniff header", path)
	}
	return rec.Code, h, rec.Body.String()
}

var knownNode = model.NodeInfo{Name: "n1", Known: true}

type step struct {
	name    string
	do      func(s *ProxyHealthServer, clk *clocktesting.FakeClock)
	healthz int
	livez   int
	// status is the expected per-family health; nil means no status.
	status map[string]bool
}

func updated(f model.Family) func(*ProxyHealthServer, *clocktesting.FakeClock) {
	return func(s *ProxyHealthServer, _ *clocktesting.FakeClock) { s.Updated(f) }
}

func queued(f model.Family) func(*ProxyHealthServer, *clocktesting.FakeClock) {
	return func(s *ProxyHealthServer, _ *clocktesting.FakeClock) { s.QueuedUpdate(f) }
}

func wait(d time.Duration) func(*ProxyHealthServer, *clocktesting.FakeClock) {
	return func(_ *ProxyHealthServer, clk *clocktesting.FakeClock) { clk.Step(d) }
}

func node(n model.NodeInfo) func(*ProxyHealthServer, *clocktesting.FakeClock) {
	return func(s *ProxyHealthServer, _ *clocktesting.FakeClock) { s.SetNode(n) }
}

func TestProxyHealth(t *testing.T) {
	tests := []struct {
		name         string
		nodeOptional bool
		steps        []step
	}{
		{"before anything: node unknown", false, []step{
			{"start", nil, 503, 200, nil},
		}},
		{"node optional", true, []step{
			{"start", nil, 200, 200, nil},
			{"node deleting", node(model.NodeInfo{Known: true, Deleting: true}), 503, 200, nil},
		}},
		{"queued update becomes late", false, []step{
			{"node", node(knownNode), 200, 200, nil},
			{"loop starts", updated(model.IPv4), 200, 200, map[string]bool{"IPv4": true}},
			{"queued", queued(model.IPv4), 200, 200, map[string]bool{"IPv4": true}},
			{"almost late", wait(timeout - time.Nanosecond), 200, 200, map[string]bool{"IPv4": true}},
			{"late", wait(time.Nanosecond), 503, 503, map[string]bool{"IPv4": false}},
			{"synced", updated(model.IPv4), 200, 200, map[string]bool{"IPv4": true}},
		}},
		{"oldest queued update counts", false, []step{
			{"node", node(knownNode), 200, 200, nil},
			{"loop starts", updated(model.IPv4), 200, 200, map[string]bool{"IPv4": true}},
			{"queued", queued(model.IPv4), 200, 200, map[string]bool{"IPv4": true}},
			{"later", wait(timeout / 2), 200, 200, map[string]bool{"IPv4": true}},
			{"queued again", queued(model.IPv4), 200, 200, map[string]bool{"IPv4": true}},
			{"late from the first", wait(timeout / 2), 503, 503, map[string]bool{"IPv4": false}},
		}},
		{"family never updated is not judged", false, []step{
			{"node", node(knownNode), 200, 200, nil},
			{"queued", queued(model.IPv6), 200, 200, nil},
			{"long after", wait(10 * timeout), 200, 200, nil},
		}},
		{"dual-stack: one late family", false, []step{
			{"node", node(knownNode), 200, 200, nil},
			{"v4 starts", updated(model.IPv4), 200, 200, map[string]bool{"IPv4": true}},
			{"v6 starts", updated(model.IPv6), 200, 200, map[string]bool{"IPv4": true, "IPv6": true}},
			{"v6 queued", queued(model.IPv6), 200, 200, map[string]bool{"IPv4": true, "IPv6": true}},
			{"v6 late", wait(timeout), 503, 503, map[string]bool{"IPv4": true, "IPv6": false}},
			{"v4 update does not help", updated(model.IPv4), 503, 503, map[string]bool{"IPv4": true, "IPv6": false}},
			{"v6 synced", updated(model.IPv6), 200, 200, map[string]bool{"IPv4": true, "IPv6": true}},
		}},
		{"node lifecycle only affects healthz", false, []step{
			{"loop starts", updated(model.IPv4), 503, 200, map[string]bool{"IPv4": true}},
			{"node seen", node(knownNode), 200, 200, map[string]bool{"IPv4": true}},
			{"tainted", node(model.NodeInfo{Known: true, ToBeDeleted: true}), 503, 200, map[string]bool{"IPv4": true}},
			{"untainted", node(knownNode), 200, 200, map[string]bool{"IPv4": true}},
			{"deleting", node(model.NodeInfo{Known: true, Deleting: true}), 503, 200, map[string]bool{"IPv4": true}},
			{"gone", node(model.NodeInfo{}), 503, 200, map[string]bool{"IPv4": true}},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, clk, _ := newTestProxy(tc.nodeOptional)
			for _, st := range tc.steps {
				if st.do != nil {
					st.do(s, clk)
				}
				checkStep(t, s, st)
			}
		})
	}
}

func checkStep(t *testing.T, s *ProxyHealthServer, st step) {
	t.Helper()
	code, h, _ := get(t, s, "/healthz")
	if code != st.healthz {
		t.Errorf("%s: /healthz %d, want %d", st.name, code, st.healthz)
	}
	if h.NodeEligible == nil {
		t.Errorf("%s: /healthz without nodeEligible", st.name)
	}
	checkStatus(t, st.name+": /healthz", h, st.status)
	code, h, _ = get(t, s, "/livez")
	if code != st.livez {
		t.Errorf("%s: /livez %d, want %d", st.name, code, st.livez)
	}
	if h.NodeEligible != nil {
		t.Errorf("%s: /livez has nodeEligible", st.name)
	}
	checkStatus(t, st.name+": /livez", h, st.status)
}

func checkStatus(t *testing.T, what string, h ProxyHealth, want map[string]bool) {
	t.Helper()
	if len(h.Status) != len(want) {
		t.Errorf("%s: status %v, want %v", what, h.Status, want)
	}
	allHealthy := true
	for f, healthy := range want {
		if got, ok := h.Status[f]; !ok || got.Healthy != healthy {
			t.Errorf("%s: status[%s] = %+v, want healthy=%v", what, f, got, healthy)
		}
		allHealthy = allHealthy && healthy
	}
	if h.Healthy != allHealthy {
		t.Errorf("%s: healthy %v, want %v", what, h.Healthy, allHealthy)
	}
}

func TestProxyHealthBody(t *testing.T) {
	s, clk, _ := newTestProxy(false)
	s.SetNode(knownNode)
	s.Updated(model.IPv4)
	clk.Step(time.Second)
	s.QueuedUpdate(model.IPv4)

	_, _, body := get(t, s, "/healthz")
	want := `{"lastUpdated":"2026-01-02T03:04:06Z","currentTime":"2026-01-02T03:04:06Z","nodeEligible":true,"healthy":true,` +
		`"status":{"IPv4":{"lastUpdated":"2026-01-02T03:04:05Z","healthy":true}}}`
	if body != want {
		t.Errorf("healthy /healthz body\n got %s\nwant %s", body, want)
	}

	clk.Step(timeout)
	_, _, body = get(t, s, "/livez")
	want = `{"lastUpdated":"2026-01-02T03:04:05Z","currentTime":"2026-01-02T03:05:06Z","healthy":false,` +
		`"status":{"IPv4":{"lastUpdated":"2026-01-02T03:04:05Z","healthy":false}}}`
	if body != want {
		t.Errorf("unhealthy /livez body\n got %s\nwant %s", body, want)
	}

	fresh, _, _ := newTestProxy(false)
	_, _, body = get(t, fresh, "/healthz")
	want = `{"lastUpdated":"0001-01-01T00:00:00Z","currentTime":"2026-01-02T03:04:05Z","nodeEligible":false,"healthy":true}`
	if body != want {
		t.Errorf("fresh /healthz body\n got %s\nwant %s", body, want)
	}
}

func TestProxyHealthCountsRequests(t *testing.T) {
	s, _, cnt := newTestProxy(false)
	get(t, s, "/healthz") // node unknown: 503
	s.SetNode(knownNode)
	get(t, s, "/healthz")
	get(t, s, "/healthz")
	get(t, s, "/livez")
	if cnt.healthz[503] != 1 || cnt.healthz[200] != 2 || cnt.livez[200] != 1 || len(cnt.livez) != 1 {
		t.Errorf("counts healthz=%v livez=%v", cnt.healthz, cnt.livez)
	}
}

func TestProxyHealthRun(t *testing.T) {
	addrc := make(chan string, 1)
	listen := func(ctx context.Context, network, addr string) (net.Listener, error) {
		if network != "tcp" || addr != "0.0.0.0:10256" {
			t.Errorf("listen %s %s", network, addr)
		}
		l, err := defaultListen(ctx, "tcp", "127.0.0.1:0")
		if err == nil {
			addrc <- l.Addr().String()
		}
		return l, err
	}
	s := NewProxyHealthServer(ProxyConfig{Addr: "0.0.0.0:10256", Timeout: timeout, NodeOptional: true, Listen: listen})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	addr := <-addrc
	for path, want := range map[string]int{"/healthz": 200, "/livez": 200, "/metrics": 404} {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("%s: %d, want %d", path, resp.StatusCode, want)
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run after cancel: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
	}
}

func TestProxyHealthRunErrors(t *testing.T) {
	boom := errors.New("address already in use")
	s := NewProxyHealthServer(ProxyConfig{Addr: "0.0.0.0:10256", Listen: func(context.Context, string, string) (net.Listener, error) { return nil, boom }})
	if err := s.Run(context.Background()); !errors.Is(err, boom) {
		t.Errorf("Run: %v", err)
	}
	// Disabled (no address): runs until its context ends, so the daemon
	// does not see it stop and retry it.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- NewProxyHealthServer(ProxyConfig{}).Run(ctx) }()
	select {
	case err := <-done:
		t.Fatalf("Run without address returned before cancel: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run without address: %v", err)
	}
}

func TestProxyHealthWithMetrics(t *testing.T) {
	reg := metrics.NewRegistry()
	m, err := metrics.New(reg, metrics.Options{Mode: metrics.ModeNFTables})
	if err != nil {
		t.Fatal(err)
	}
	s := NewProxyHealthServer(ProxyConfig{Timeout: timeout, Counter: m, Clock: clocktesting.NewFakeClock(t0)})
	get(t, s, "/healthz")
	get(t, s, "/livez")
	rec := httptest.NewRecorder()
	metrics.NewServer(metrics.ServerConfig{Gatherer: reg}).Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	for _, line := range []string{`kubeproxy_proxy_healthz_total{code="503"} 1`, `kubeproxy_proxy_livez_total{code="200"} 1`} {
		if !strings.Contains(rec.Body.String(), line) {
			t.Errorf("/metrics lacks %s", line)
		}
	}
}
