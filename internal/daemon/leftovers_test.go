package daemon

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/objects"
)

// eventLog records, in order, what the daemon did to the kernel.
type eventLog struct {
	mu     sync.Mutex
	events []string
}

func (l *eventLog) add(e string) {
	l.mu.Lock()
	l.events = append(l.events, e)
	l.mu.Unlock()
}

func (l *eventLog) get() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.events)
}

// cleanupRecorder is a fakeDataplane whose Cleanup is logged.
type cleanupRecorder struct {
	*fakeDataplane
	name string
	log  *eventLog
}

func (c cleanupRecorder) Cleanup(context.Context) error {
	c.log.add("cleanup " + c.name)
	return nil
}

// TestLeftoversRemovedAfterFirstSync: the other modes' state and the IPVS
// remnants go only once the first sync of this mode succeeded, never
// before it and never again; a failed first sync keeps them.
func TestLeftoversRemovedAfterFirstSync(t *testing.T) {
	node := &objects.Node{Name: "node-a", InternalIPs: []string{"198.18.1.1"}}
	tr := newFakeTracker(node)
	dp := newFakeDataplane()
	dp.failNext(1)
	log := &eventLog{}
	inputs := func(_ *config.Options, _ string, notify func()) (Inputs, error) {
		tr.notify = notify
		return Inputs{Source: syncingSource{tr}, Tracker: tr, NodeExpected: true}, nil
	}
	e := testEnv(inputs, dp)
	e.dataplanes[ModeIPTables] = func(dataplane.Config) (dataplane.Dataplane, error) {
		return cleanupRecorder{newFakeDataplane(), ModeIPTables, log}, nil
	}
	e.ipvsCleanup = func(context.Context) error { log.add("cleanup ipvs"); return nil }
	e.firewallCleanup = func(context.Context) error { log.add("cleanup firewall"); return nil }
	runInBackground(t, e)

	if c := nextSync(t, dp); c.err == nil {
		t.Fatal("injected failure did not happen")
	}
	if got := log.get(); len(got) != 0 {
		t.Fatalf("leftovers removed after a failed first sync: %v", got)
	}
	if c := nextSync(t, dp); c.err != nil {
		t.Fatalf("retry failed: %v", c.err)
	}
	want := []string{"cleanup iptables", "cleanup firewall", "cleanup ipvs"}
	waitFor(t, func() bool { return len(log.get()) >= len(want) }, "leftovers removed after the first successful sync")
	tr.putService(svcObj("later"))
	nextSync(t, dp)
	if got := log.get(); !slices.Equal(got, want) {
		t.Errorf("cleanups = %v, want %v once", got, want)
	}
}

func TestFirewallRemoval(t *testing.T) {
	saved := `*filter
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-FIREWALL - [0:0]
-A INPUT -j KUBE-FIREWALL
-A INPUT -s 198.18.0.0/24 -j ACCEPT
-A OUTPUT -j KUBE-FIREWALL
-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block incoming localnet connections" -j DROP
COMMIT
`
	want := `*filter
-D INPUT -j KUBE-FIREWALL
-D OUTPUT -j KUBE-FIREWALL
:KUBE-FIREWALL - [0:0]
-X KUBE-FIREWALL
COMMIT
`
	whole := "*mangle\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n" + saved + "*nat\n:KUBE-FIREWALL - [0:0]\nCOMMIT\n"
	if got := firewallRemoval(tableSection(whole, "filter")); got != want {
		t.Errorf("firewallRemoval =\n%s\nwant\n%s", got, want)
	}
	if got := firewallRemoval("*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n"); got != "" {
		t.Errorf("firewallRemoval without the chain = %q, want nothing", got)
	}
	if !hasKubeletHint("*mangle\n:KUBE-KUBELET-CANARY - [0:0]\n") || hasKubeletHint("*mangle\n:KUBE-PROXY-CANARY - [0:0]\n") {
		t.Error("hasKubeletHint: wrong answer")
	}
}

// changeCounter is an Observer that also counts change events.
type changeCounter struct {
	mu       sync.Mutex
	services int
}

func (*changeCounter) Started([]model.Family) {}
func (*changeCounter) Queued([]model.Family)  {}
func (*changeCounter) Synced(SyncReport)      {}
func (c *changeCounter) ServiceChanged(int) {
	c.mu.Lock()
	c.services++
	c.mu.Unlock()
}
func (*changeCounter) EndpointsChanged(int)    {}
func (*changeCounter) ChangesPending(int, int) {}

// TestChangeObserverWired: the servers' observer that counts change events
// is handed to the inputs once the servers exist.
func TestChangeObserverWired(t *testing.T) {
	tr := newFakeTracker(&objects.Node{Name: "node-a", InternalIPs: []string{"198.18.1.1"}})
	dp := newFakeDataplane()
	got := make(chan ChangeObserver, 1)
	inputs := func(_ *config.Options, _ string, notify func()) (Inputs, error) {
		tr.notify = notify
		return Inputs{Source: syncingSource{tr}, Tracker: tr, ObserveChanges: func(o ChangeObserver) { got <- o }}, nil
	}
	e := testEnv(inputs, dp)
	counter := &changeCounter{}
	e.servers = func(ServerParams) ([]Server, []Observer, error) { return nil, []Observer{counter}, nil }
	runInBackground(t, e)
	select {
	case o := <-got:
		o.ServiceChanged(1)
		if counter.services != 1 {
			t.Errorf("the handed-over observer is not the servers' one")
		}
	case <-time.After(testTimeout):
		t.Fatal("ObserveChanges never called")
	}
}
