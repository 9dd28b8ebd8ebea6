// Package health serves kproxy's health endpoints with upstream kube-proxy
// v1.36 semantics: /healthz and /livez on the healthz address
// (ProxyHealthServer), and one health-check node port per Service with
// externalTrafficPolicy=Local (ServiceHealthServer).
package health

import (
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/kproxy/kproxy/internal/model"
)

// FamilyHealth is the health of the proxy for one IP family.
type FamilyHealth struct {
	LastUpdated time.Time `json:"lastUpdated"`
	Healthy     bool      `json:"healthy"`
}

// ProxyHealth is the JSON body of /healthz and /livez; its fields and their
// order are upstream's.
type ProxyHealth struct {
	// LastUpdated is the newest successful update of any family; a healthy
	// answer reports the current time instead, as upstream does.
	LastUpdated time.Time `json:"lastUpdated"`
	CurrentTime time.Time `json:"currentTime"`
	// NodeEligible is set by /healthz only.
	NodeEligible *bool `json:"nodeEligible,omitempty"`
	// Healthy is true when every family is healthy.
	Healthy bool `json:"healthy"`
	// Status is keyed by family name, "IPv4" or "IPv6".
	Status map[string]FamilyHealth `json:"status,omitempty"`
}

// RequestCounter counts /healthz and /livez answers by HTTP status code;
// *metrics.Metrics implements it.
type RequestCounter interface {
	HealthzRequest(code int)
	LivezRequest(code int)
}

// ProxyConfig configures a ProxyHealthServer.
type ProxyConfig struct {
	// Addr is healthzBindAddress, host:port. Empty: Run returns at once
	// (the health state is still tracked for the service health checks).
	Addr string
	// Timeout is how long a queued update may wait for a successful sync
	// before the proxy counts as unhealthy: 2 × syncPeriod upstream.
	Timeout time.Duration
	// NodeOptional makes an unknown Node eligible. Set it when the source has
	// no cluster (the file source may carry no Node); with the API source an
	// unknown Node makes /healthz fail, as upstream does.
	NodeOptional bool
	// Node, when set, reads this node's Node as last seen, at each
	// /healthz request, as upstream reads its node manager's: a deletion
	// timestamp or the autoscaler's taint shows at once, not after the
	// next successful sync. Without it the Node is what SetNode recorded.
	Node func() model.NodeInfo
	// Counter counts answers; nil counts nothing.
	Counter RequestCounter
	// Clock defaults to the real clock.
	Clock clock.PassiveClock
	// Listen defaults to net.ListenConfig.Listen.
	Listen ListenFunc
}

// ProxyHealthServer tracks whether the proxy keeps its dataplane up to date
// and serves it on /healthz and /livez. Its methods are safe for concurrent
// use.
type ProxyHealthServer struct {
	cfg ProxyConfig

	mu sync.RWMutex
	// lastUpdated holds, per family, the time of the last successful sync
	// (or of the sync loop's start); only these families are judged.
	lastUpdated map[model.Family]time.Time
	// oldestQueued holds, per family, the time of the oldest update queued
	// since the last successful sync.
	oldestQueued map[model.Family]time.Time
	node         model.NodeInfo
}

// NewProxyHealthServer returns a health server; it does not listen until Run.
func NewProxyHealthServer(cfg ProxyConfig) *ProxyHealthServer {
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Listen == nil {
		cfg.Listen = defaultListen
	}
	return &ProxyHealthServer{
		cfg:          cfg,
		lastUpdated:  map[model.Family]time.Time{},
		oldestQueued: map[model.Family]time.Time{},
	}
}

// Updated records that family f's dataplane matches the current state: call
// it once when the sync loop starts and after every successful sync.
func (s *ProxyHealthServer) Updated(f model.Family) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.oldestQueued, f)
	s.lastUpdated[f] = s.cfg.Clock.Now()
}

// QueuedUpdate records that a change for family f waits to be programmed.
// Only the oldest pending one counts until the next Updated.
func (s *ProxyHealthServer) QueuedUpdate(f model.Family) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.oldestQueued[f]; !ok {
		s.oldestQueued[f] = s.cfg.Clock.Now()
	}
}

// SetNode records what is known of this node's Node object. Until it is
// called the Node is unknown.
func (s *ProxyHealthServer) SetNode(n model.NodeInfo) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.node = n
}

// Health returns the proxy's health, without node eligibility. A family
// is unhealthy when an update queued at least Timeout ago is still not
// programmed; a family that never called Updated is not judged.
func (s *ProxyHealthServer) Health() ProxyHealth {
	s.mu.RLock()
	defer s.mu.RUnlock()
	now := s.cfg.Clock.Now()
	h := ProxyHealth{CurrentTime: now, Healthy: true, Status: map[string]FamilyHealth{}}
	for f, last := range s.lastUpdated {
		if last.After(h.LastUpdated) {
			h.LastUpdated = last
		}
		healthy := !s.lateLocked(f, now)
		h.Status[f.String()] = FamilyHealth{LastUpdated: last, Healthy: healthy}
		h.Healthy = h.Healthy && healthy
	}
	return h
}

func (s *ProxyHealthServer) lateLocked(f model.Family, now time.Time) bool {
	queued, ok := s.oldestQueued[f]
	return ok && now.Sub(queued) >= s.cfg.Timeout
}

// Healthy reports Health().Healthy; the service health checks use it.
func (s *ProxyHealthServer) Healthy() bool { return s.Health().Healthy }

// NodeEligible reports whether load balancers may send traffic to this
// node: its Node is known (or NodeOptional), not being deleted and not
// tainted ToBeDeletedByClusterAutoscaler.
func (s *ProxyHealthServer) NodeEligible() bool {
	var n model.NodeInfo
	if s.cfg.Node != nil {
		n = s.cfg.Node()
	} else {
		s.mu.RLock()
		n = s.node
		s.mu.RUnlock()
	}
	if !n.Known {
		return s.cfg.NodeOptional
	}
	return !n.Deleting && !n.ToBeDeleted
}
