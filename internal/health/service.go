package health

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/objects"
)

// HealthChecker tells whether the proxy as a whole is healthy;
// *ProxyHealthServer implements it.
type HealthChecker interface {
	Healthy() bool
}

// ServiceConfig configures a ServiceHealthServer for one IP family.
type ServiceConfig struct {
	// NodeName is used in messages.
	NodeName string
	// Family selects the sockets (tcp4 or tcp6) and which NodePortAddresses
	// apply.
	Family model.Family
	// NodePortAddresses are nodePortAddresses as CIDRs ("primary" already
	// resolved), both families mixed. When none is of Family, or one of
	// them is 0.0.0.0/0 or ::/0, the ports listen on all addresses of the
	// family; else on the node's interface addresses inside them.
	NodePortAddresses []string
	// InterfaceAddrs lists the node's addresses; defaults to
	// net.InterfaceAddrs. Read once, at the first port opened.
	InterfaceAddrs func() ([]netip.Addr, error)
	// Proxy reports the proxy's health; nil counts as healthy.
	Proxy HealthChecker
	// Listen defaults to net.ListenConfig.Listen.
	Listen ListenFunc
	// Logger is used for messages; the zero value means klog.Background().
	Logger klog.Logger
	// ListenFailed, when set, is told about each port that failed to open
	// (upstream emits a FailedToStartServiceHealthcheck event).
	ListenFailed func(svc objects.Key, port uint16, err error)
}

// ServiceHealthServer serves the health-check node port of every Service
// with externalTrafficPolicy=Local: 200 when the Service has ready endpoints
// on this node and the proxy is healthy, else 503. Its methods are safe
// for concurrent use.
type ServiceHealthServer struct {
	cfg    ServiceConfig
	logger klog.Logger

	addrsOnce sync.Once
	addrs     []netip.Addr // where each port listens

	mu       sync.RWMutex
	services map[objects.Key]*instance

	// synced are the health-checked ports of the last SyncSnapshot, and
	// syncedOK whether it succeeded (only SyncSnapshot, called by one
	// goroutine, uses them): a snapshot sharing them all changed nothing.
	synced   []*model.ServicePort
	syncedOK bool
}

// instance is the listeners of one Service's health-check port.
type instance struct {
	port      uint16
	servers   []*http.Server
	listeners []net.Listener
	endpoints int // local ready endpoints
}

// NewServiceHealthServer returns a server with no ports open; it touches
// neither the network nor the interfaces until SyncServices.
func NewServiceHealthServer(cfg ServiceConfig) *ServiceHealthServer {
	if cfg.Listen == nil {
		cfg.Listen = defaultListen
	}
	if cfg.InterfaceAddrs == nil {
		cfg.InterfaceAddrs = InterfaceAddrs
	}
	logger := cfg.Logger
	if logger.GetSink() == nil {
		logger = klog.Background()
	}
	logger = logger.WithValues("ipFamily", cfg.Family.String())
	return &ServiceHealthServer{cfg: cfg, logger: logger, services: map[objects.Key]*instance{}}
}

// SyncServices makes the open ports match services (Service -> its
// healthCheckNodePort): ports of Services gone or moved are closed, new ones
// opened, unchanged ones left alone. A port that fails to open is reported
// in the returned error (and to ListenFailed) and retried on the next call;
// the others are still opened.
func (s *ServiceHealthServer) SyncServices(services map[objects.Key]uint16) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for key, inst := range s.services {
		if port, ok := services[key]; !ok || port != inst.port {
			s.logger.V(2).Info("Closing healthcheck", "service", key.String(), "port", inst.port)
			inst.close()
			delete(s.services, key)
		}
	}
	var errs []error
	for key, port := range services {
		if s.services[key] != nil {
			continue
		}
		s.logger.V(2).Info("Opening healthcheck", "service", key.String(), "port", port)
		inst, err := s.open(key, port)
		if err != nil {
			errs = append(errs, s.listenFailed(key, port, err))
			continue
		}
		s.services[key] = inst
	}
	return errors.Join(errs...)
}

func (s *ServiceHealthServer) listenFailed(key objects.Key, port uint16, err error) error {
	err = fmt.Errorf("node %s failed to start healthcheck %q on port %d: %w", s.cfg.NodeName, key.String(), port, err)
	s.logger.Error(err, "Failed to start healthcheck", "service", key.String(), "port", port)
	if s.cfg.ListenFailed != nil {
		s.cfg.ListenFailed(key, port, err)
	}
	return err
}

// SyncEndpoints sets the number of local ready endpoints per Service;
// Services missing from endpoints have none. Entries for Services without
// an open port are ignored.
func (s *ServiceHealthServer) SyncEndpoints(endpoints map[objects.Key]int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for key, inst := range s.services {
		inst.endpoints = endpoints[key]
	}
	return nil
}

// Ports returns the open health-check ports by Service.
func (s *ServiceHealthServer) Ports() map[objects.Key]uint16 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make(map[objects.Key]uint16, len(s.services))
	for key, inst := range s.services {
		out[key] = inst.port
	}
	return out
}

// Close closes every open port.
func (s *ServiceHealthServer) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for key, inst := range s.services {
		inst.close()
		delete(s.services, key)
	}
}

// Run waits until ctx is done, then closes every open port and returns nil.
// Ports are opened by SyncServices, whether or not Run runs.
func (s *ServiceHealthServer) Run(ctx context.Context) error {
	<-ctx.Done()
	s.Close()
	return nil
}

// open listens on port at every listen address and starts serving.
func (s *ServiceHealthServer) open(key objects.Key, port uint16) (*instance, error) {
	inst := &instance{port: port}
	for _, addr := range s.listenAddrs() {
		ap := netip.AddrPortFrom(addr, port).String()
		l, err := s.cfg.Listen(context.Background(), s.network(), ap)
		if err != nil {
			inst.close() // free what was opened, so a retry can take the port
			return nil, err
		}
		srv := &http.Server{Handler: serviceHandler{key: key, s: s}, ReadHeaderTimeout: 10 * time.Second}
		inst.servers = append(inst.servers, srv)
		inst.listeners = append(inst.listeners, l)
		go s.serve(key, srv, l)
	}
	return inst, nil
}

func (s *ServiceHealthServer) serve(key objects.Key, srv *http.Server, l net.Listener) {
	s.logger.V(3).Info("Starting healthcheck", "service", key.String(), "address", l.Addr().String())
	if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		s.logger.Error(err, "Healthcheck closed", "service", key.String())
		return
	}
	s.logger.V(3).Info("Healthcheck closed", "service", key.String(), "address", l.Addr().String())
}

// close stops the servers and closes the listeners now, even those whose
// Serve has not started yet; errors (already closed) do not matter.
func (inst *instance) close() {
	for _, srv := range inst.servers {
		_ = srv.Close()
	}
	for _, l := range inst.listeners {
		_ = l.Close()
	}
	inst.servers, inst.listeners = nil, nil
}

func (s *ServiceHealthServer) network() string {
	if s.cfg.Family == model.IPv6 {
		return "tcp6"
	}
	return "tcp4"
}

// endpointCount returns the Service's local ready endpoints, and false when
// its port is no longer open.
func (s *ServiceHealthServer) endpointCount(key objects.Key) (int, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	inst, ok := s.services[key]
	if !ok {
		return 0, false
	}
	return inst.endpoints, true
}

func (s *ServiceHealthServer) proxyHealthy() bool {
	return s.cfg.Proxy == nil || s.cfg.Proxy.Healthy()
}

// serviceHandler answers the health checks of one Service.
type serviceHandler struct {
	key objects.Key
	s   *ServiceHealthServer
}

func (h serviceHandler) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	count, ok := h.s.endpointCount(h.key)
	if !ok {
		// A request racing with the port's closing: upstream answers it
		// with an empty 200.
		h.s.logger.Error(nil, "Received request for closed healthcheck", "service", h.key.String())
		return
	}
	healthy := h.s.proxyHealthy()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Load-Balancing-Endpoint-Weight", strconv.Itoa(count))
	if count > 0 && healthy {
		w.WriteHeader(http.StatusOK)
	} else {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_, _ = w.Write(serviceBody(h.key, count, healthy))
}

// serviceBody is upstream's tab-indented JSON answer, byte for byte.
func serviceBody(key objects.Key, count int, healthy bool) []byte {
	return fmt.Appendf(nil, "{\n\t\"service\": {\n\t\t\"namespace\": %s,\n\t\t\"name\": %s\n\t},\n\t\"localEndpoints\": %d,\n\t\"serviceProxyHealthy\": %t\n}",
		strconv.Quote(key.Namespace), strconv.Quote(key.Name), count, healthy)
}
