// Package sourcetest has a source.Handler that records events, for tests of
// sources and of code that consumes them.
package sourcetest

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/objects"
	"github.com/kproxy/kproxy/internal/source"
)

// Recorder is a source.Handler that logs each event as a line such as
// "service ns/a", "service-deleted ns/a", "slice ns/a-1", "node n1",
// "node-deleted", "servicecidr kubernetes", "servicecidr-deleted kubernetes",
// "synced Services", and keeps the last objects seen.
type Recorder struct {
	mu       sync.Mutex
	events   []string
	Services map[objects.Key]*objects.Service
	Slices   map[objects.Key]*objects.EndpointSlice
	Node     *objects.Node
	// ServiceCIDRs are keyed by name.
	ServiceCIDRs map[string]*objects.ServiceCIDR
}

var _ source.Handler = (*Recorder)(nil)

// NewRecorder returns an empty Recorder.
func NewRecorder() *Recorder {
	return &Recorder{
		Services:     map[objects.Key]*objects.Service{},
		Slices:       map[objects.Key]*objects.EndpointSlice{},
		ServiceCIDRs: map[string]*objects.ServiceCIDR{},
	}
}

func (r *Recorder) add(format string, args ...any) {
	r.events = append(r.events, fmt.Sprintf(format, args...))
}

func (r *Recorder) OnService(s *objects.Service) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Services[s.Key()] = s
	r.add("service %s", s.Key())
}

func (r *Recorder) OnServiceDeleted(k objects.Key) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.Services, k)
	r.add("service-deleted %s", k)
}

func (r *Recorder) OnSlice(s *objects.EndpointSlice) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Slices[s.Key()] = s
	r.add("slice %s", s.Key())
}

func (r *Recorder) OnSliceDeleted(k objects.Key) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.Slices, k)
	r.add("slice-deleted %s", k)
}

func (r *Recorder) OnNode(n *objects.Node) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Node = n
	r.add("node %s", n.Name)
}

func (r *Recorder) OnNodeDeleted() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Node = nil
	r.add("node-deleted")
}

func (r *Recorder) OnServiceCIDR(c *objects.ServiceCIDR) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ServiceCIDRs[c.Name] = c
	r.add("servicecidr %s", c.Name)
}

func (r *Recorder) OnServiceCIDRDeleted(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.ServiceCIDRs, name)
	r.add("servicecidr-deleted %s", name)
}

func (r *Recorder) OnSynced(k source.Kind) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.add("synced %s", k)
}

// Take returns the events recorded since the last Take and forgets them.
func (r *Recorder) Take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	ev := r.events
	r.events = nil
	return ev
}

// Do runs f with the Recorder locked, to read its objects.
func (r *Recorder) Do(f func(r *Recorder)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f(r)
}

// WaitFor waits up to 10 s until every event in want has been recorded (in
// any order, among others) and returns all events taken meanwhile. It fails
// t on timeout.
func (r *Recorder) WaitFor(t testing.TB, want ...string) []string {
	t.Helper()
	var got []string
	deadline := time.Now().Add(10 * time.Second)
	for {
		got = append(got, r.Take()...)
		if containsAll(got, want) {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %q; got %q", want, got)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func containsAll(got, want []string) bool {
	for _, w := range want {
		if !slices.Contains(got, w) {
			return false
		}
	}
	return true
}
