package changes

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/objects"
	"github.com/kproxy/kproxy/internal/source"
)

var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

func key(name string) objects.Key { return objects.Key{Namespace: "ns", Name: name} }

func svc(name, rv, ip string) *objects.Service {
	return &objects.Service{Namespace: "ns", Name: name, ResourceVersion: rv, Type: "ClusterIP",
		ClusterIPs: []string{ip}, Ports: []objects.ServicePort{{Port: 80}}}
}

func slice(name, service, rv string, ips ...string) *objects.EndpointSlice {
	es := &objects.EndpointSlice{Namespace: "ns", Name: name, ResourceVersion: rv, ServiceName: service,
		AddressType: objects.AddressTypeIPv4, Ports: []objects.EndpointPort{{Port: 8080}}}
	for _, ip := range ips {
		es.Endpoints = append(es.Endpoints, objects.Endpoint{Addr: netip.MustParseAddr(ip), HasAddress: true})
	}
	return es
}

func withTrigger(es *objects.EndpointSlice, at time.Time) *objects.EndpointSlice {
	es.TriggerTime = at.Format(time.RFC3339Nano)
	return es
}

func newTestTracker() *Tracker {
	return NewTracker("node-a", nil, WithClock(clocktesting.NewFakePassiveClock(t0)))
}

// sync takes a batch and returns it with ok; it reports the changed keys.
func syncOnce(tr *Tracker, ok bool) []string {
	b := tr.Take()
	tr.Done(b, ok)
	return changedNames(b)
}

func changedNames(b *Batch) []string {
	var out []string
	for k := range b.Changed {
		out = append(out, k.Name)
	}
	sort.Strings(out)
	return out
}

func TestTrackerEvents(t *testing.T) {
	tests := []struct {
		name string
		// before runs and is synced successfully; events then run unsynced.
		before, events []func(*Tracker)
		want           []string
	}{{
		name:   "coalesces per Service",
		events: []func(*Tracker){put(svc("a", "1", "198.18.0.1")), put(svc("a", "2", "198.18.0.2")), put(svc("b", "1", "198.18.0.3")), putSl(slice("a-1", "a", "1", "198.18.1.1"))},
		want:   []string{"a", "b"},
	}, {
		name:   "same resource version is a no-op",
		before: []func(*Tracker){put(svc("a", "1", "198.18.0.1"))},
		events: []func(*Tracker){put(svc("a", "1", "198.18.0.9"))},
	}, {
		name:   "equal content is a no-op",
		before: []func(*Tracker){put(svc("a", "1", "198.18.0.1")), putSl(slice("a-1", "a", "1", "198.18.1.1"))},
		events: []func(*Tracker){put(svc("a", "2", "198.18.0.1")), putSl(slice("a-1", "a", "2", "198.18.1.1"))},
	}, {
		name:   "changed and changed back is a no-op",
		before: []func(*Tracker){put(svc("a", "1", "198.18.0.1"))},
		events: []func(*Tracker){put(svc("a", "2", "198.18.0.2")), put(svc("a", "3", "198.18.0.1"))},
	}, {
		name:   "added then deleted before a sync is a no-op",
		events: []func(*Tracker){put(svc("a", "1", "198.18.0.1")), del("a"), putSl(slice("a-1", "a", "1", "198.18.1.1")), delSl("a-1")},
	}, {
		name:   "deleting an unknown object is a no-op",
		events: []func(*Tracker){del("a"), delSl("a-1")},
	}, {
		name:   "delete is pending",
		before: []func(*Tracker){put(svc("a", "1", "198.18.0.1")), putSl(slice("b-1", "b", "1", "198.18.1.1"))},
		events: []func(*Tracker){del("a"), delSl("b-1")},
		want:   []string{"a", "b"},
	}, {
		name:   "slice moving between Services changes both",
		before: []func(*Tracker){putSl(slice("s", "a", "1", "198.18.1.1"))},
		events: []func(*Tracker){putSl(slice("s", "b", "2", "198.18.1.1"))},
		want:   []string{"a", "b"},
	}, {
		name:   "FQDN slice counts as deleted",
		before: []func(*Tracker){putSl(slice("s", "a", "1", "198.18.1.1"))},
		events: []func(*Tracker){putSl(&objects.EndpointSlice{Namespace: "ns", Name: "s", ServiceName: "a", AddressType: "FQDN"})},
		want:   []string{"a"},
	}, {
		name:   "a new trigger time alone is a no-op",
		before: []func(*Tracker){putSl(slice("s", "a", "1", "198.18.1.1"))},
		events: []func(*Tracker){putSl(withTrigger(slice("s", "a", "2", "198.18.1.1"), t0.Add(time.Second)))},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := newTestTracker()
			run(tr, tc.before)
			syncOnce(tr, true)
			run(tr, tc.events)
			if got := syncOnce(tr, true); !slices.Equal(got, tc.want) {
				t.Errorf("Changed = %v, want %v", got, tc.want)
			}
			if n := tr.Pending(); n != 0 {
				t.Errorf("Pending after a successful sync = %d", n)
			}
		})
	}
}

func put(s *objects.Service) func(*Tracker)         { return func(t *Tracker) { t.OnService(s) } }
func putSl(s *objects.EndpointSlice) func(*Tracker) { return func(t *Tracker) { t.OnSlice(s) } }
func del(name string) func(*Tracker)                { return func(t *Tracker) { t.OnServiceDeleted(key(name)) } }
func delSl(name string) func(*Tracker)              { return func(t *Tracker) { t.OnSliceDeleted(key(name)) } }

func run(tr *Tracker, fs []func(*Tracker)) {
	for _, f := range fs {
		f(tr)
	}
}

func TestTrackerInput(t *testing.T) {
	tr := newTestTracker()
	tr.OnService(svc("a", "1", "198.18.0.1"))
	tr.OnSlice(slice("a-2", "a", "1", "198.18.1.2"))
	tr.OnSlice(slice("a-1", "a", "1", "198.18.1.1"))
	tr.OnSlice(slice("s", "b", "1", "198.18.1.3"))
	tr.OnSlice(slice("s", "a", "2", "198.18.1.3"))
	b := tr.Take()
	defer tr.Done(b, true)
	if b.Input.NodeName != "node-a" || len(b.Input.Services) != 1 {
		t.Fatalf("Input = %+v", b.Input)
	}
	var names []string
	for _, es := range b.Input.Slices[key("a")] {
		names = append(names, es.Name)
	}
	if want := []string{"a-1", "a-2", "s"}; !slices.Equal(names, want) {
		t.Errorf("slices of a = %v, want %v", names, want)
	}
	if _, ok := b.Input.Slices[key("b")]; ok {
		t.Errorf("b keeps an empty slice list")
	}
	if got := changedNames(b); !slices.Equal(got, []string{"a"}) {
		t.Errorf("Changed = %v (b was added and emptied before any sync)", got)
	}
}

func TestTrackerDone(t *testing.T) {
	a1, a2, a3 := svc("a", "1", "198.18.0.1"), svc("a", "2", "198.18.0.2"), svc("a", "3", "198.18.0.3")
	tests := []struct {
		name string
		ok   bool
		// during runs between Take and Done.
		during []func(*Tracker)
		want   []string // Changed at the next Take
		wantA  *objects.Service
	}{
		{name: "success drops", ok: true, wantA: a2},
		{name: "failure keeps", ok: false, want: []string{"a"}, wantA: a2},
		{name: "failure merges newer", ok: false, during: []func(*Tracker){put(a3), put(svc("b", "1", "198.18.0.4"))}, want: []string{"a", "b"}, wantA: a3},
		{name: "success keeps newer", ok: true, during: []func(*Tracker){put(a3)}, want: []string{"a"}, wantA: a3},
		{name: "success, changed back after take", ok: true, during: []func(*Tracker){put(a1)}, want: []string{"a"}, wantA: a1},
		{name: "failure, changed back after take", ok: false, during: []func(*Tracker){put(a1)}, wantA: a1},
		{name: "success, newer equal to what was synced", ok: true, during: []func(*Tracker){put(a3), put(svc("a", "4", "198.18.0.2"))}, wantA: a2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := newTestTracker()
			tr.OnService(a1)
			syncOnce(tr, true)
			tr.OnService(a2)
			b := tr.Take()
			run(tr, tc.during)
			tr.Done(b, tc.ok)
			b2 := tr.Take()
			if got := changedNames(b2); !slices.Equal(got, tc.want) {
				t.Errorf("Changed = %v, want %v", got, tc.want)
			}
			if got := b2.Input.Services[key("a")]; !equalService(got, tc.wantA) {
				t.Errorf("a = %+v, want %+v", got, tc.wantA)
			}
			if got := b.Input.Services[key("a")]; got != a2 {
				t.Errorf("the first batch changed under its holder: %+v", got)
			}
		})
	}
}

func TestTrackerTriggerTimes(t *testing.T) {
	tr := newTestTracker()
	t1, t2, t3 := t0.Add(time.Second), t0.Add(2*time.Second), t0.Add(3*time.Second)
	tr.OnSlice(withTrigger(slice("s", "a", "1", "198.18.1.1"), t0.Add(-time.Hour))) // before start: ignored
	tr.OnSlice(withTrigger(slice("s", "a", "2", "198.18.1.2"), t1))
	tr.OnSlice(withTrigger(slice("t", "b", "1", "198.18.1.3"), t1))
	tr.OnSliceDeleted(key("t")) // a deletion voids b's times
	b := tr.Take()
	tr.OnSlice(withTrigger(slice("s", "a", "3", "198.18.1.3"), t2))
	// Only a's second slice counts: b's time went with its deletion.
	if got := b.TriggerTimes; len(got) != 1 || !slices.Equal(got[model.IPv4], []time.Time{t1}) {
		t.Errorf("trigger times = %v, want IPv4 [%v] (a's only)", got, t1)
	}
	tr.Done(b, true)
	b = tr.Take()
	tr.OnSlice(withTrigger(slice("s", "a", "4", "198.18.1.4"), t3))
	tr.Done(b, false)
	b = tr.Take()
	if got := b.TriggerTimes[model.IPv4]; !slices.Equal(got, []time.Time{t2, t3}) {
		t.Errorf("after a failed sync: a's trigger times = %v, want [%v %v]", got, t2, t3)
	}
	tr.Done(b, true)
	if b = tr.Take(); len(b.TriggerTimes) != 0 {
		t.Errorf("trigger times after success = %v", b.TriggerTimes)
	}
}

// TestTrackerTriggerTimesByFamily: each trigger time counts under its
// slice's address family, as upstream's per-family proxiers observe them.
func TestTrackerTriggerTimesByFamily(t *testing.T) {
	tr := newTestTracker()
	t1, t2 := t0.Add(time.Second), t0.Add(2*time.Second)
	tr.OnSlice(withTrigger(slice("s4", "a", "1", "198.18.1.1"), t1))
	s6 := withTrigger(slice("s6", "a", "1", "fd00::1"), t2)
	s6.AddressType = objects.AddressTypeIPv6
	tr.OnSlice(s6)
	b := tr.Take()
	if got := b.TriggerTimes; !slices.Equal(got[model.IPv4], []time.Time{t1}) || !slices.Equal(got[model.IPv6], []time.Time{t2}) {
		t.Errorf("trigger times by family = %v, want IPv4 [%v] and IPv6 [%v]", got, t1, t2)
	}
}

func TestTrackerNode(t *testing.T) {
	tr := newTestTracker()
	n1 := &objects.Node{Name: "node-a", ResourceVersion: "1", InternalIPs: []string{"198.18.0.2"}}
	tr.OnNode(&objects.Node{Name: "node-b"})
	if tr.Node() != nil || tr.Pending() != 0 {
		t.Fatalf("another node was recorded")
	}
	tr.OnNode(n1)
	b := tr.Take()
	if !b.NodeChanged || b.Input.Node != n1 {
		t.Errorf("batch = %+v, want the new node", b)
	}
	tr.Done(b, true)
	tr.OnNode(&objects.Node{Name: "node-a", ResourceVersion: "2", InternalIPs: []string{"198.18.0.2"}})
	if tr.Pending() != 0 {
		t.Errorf("equal node is pending")
	}
	// A deleted Node stays in use as last seen, as upstream keeps it.
	tr.OnNodeDeleted()
	if tr.Pending() != 0 || tr.Node() != n1 {
		t.Errorf("after the Node's deletion: pending %d, node %+v; want the last one kept", tr.Pending(), tr.Node())
	}
	n3 := &objects.Node{Name: "node-a", ResourceVersion: "3", InternalIPs: []string{"198.18.0.3"}}
	tr.OnNode(n3)
	b = tr.Take()
	tr.Done(b, false)
	if b = tr.Take(); !b.NodeChanged || b.Input.Node != n3 {
		t.Errorf("changed node: %+v", b)
	}
	tr.OnNode(n1) // back to what was synced, after the Take
	tr.Done(b, true)
	if b = tr.Take(); !b.NodeChanged || b.Input.Node != n1 {
		t.Errorf("node back after take: NodeChanged=%v node=%v", b.NodeChanged, b.Input.Node)
	}
}

func TestTrackerSyncedAndNotify(t *testing.T) {
	var mu sync.Mutex
	calls := 0
	tr := NewTracker("node-a", func() { mu.Lock(); calls++; mu.Unlock() })
	notified := func() int { mu.Lock(); defer mu.Unlock(); c := calls; calls = 0; return c }

	tr.OnSynced(source.Services)
	if tr.Synced() || notified() != 1 {
		t.Errorf("synced with Services only")
	}
	tr.OnSynced(source.EndpointSlices)
	tr.OnSynced(source.EndpointSlices)
	if !tr.Synced() || tr.NodeSynced() || notified() != 1 {
		t.Errorf("Synced=%v NodeSynced=%v", tr.Synced(), tr.NodeSynced())
	}
	tr.OnSynced(source.Nodes)
	if !tr.NodeSynced() {
		t.Errorf("NodeSynced = false")
	}
	notified()
	tr.OnService(svc("a", "1", "198.18.0.1"))
	tr.OnService(svc("a", "1", "198.18.0.1"))
	if n := notified(); n != 1 {
		t.Errorf("notify calls = %d, want 1 (the no-op does not notify)", n)
	}
}

type countingObserver struct{ svcTotal, epTotal, svcPending, epPending int }

func (o *countingObserver) ServiceChanged(p int)   { o.svcTotal++; o.svcPending = p }
func (o *countingObserver) EndpointsChanged(p int) { o.epTotal++; o.epPending = p }
func (o *countingObserver) ChangesPending(s, e int) {
	o.svcPending, o.epPending = s, e
}

func TestTrackerObserver(t *testing.T) {
	o := &countingObserver{}
	tr := NewTracker("node-a", nil, WithObserver(o))
	tr.OnService(svc("a", "1", "198.18.0.1"))
	tr.OnService(svc("a", "1", "198.18.0.1"))
	tr.OnSlice(slice("s", "b", "1", "198.18.1.1"))
	want := countingObserver{svcTotal: 2, epTotal: 1, svcPending: 1, epPending: 1}
	if *o != want {
		t.Errorf("observer = %+v, want %+v", *o, want)
	}
	syncOnce(tr, true)
	if o.svcPending != 0 || o.epPending != 0 {
		t.Errorf("pending after sync = %d, %d", o.svcPending, o.epPending)
	}
}

// TestTrackerConcurrent runs sources and a sync loop at once (go test -race).
func TestTrackerConcurrent(t *testing.T) {
	tr := newTestTracker()
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 200 {
				name := fmt.Sprintf("s%d-%d", w, i%20)
				tr.OnService(svc(name, fmt.Sprint(i), fmt.Sprintf("198.18.%d.%d", w, i%250)))
				tr.OnSlice(slice(name+"-x", name, fmt.Sprint(i), fmt.Sprintf("198.19.%d.%d", w, i%250)))
				if i%7 == 0 {
					tr.OnServiceDeleted(key(name))
				}
			}
		})
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 300; i++ {
			b := tr.Take()
			for k, s := range b.Input.Services { // read the view while writers run
				if s.Key() != k {
					t.Errorf("key mismatch")
				}
			}
			tr.Done(b, i%3 != 0)
		}
	}()
	wg.Wait()
	<-done
	syncOnce(tr, true)
	if n := tr.Pending(); n != 0 {
		t.Errorf("Pending = %d after a final successful sync", n)
	}
	b := tr.Take()
	if len(b.Input.Services) == 0 || len(b.Input.Slices) != 80 {
		t.Errorf("services=%d slices=%d", len(b.Input.Services), len(b.Input.Slices))
	}
}

func BenchmarkTake10k(b *testing.B) {
	benchTake(b, (*Tracker).Take)
}

func BenchmarkTakeChanges10k(b *testing.B) {
	benchTake(b, (*Tracker).TakeChanges)
}

// benchTake times one Service change taken and synced at 10k Services.
func benchTake(b *testing.B, take func(*Tracker) *Batch) {
	tr := newTestTracker()
	for i := range 10000 {
		name := fmt.Sprintf("s%d", i)
		tr.OnService(svc(name, "1", "198.18.0.1"))
		tr.OnSlice(slice(name, name, "1", "198.19.0.1"))
	}
	syncOnce(tr, true)
	b.ResetTimer()
	for i := range b.N {
		tr.OnService(svc("s1", fmt.Sprint(i+2), fmt.Sprintf("198.18.0.%d", i%200+2)))
		tr.Done(take(tr), true)
	}
}
