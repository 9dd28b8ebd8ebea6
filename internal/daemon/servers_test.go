package daemon

import (
	"context"
	"fmt"
	"net"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/metrics"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/objects"
	"github.com/kproxy/kproxy/internal/runner"
)

// TestHealthBeforeFirstSync: as upstream, /healthz is healthy from the
// start of the sync loop when this node's Node is known, not only after the
// first sync (which takes seconds at scale); a node being deleted is not
// eligible from the start either. Eligibility follows the Node as read at
// each request, not as of the last sync.
func TestHealthBeforeFirstSync(t *testing.T) {
	for _, tc := range []struct {
		name         string
		node         model.NodeInfo
		wantEligible bool
	}{
		{"node known", model.NodeInfo{Name: "n1", Known: true}, true},
		{"node unknown", model.NodeInfo{Name: "n1"}, false},
		{"node being deleted", model.NodeInfo{Name: "n1", Known: true, Deleting: true}, false},
		{"node tainted for deletion", model.NodeInfo{Name: "n1", Known: true, ToBeDeleted: true}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := &config.Options{Config: config.NewDefault()}
			o.Config.HealthzBindAddress = "127.0.0.1:0"
			o.Config.MetricsBindAddress = "127.0.0.1:0"
			node := model.NodeInfo{Name: "n1"}
			_, obs, err := defaultServers(ServerParams{Options: o, NodeName: "n1", Mode: ModeNFTables, Families: []model.Family{model.IPv4},
				Node: func() model.NodeInfo { return node }})
			if err != nil {
				t.Fatal(err)
			}
			so := obs[0].(*serverObserver)
			so.Started([]model.Family{model.IPv4})
			if !so.health.Healthy() {
				t.Error("not healthy right after the sync loop started")
			}
			if so.health.NodeEligible() {
				t.Error("eligible before the Node is known")
			}
			node = tc.node
			if got := so.health.NodeEligible(); got != tc.wantEligible {
				t.Errorf("NodeEligible = %v, want %v", got, tc.wantEligible)
			}
		})
	}
}

// TestHealthCheckListenEvent: a health-check node port that cannot be
// opened (here: taken on 127.0.0.1) is a FailedToStartServiceHealthcheck
// Warning on its Service, action Listen, with upstream's message.
func TestHealthCheckListenEvent(t *testing.T) {
	busy, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	port := uint16(busy.Addr().(*net.TCPAddr).Port)
	o := &config.Options{Config: config.NewDefault()}
	o.Config.HealthzBindAddress = "127.0.0.1:0"
	o.Config.MetricsBindAddress = "127.0.0.1:0"
	ev := &fakeEvents{}
	_, obs, err := defaultServers(ServerParams{Options: o, NodeName: "n1", Mode: ModeNFTables, Families: []model.Family{model.IPv4},
		NodePortAddresses: []string{"127.0.0.1/32"}, Node: func() model.NodeInfo { return model.NodeInfo{Name: "n1", Known: true} }, Events: ev})
	if err != nil {
		t.Fatal(err)
	}
	shs := obs[0].(*serverObserver).services[model.IPv4]
	t.Cleanup(shs.Close)
	key := objects.Key{Namespace: "ns", Name: "lb"}
	if err := shs.SyncServices(map[objects.Key]uint16{key: port}); err == nil {
		t.Fatal("SyncServices opened a port that is taken")
	}
	if len(ev.got) != 1 {
		t.Fatalf("events %+v, want one", ev.got)
	}
	got := ev.got[0]
	wantMsg := fmt.Sprintf(`node n1 failed to start healthcheck "ns/lb" on port %d: `, port)
	if got.key != "ns/lb" || got.reason != "FailedToStartServiceHealthcheck" || got.uid != "Listen" || !strings.HasPrefix(got.message, wantMsg) {
		t.Errorf("event %+v, want %s FailedToStartServiceHealthcheck/Listen %q…", got, key, wantMsg)
	}
}

// TestServiceChangesPerFamily: in dual-stack a Service event counts once
// per family (upstream hands it to both per-family proxiers), an
// EndpointSlice event once.
func TestServiceChangesPerFamily(t *testing.T) {
	for _, tc := range []struct {
		fams                   []model.Family
		wantSvc, wantEndpoints string
	}{
		{[]model.Family{model.IPv4}, "1", "1"},
		{[]model.Family{model.IPv4, model.IPv6}, "2", "1"},
	} {
		o := &config.Options{Config: config.NewDefault()}
		o.Config.HealthzBindAddress = "127.0.0.1:0"
		o.Config.MetricsBindAddress = "127.0.0.1:0"
		servers, obs, err := defaultServers(ServerParams{Options: o, NodeName: "n1", Mode: ModeNFTables, Families: tc.fams,
			Node: func() model.NodeInfo { return model.NodeInfo{Name: "n1", Known: true} }})
		if err != nil {
			t.Fatal(err)
		}
		so := obs[0].(*serverObserver)
		so.ServiceChanged(1)
		so.EndpointsChanged(1)
		rec := httptest.NewRecorder()
		servers[len(servers)-1].(*metrics.Server).Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		body := rec.Body.String()
		for name, want := range map[string]string{"kubeproxy_sync_proxy_rules_service_changes_total": tc.wantSvc, "kubeproxy_sync_proxy_rules_endpoint_changes_total": tc.wantEndpoints} {
			if !strings.Contains(body, "\n"+name+" "+want+"\n") {
				t.Errorf("%v: want %s %s in:\n%s", tc.fams, name, want, grepLines(body, name))
			}
		}
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// queueCounter is an Observer that counts Queued calls.
type queueCounter struct{ queued int }

func (*queueCounter) Started([]model.Family)  {}
func (c *queueCounter) Queued([]model.Family) { c.queued++ }
func (*queueCounter) Synced(SyncReport)       {}

// TestQueuedAfterInitialization: as upstream's proxiers, changes reach the
// observers (health's pending update) only once the inputs were synced
// before them: not during the initial lists, nor at their end.
func TestQueuedAfterInitialization(t *testing.T) {
	tr := newFakeTracker(&objects.Node{Name: "n1"})
	r, err := runner.New(runner.Config{MaxInterval: time.Hour}, func(context.Context, runner.Request) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	c := &queueCounter{}
	d := &daemon{inputs: Inputs{Tracker: tr}, runner: r, obs: observers{c}}
	fams := []model.Family{model.IPv4}
	d.queued.Store(&fams)
	d.notify() // a change during the initial lists
	tr.mu.Lock()
	tr.synced = true
	tr.mu.Unlock()
	d.notify() // the lists' end
	if c.queued != 0 {
		t.Errorf("%d updates queued before initialization, want none", c.queued)
	}
	d.notify() // a change after it
	if c.queued != 1 {
		t.Errorf("%d updates queued after initialization, want 1", c.queued)
	}
}
