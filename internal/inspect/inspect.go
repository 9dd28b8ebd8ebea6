// Package inspect is kproxy's debug endpoint and its client, kproxy
// inspect: what a running kproxy programmed (Services, their frontends and
// endpoints with their state), when it last synced and how long that took,
// what is pending, how often it repaired drift. The endpoint serves on a
// loopback address only (--debug-bind-address, off by default); it also
// answers kproxy explain --debug-address from the live snapshot.
package inspect

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kproxy/kproxy/internal/explain"
	"github.com/kproxy/kproxy/internal/model"
)

// Paths of the debug endpoint.
const (
	PathState   = "/debug/kproxy/state"
	PathExplain = "/debug/kproxy/explain"
)

// State is what GET PathState answers (kproxy inspect -o json).
type State struct {
	Node     string    `json:"node"`
	Mode     string    `json:"mode"`
	Families []string  `json:"families"`
	Now      time.Time `json:"now"`
	// LastSync is the last sync attempt; LastSuccess the last one that
	// programmed the kernel (nil before the first).
	LastSync    *Sync `json:"lastSync,omitempty"`
	LastSuccess *Sync `json:"lastSuccess,omitempty"`
	// FirstSuccess is this process's first successful sync.
	FirstSuccess *Sync `json:"firstSuccess,omitempty"`
	Syncs        int   `json:"syncs"`
	FailedSyncs  int   `json:"failedSyncs"`
	// DriftRepairs counts the syncs that repaired kernel state changed
	// behind kproxy's back.
	DriftRepairs int `json:"driftRepairs"`
	// PendingServices and PendingEndpoints are the changes received and not
	// yet programmed.
	PendingServices  int       `json:"pendingServices"`
	PendingEndpoints int       `json:"pendingEndpoints"`
	Services         []Service `json:"services"`
}

// Sync is one sync attempt.
type Sync struct {
	Time     time.Time     `json:"time"`
	Duration time.Duration `json:"durationNanos"`
	Full     bool          `json:"full"`
	Reason   string        `json:"reason,omitempty"`
	Changed  int           `json:"changedServices"`
	Error    string        `json:"error,omitempty"`
	// KernelOps is how many kernel operations a successful sync wrote
	// (absent when the mode does not say): after a restart, the first
	// sync writes only what changed while kproxy was down.
	KernelOps *int `json:"kernelOperations,omitempty"`
}

// Service is one service port in one family as the last successful sync
// programmed it.
type Service struct {
	Service   string     `json:"service"` // namespace/name:port
	Family    string     `json:"family"`
	Protocol  string     `json:"protocol"`
	Frontends []string   `json:"frontends"`
	Endpoints []Endpoint `json:"endpoints"`
	// ClusterEndpoints and LocalEndpoints count the endpoints each policy
	// uses (-1: the port uses no such policy).
	ClusterEndpoints int    `json:"clusterEndpoints"`
	LocalEndpoints   int    `json:"localEndpoints"`
	Policies         string `json:"policies,omitempty"`
	// Objects is how many kernel objects the dataplane writes for the
	// port (rules and set elements; -1: the mode does not count them).
	Objects int `json:"objects"`
}

// Endpoint is one endpoint with its state.
type Endpoint struct {
	Address string `json:"address"`
	State   string `json:"state"`
	Local   bool   `json:"local"`
}

// Recorder keeps what the debug endpoint shows, fed by the sync loop. Its
// methods are safe for concurrent use.
type Recorder struct {
	mu       sync.Mutex
	node     string
	mode     string
	fams     []string
	snap     *model.Snapshot
	last     *Sync
	success  *Sync
	first    *Sync
	syncs    int
	failed   int
	drift    int
	pendSvc  int
	pendEps  int
	explainF ExplainFunc
	objects  ObjectsFunc
}

// ObjectsFunc counts the kernel objects a dataplane writes per Service
// port of a family (dataplane.ObjectCounter).
type ObjectsFunc func(fs *model.FamilySnapshot, node model.NodeInfo) map[model.PortID]int

// ExplainFunc answers an explain request from a snapshot.
type ExplainFunc func(snap *model.Snapshot, req explain.Request) (*explain.Answer, error)

// NewRecorder returns a recorder for node in mode; explainF answers
// PathExplain (nil: not served).
func NewRecorder(node, mode string, fams []model.Family, explainF ExplainFunc) *Recorder {
	r := &Recorder{node: node, mode: mode, explainF: explainF}
	for _, f := range fams {
		r.fams = append(r.fams, f.String())
	}
	return r
}

// CountObjects has State count each Service port's kernel objects with f
// (nil: not counted).
func (r *Recorder) CountObjects(f ObjectsFunc) {
	r.mu.Lock()
	r.objects = f
	r.mu.Unlock()
}

// Synced records a sync attempt; snap is nil when it failed.
func (r *Recorder) Synced(s Sync, snap *model.Snapshot) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.syncs++
	r.last = &s
	if s.Error != "" {
		r.failed++
		return
	}
	if s.Reason == "drift" {
		r.drift++
	}
	r.success = &s
	if r.first == nil {
		r.first = &s
	}
	r.snap = snap
}

// Pending records the changes waiting to be programmed.
func (r *Recorder) Pending(services, endpoints int) {
	r.mu.Lock()
	r.pendSvc, r.pendEps = services, endpoints
	r.mu.Unlock()
}

// State returns the current state.
func (r *Recorder) State(now time.Time) *State {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := &State{Node: r.node, Mode: r.mode, Families: r.fams, Now: now, LastSync: r.last, LastSuccess: r.success, FirstSuccess: r.first,
		Syncs: r.syncs, FailedSyncs: r.failed, DriftRepairs: r.drift, PendingServices: r.pendSvc, PendingEndpoints: r.pendEps,
		Services: []Service{}}
	if r.snap != nil {
		for _, fs := range []*model.FamilySnapshot{r.snap.V4, r.snap.V6} {
			if fs == nil {
				continue
			}
			var objects map[model.PortID]int
			if r.objects != nil && len(fs.Ports) > 0 {
				objects = r.objects(fs, r.snap.Node)
			}
			for _, p := range fs.Ports {
				s := service(p)
				s.Objects = -1
				if n, ok := objects[p.ID]; ok {
					s.Objects = n
				}
				st.Services = append(st.Services, s)
			}
		}
	}
	return st
}

func service(p *model.ServicePort) Service {
	s := Service{Service: p.ID.String(), Family: p.Family.String(), Protocol: string(p.Protocol),
		ClusterEndpoints: -1, LocalEndpoints: -1, Frontends: []string{}, Endpoints: []Endpoint{}}
	if p.ClusterIP.IsValid() {
		s.Frontends = append(s.Frontends, netip.AddrPortFrom(p.ClusterIP, p.Port).String())
	}
	for _, ip := range p.ExternalIPs {
		s.Frontends = append(s.Frontends, "externalIP "+netip.AddrPortFrom(ip, p.Port).String())
	}
	for _, ip := range p.LoadBalancerIPs {
		s.Frontends = append(s.Frontends, "LB "+netip.AddrPortFrom(ip, p.Port).String())
	}
	if p.NodePort != 0 {
		s.Frontends = append(s.Frontends, fmt.Sprintf("NodePort %d", p.NodePort))
	}
	if p.UsesClusterEndpoints() {
		s.ClusterEndpoints = len(p.ClusterEndpoints)
	}
	if p.UsesLocalEndpoints() {
		s.LocalEndpoints = len(p.LocalEndpoints)
	}
	var pol []string
	if p.InternalPolicyLocal {
		pol = append(pol, "ITP=Local")
	}
	if p.ExternalPolicyLocal {
		pol = append(pol, "ETP=Local")
	}
	if p.AffinityTimeout > 0 {
		pol = append(pol, fmt.Sprintf("affinity=%ds", p.AffinityTimeout))
	}
	if p.TopologyMode != "" {
		pol = append(pol, "topology="+p.TopologyMode)
	}
	s.Policies = strings.Join(pol, ",")
	for _, ep := range p.Endpoints {
		st := "not ready"
		switch {
		case ep.Ready:
			st = "ready"
		case ep.Serving && ep.Terminating:
			st = "serving-terminating"
		case ep.Terminating:
			st = "terminating"
		}
		s.Endpoints = append(s.Endpoints, Endpoint{Address: ep.AddrPort().String(), State: st, Local: ep.IsLocal})
	}
	return s
}

// Handler serves PathState and PathExplain.
func (r *Recorder) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc(PathState, func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, r.State(time.Now()))
	})
	mux.HandleFunc(PathExplain, r.serveExplain)
	return mux
}

func (r *Recorder) serveExplain(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	snap, f := r.snap, r.explainF
	r.mu.Unlock()
	if f == nil || snap == nil {
		http.Error(w, "no snapshot programmed yet", http.StatusServiceUnavailable)
		return
	}
	q := req.URL.Query()
	from, err := netip.ParseAddr(q.Get("from"))
	if err != nil {
		http.Error(w, "from: not an IP address", http.StatusBadRequest)
		return
	}
	to, proto, err := explain.ParseTo(q.Get("to"))
	if err != nil {
		http.Error(w, "to: "+err.Error(), http.StatusBadRequest)
		return
	}
	a, err := f(snap, explain.Request{From: from.Unmap(), To: to, Protocol: proto})
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	writeJSON(w, http.StatusOK, a)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// Server serves a Recorder on a loopback address.
type Server struct {
	Addr     string
	Recorder *Recorder
}

// Run serves until ctx is done.
func (s *Server) Run(ctx context.Context) error {
	ap, err := netip.ParseAddrPort(s.Addr)
	if err != nil || !ap.Addr().IsLoopback() {
		return fmt.Errorf("debug endpoint %q: not a loopback IP:port", s.Addr)
	}
	ln, err := net.Listen("tcp", s.Addr)
	if err != nil {
		return fmt.Errorf("debug endpoint: %w", err)
	}
	srv := &http.Server{Handler: s.Recorder.Handler(), ReadHeaderTimeout: 5 * time.Second}
	stop := context.AfterFunc(ctx, func() { _ = srv.Close() })
	defer stop()
	err = srv.Serve(ln)
	if ctx.Err() != nil && errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("debug endpoint stopped: %w", err)
}

// SortServices orders services by name, then family.
func SortServices(s []Service) {
	slices.SortFunc(s, func(a, b Service) int {
		if c := strings.Compare(a.Service, b.Service); c != 0 {
			return c
		}
		return strings.Compare(a.Family, b.Family)
	})
}
