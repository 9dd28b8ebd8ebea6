package daemon

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
	"k8s.io/utils/clock"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/conntrack"
	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/objects"
)

const testTimeout = 10 * time.Second

// testOptions is a minimal nftables configuration with short periods.
func testOptions() *config.Options {
	return &config.Options{Config: &kpv1alpha1.KubeProxyConfiguration{
		Mode:             ModeNFTables,
		HostnameOverride: "node-a",
		DetectLocalMode:  "ClusterCIDR",
		ClusterCIDR:      "198.19.0.0/16",
		NFTables: kpv1alpha1.KubeProxyNFTablesConfiguration{
			SyncPeriod:    metav1.Duration{Duration: 50 * time.Millisecond},
			MinSyncPeriod: metav1.Duration{Duration: 5 * time.Millisecond},
		},
	}}
}

// runInBackground runs the daemon with testOptions and e until the test
// ends; the test then fails if run returned an error.
func runInBackground(t *testing.T, e env) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, testOptions(), e) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run() = %v", err)
		}
	})
}

// testEnv wires fakes into every outside dependency.
func testEnv(inputs InputsFunc, dp *fakeDataplane) env {
	e := defaultEnv()
	e.hostname = func() (string, error) { return "host", nil }
	e.inputs = inputs
	e.dataplanes = map[string]DataplaneFunc{ModeNFTables: func(dataplane.Config) (dataplane.Dataplane, error) { return dp, nil }}
	e.servers = func(ServerParams) ([]Server, []Observer, error) { return nil, nil, nil }
	e.conntrack = conntrack.NewFakeTable()
	e.sysctls = failingFiles{}
	e.numCPU = func() int { return 2 }
	e.ipv6 = func() bool { return false }
	e.clock = clock.RealClock{}
	e.pollInterval = 2 * time.Millisecond
	e.waitInterval = 2 * time.Millisecond
	e.ipvsCleanup = func(context.Context) error { return nil }
	e.firewallCleanup = func(context.Context) error { return nil }
	e.oomScoreAdj = func(int) error { return nil }
	e.trafficCleanup = func([]model.Family) error { return nil }
	e.trafficTables = nil
	return e
}

// failingFiles makes any sysctl write fail the test setup loudly.
type failingFiles struct{}

func (failingFiles) ReadInt(string) (int, error) { return 0, errNoDryRun }
func (failingFiles) WriteInt(path string, _ int) error {
	panic("unexpected sysctl write to " + path)
}

func nextSync(t *testing.T, dp *fakeDataplane) syncCall {
	t.Helper()
	select {
	case c := <-dp.calls:
		return c
	case <-time.After(testTimeout):
		t.Fatal("no Sync within the timeout")
		return syncCall{}
	}
}

func svcObj(name string) *objects.Service {
	return &objects.Service{Namespace: "default", Name: name, Type: objects.ServiceTypeClusterIP,
		ClusterIPs: []string{"198.18.0.10"}, Ports: []objects.ServicePort{{Protocol: "UDP", Port: 53}}}
}

// TestServeSyncLifecycle runs the daemon against a fake tracker and
// dataplane: nothing syncs before the inputs are synced, a change is synced
// with its key, and a failed sync keeps the change pending and is retried.
func TestServeSyncLifecycle(t *testing.T) {
	node := &objects.Node{Name: "node-a", InternalIPs: []string{"198.18.1.1"}}
	tr := newFakeTracker(node)
	dp := newFakeDataplane()
	built := make(chan struct{})
	inputs := func(_ *config.Options, name string, notify func()) (Inputs, error) {
		if name != "node-a" {
			t.Errorf("node name = %q, want the hostname override", name)
		}
		tr.notify = notify
		close(built)
		return Inputs{Source: blockingSource{}, Tracker: tr, NodeExpected: true}, nil
	}
	runInBackground(t, testEnv(inputs, dp))

	<-built
	// Not synced: the runner keeps polling Synced and never syncs.
	tr.putService(svcObj("early"))
	for tr.pollsOfSynced() < 5 {
		time.Sleep(time.Millisecond)
	}
	select {
	case c := <-dp.calls:
		t.Fatalf("Sync before the inputs were synced: %+v", c.req)
	default:
	}

	tr.setSynced()
	first := nextSync(t, dp)
	if !first.req.Full {
		t.Errorf("first sync not full: %+v", first.req)
	}
	if _, ok := first.req.Changed[svcObj("early").Key()]; !ok {
		t.Errorf("first sync lacks the early change: %v", first.req.Changed)
	}

	tr.putService(svcObj("web"))
	c := nextSync(t, dp)
	if _, ok := c.req.Changed[svcObj("web").Key()]; !ok || c.req.Full {
		t.Errorf("change sync = %+v, want partial with default/web", c.req)
	}

	dp.failNext(1)
	tr.putService(svcObj("dns"))
	failed := nextSync(t, dp)
	if failed.err == nil {
		t.Fatal("injected failure did not happen")
	}
	if _, ok := tr.pendingKeys()[svcObj("dns").Key()]; !ok {
		t.Error("failed sync dropped the pending change")
	}
	retry := nextSync(t, dp)
	if _, ok := retry.req.Changed[svcObj("dns").Key()]; !ok || !retry.req.Full {
		t.Errorf("retry = %+v, want a full sync still carrying default/dns", retry.req)
	}
	if retry.err != nil {
		t.Fatalf("retry failed: %v", retry.err)
	}
	waitFor(t, func() bool { return len(tr.pendingKeys()) == 0 }, "pending changes cleared after the retry")
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestCleanupAndInitOnly(t *testing.T) {
	dp := newFakeDataplane()
	noInputs := func(*config.Options, string, func()) (Inputs, error) {
		t.Error("--cleanup and --init-only must not build sources")
		return Inputs{}, nil
	}
	e := testEnv(noInputs, dp)
	o := testOptions()
	o.CleanupAndExit = true
	if err := run(context.Background(), o, e); err != nil {
		t.Fatalf("cleanup: %v", err)
	}
	if dp.cleanups != 1 {
		t.Errorf("cleanups = %d, want 1", dp.cleanups)
	}

	o = testOptions()
	o.InitOnly = true
	if err := run(context.Background(), o, e); err != nil {
		t.Fatalf("init-only with no conntrack settings: %v", err)
	}
	o.Config.Conntrack.UDPTimeout = metav1.Duration{Duration: time.Minute}
	e.sysctls = roFiles{}
	err := run(context.Background(), o, e)
	if err == nil || !strings.Contains(err.Error(), "conntrack") {
		t.Errorf("init-only with a read-only sysctl = %v, want a conntrack error", err)
	}
}

type roFiles struct{}

func (roFiles) ReadInt(string) (int, error) { return 0, errNoDryRun }
func (roFiles) WriteInt(string, int) error  { return errNoDryRun }

func TestUnknownMode(t *testing.T) {
	o := testOptions()
	o.Config.Mode = "kernelspace"
	err := run(context.Background(), o, testEnv(nil, newFakeDataplane()))
	if err == nil || !strings.Contains(err.Error(), "kernelspace") {
		t.Errorf("run(kernelspace) = %v, want an unavailable-mode error", err)
	}
}

func TestDryRun(t *testing.T) {
	tr := newFakeTracker(nil)
	dp := newFakeDataplane()
	inputs := func(_ *config.Options, _ string, notify func()) (Inputs, error) {
		tr.notify = notify
		return Inputs{Source: syncingSource{tr}, Tracker: tr}, nil
	}
	e := testEnv(inputs, dp)
	var out strings.Builder
	e.stdout = &out
	e.dataplanes[ModeNFTables] = func(dataplane.Config) (dataplane.Dataplane, error) { return fakeDryRunner{dp}, nil }
	e.sysctls = roFiles{} // a dry run never writes sysctls
	o := testOptions()
	o.DryRun = true
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if err := run(ctx, o, e); err != nil {
		t.Fatalf("dry run: %v", err)
	}
	if !strings.HasPrefix(out.String(), "rendered ") {
		t.Errorf("dry run printed %q", out.String())
	}
	if len(dp.calls) != 0 || dp.cleanups != 0 {
		t.Errorf("dry run touched the dataplane: %d syncs, %d cleanups", len(dp.calls), dp.cleanups)
	}

	e.dataplanes[ModeNFTables] = func(dataplane.Config) (dataplane.Dataplane, error) { return dp, nil }
	if err := run(ctx, o, e); err == nil || !strings.Contains(err.Error(), "dry-run") {
		t.Errorf("dry run on a backend without Render = %v", err)
	}
}

// syncingSource marks its tracker synced when it starts, like the file
// source after its first read.
type syncingSource struct{ tr *fakeTracker }

func (s syncingSource) Run(ctx context.Context) error {
	s.tr.setSynced()
	<-ctx.Done()
	return nil
}

// recordingFiles records sysctl writes.
type recordingFiles struct{ writes map[string]int }

func (recordingFiles) ReadInt(string) (int, error) { return 0, errNoDryRun }
func (r recordingFiles) WriteInt(path string, v int) error {
	r.writes[path] = v
	return nil
}

func TestInitOnlyIPTablesRouteLocalnet(t *testing.T) {
	e := testEnv(nil, newFakeDataplane())
	files := recordingFiles{writes: map[string]int{}}
	e.sysctls = files
	o := testOptions()
	o.Config.Mode = ModeIPTables
	o.InitOnly = true
	if err := run(context.Background(), o, e); err != nil {
		t.Fatalf("init-only: %v", err)
	}
	if files.writes[sysctlRouteLocalnet] != 1 {
		t.Errorf("init-only in iptables mode wrote %v, want route_localnet=1", files.writes)
	}
}

// initRecorder is an IPVS dataplane that records InitNode.
type initRecorder struct {
	*fakeDataplane
	inits int
}

func (r *initRecorder) InitNode(context.Context) error { r.inits++; return nil }

// TestInitOnlyIPVS: --init-only in ipvs mode makes the IPVS dataplane's
// node settings, as upstream's proxier does before its init-only return;
// on a node that cannot run ipvs it sets up the iptables mode kproxy falls
// back to instead.
func TestInitOnlyIPVS(t *testing.T) {
	for _, tc := range []struct {
		name      string
		missing   []string
		wantInits int
	}{
		{"ipvs runs", nil, 1},
		{"falls back to iptables", []string{"kernel module ip_vs"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &initRecorder{fakeDataplane: newFakeDataplane()}
			e := testEnv(nil, newFakeDataplane())
			e.dataplanes[ModeIPVS] = func(dataplane.Config) (dataplane.Dataplane, error) { return rec, nil }
			e.ipvsSupport = func(string) []string { return tc.missing }
			files := recordingFiles{writes: map[string]int{}}
			e.sysctls = files
			o := testOptions()
			o.Config.Mode = ModeIPVS
			o.InitOnly = true
			if err := run(context.Background(), o, e); err != nil {
				t.Fatalf("init-only: %v", err)
			}
			if rec.inits != tc.wantInits {
				t.Errorf("InitNode calls = %d, want %d", rec.inits, tc.wantInits)
			}
			if fellBack := files.writes[sysctlRouteLocalnet] == 1; fellBack != (tc.missing != nil) {
				t.Errorf("route_localnet written: %v, want %v (iptables mode's)", fellBack, tc.missing != nil)
			}
		})
	}
}

// TestNodeWaitStartsAfterTheList: the bounded wait for the Node's
// addresses starts once the Node was listed, as upstream's node manager
// waits for its informer first: an API server that answers late (a
// control-plane node booting) does not leave kproxy with no node IPs.
func TestNodeWaitStartsAfterTheList(t *testing.T) {
	tr := newFakeTracker(nil)
	tr.nodeUnlisted = true
	dp := newFakeDataplane()
	built := make(chan struct{})
	inputs := func(_ *config.Options, _ string, notify func()) (Inputs, error) {
		tr.notify = notify
		close(built)
		return Inputs{Source: blockingSource{}, Tracker: tr, NodeExpected: true}, nil
	}
	e := testEnv(inputs, dp)
	e.nodeIPsWait = 10 * time.Millisecond
	var nodeIPs []netip.Addr
	e.dataplanes = map[string]DataplaneFunc{ModeNFTables: func(cfg dataplane.Config) (dataplane.Dataplane, error) {
		nodeIPs = cfg.NodeIPs
		return dp, nil
	}}
	runInBackground(t, e)
	<-built
	tr.setSynced()
	time.Sleep(20 * e.nodeIPsWait)
	select {
	case c := <-dp.calls:
		t.Fatalf("synced before the Node was listed: %+v", c.req)
	default:
	}
	tr.listNode(&objects.Node{Name: "node-a", InternalIPs: []string{"198.18.1.1"}})
	nextSync(t, dp)
	if want := []netip.Addr{netip.MustParseAddr("198.18.1.1")}; !slices.Equal(nodeIPs, want) {
		t.Errorf("node IPs %v, want the Node's %v", nodeIPs, want)
	}
}
