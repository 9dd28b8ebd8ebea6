package daemon

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/klog/v2"
	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/objects"
)

// fakeTraffic records what the daemon hands the traffic tables.
type fakeTraffic struct {
	snaps   chan *model.Snapshot
	running atomic.Bool
}

func (f *fakeTraffic) Update(s *model.Snapshot) { f.snaps <- s }
func (f *fakeTraffic) Run(ctx context.Context) {
	f.running.Store(true)
	<-ctx.Done()
}

// TestServiceTrafficMetrics: with the flag the tables run and get each
// programmed snapshot, and the metrics get a reader; without it (and in
// ipvs mode) the tables an earlier run left are removed and no reader is
// handed; --cleanup removes them too.
func TestServiceTrafficMetrics(t *testing.T) {
	for _, tc := range []struct {
		name    string
		flag    bool
		mode    string
		running bool
	}{
		{"on", true, ModeNFTables, true},
		{"off", false, ModeNFTables, false},
		{"ipvs", true, ModeIPVS, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := newFakeTracker(&objects.Node{Name: "node-a", InternalIPs: []string{"198.18.1.1"}})
			inputs := func(_ *config.Options, _ string, notify func()) (Inputs, error) {
				tr.notify = notify
				return Inputs{Source: blockingSource{}, Tracker: tr, NodeExpected: true}, nil
			}
			dp := newFakeDataplane()
			e := testEnv(inputs, dp)
			e.dataplanes[ModeIPVS] = e.dataplanes[ModeNFTables]
			e.ipvsSupport = nil
			ft := &fakeTraffic{snaps: make(chan *model.Snapshot, 10)}
			e.trafficTables = func([]model.Family, klog.Logger) TrafficTables { return ft }
			var cleaned atomic.Int32
			e.trafficCleanup = func([]model.Family) error { cleaned.Add(1); return nil }
			gotReader := make(chan bool, 1)
			e.servers = func(p ServerParams) ([]Server, []Observer, error) {
				gotReader <- p.ServiceTraffic != nil
				return nil, nil, nil
			}
			o := testOptions()
			o.ServiceTrafficMetrics = tc.flag
			o.Config.Mode = kpv1alpha1.ProxyMode(tc.mode)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- run(ctx, o, e) }()
			defer func() { cancel(); <-done }()
			if got := <-gotReader; got != tc.running {
				t.Errorf("metrics reader handed: %v, want %v", got, tc.running)
			}
			tr.setSynced()
			nextSync(t, dp)
			if tc.running {
				select {
				case s := <-ft.snaps:
					if s == nil {
						t.Error("nil snapshot handed over")
					}
				case <-time.After(5 * time.Second):
					t.Fatal("no snapshot handed to the traffic tables")
				}
			}
			// Run starts on its own goroutine: give it the time to.
			for deadline := time.Now().Add(5 * time.Second); tc.running && !ft.running.Load() && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
			}
			if ft.running.Load() != tc.running || (cleaned.Load() == 1) == tc.running {
				t.Errorf("tables running %v, cleaned %d times", ft.running.Load(), cleaned.Load())
			}
		})
	}
	e := testEnv(nil, newFakeDataplane())
	var cleaned atomic.Int32
	e.trafficCleanup = func([]model.Family) error { cleaned.Add(1); return nil }
	o := testOptions()
	o.CleanupAndExit = true
	if err := run(context.Background(), o, e); err != nil || cleaned.Load() != 1 {
		t.Errorf("--cleanup: %v, traffic tables cleaned %d times", err, cleaned.Load())
	}
}
