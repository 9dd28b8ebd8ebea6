package daemon

import (
	"context"
	"net/netip"
	"testing"

	"github.com/kproxy/kproxy/internal/conntrack"
	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/objects"
	"github.com/kproxy/kproxy/internal/runner"
)

// commitProbe is a dataplane that, at its commit, counts the flows left in
// a conntrack table.
type commitProbe struct {
	*fakeDataplane
	table    *conntrack.FakeTable
	atCommit int
}

func (p *commitProbe) Sync(ctx context.Context, snap *model.Snapshot, req dataplane.SyncRequest) error {
	p.atCommit = len(p.table.Flows(model.IPv4))
	return p.fakeDataplane.Sync(ctx, snap, req)
}

// TestSYNsGoBeforeTheIPVSCommit: in IPVS mode the un-DNATed SYN to a
// Service that the sync makes reachable is gone before the commit (IPVS
// would forward its retransmit past the nat table); in the other modes
// the cleanup after the commit deletes it, and the sync pays one walk.
func TestSYNsGoBeforeTheIPVSCommit(t *testing.T) {
	for _, tc := range []struct {
		mode         string
		leftAtCommit int
	}{
		{ModeIPVS, 0},
		{ModeNFTables, 1},
		{ModeIPTables, 1},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			vip := netip.MustParseAddrPort("198.18.0.80:80")
			table := conntrack.NewFakeTable()
			table.Add(model.IPv4, conntrack.Flow{Protocol: model.TCP, OrigDst: vip, ReplySrc: vip, SynSent: true})
			tr := newFakeTracker(&objects.Node{Name: "node-a", InternalIPs: []string{"198.18.1.1"}})
			web := &objects.Service{Namespace: "default", Name: "web", Type: objects.ServiceTypeClusterIP,
				ClusterIPs: []string{vip.Addr().String()}, Ports: []objects.ServicePort{{Protocol: "TCP", Port: 80}}}
			tr.in.Slices[web.Key()] = []*objects.EndpointSlice{{
				Namespace: "default", Name: "web-1", ServiceName: "web", AddressType: objects.AddressTypeIPv4,
				Ports:     []objects.EndpointPort{{Protocol: "TCP", Port: 8080}},
				Endpoints: []objects.Endpoint{{Addr: netip.MustParseAddr("198.19.8.1"), HasAddress: true}},
			}}
			tr.notify = func() {}
			tr.putService(web)
			dp := &commitProbe{fakeDataplane: newFakeDataplane(), table: table}
			reports := &reportLog{}
			d := &daemon{o: testOptions(), env: testEnv(nil, dp.fakeDataplane), mode: tc.mode, inputs: Inputs{Tracker: tr},
				cleaner: conntrack.NewCleaner(table), dp: dp, fams: []model.Family{model.IPv4}, obs: observers{reports}}

			if err := d.sync(context.Background(), runner.Request{Full: true, Reason: runner.ReasonInitial}); err != nil {
				t.Fatalf("sync: %v", err)
			}
			if dp.atCommit != tc.leftAtCommit {
				t.Errorf("flows left at the commit = %d, want %d", dp.atCommit, tc.leftAtCommit)
			}
			if left := table.Flows(model.IPv4); len(left) != 0 {
				t.Errorf("flows left after the sync = %v, want none", left)
			}
			wantWalks := 1
			if tc.mode == ModeIPVS {
				wantWalks = 2
			}
			if table.Walks[model.IPv4] != wantWalks {
				t.Errorf("walks = %d, want %d", table.Walks[model.IPv4], wantWalks)
			}
			// The metrics hear of the SYN whichever walk deleted it.
			if ct := reports.last().Conntrack; len(ct) == 0 || ct[0].Family != model.IPv4 || ct[0].Deleted != 1 || ct[0].Skipped {
				t.Errorf("reported cleanup %+v, want IPv4 with 1 deleted", ct)
			}

			// A periodic full sync with nothing changed: the other modes
			// clean every frontend again; IPVS mode's, whole only to
			// repair the kernel, read no conntrack.
			walks := table.Walks[model.IPv4]
			if err := d.sync(context.Background(), runner.Request{Full: true, Reason: runner.ReasonPeriodic}); err != nil {
				t.Fatalf("periodic sync: %v", err)
			}
			if walked := table.Walks[model.IPv4] > walks; walked != (tc.mode != ModeIPVS) {
				t.Errorf("periodic full sync walked conntrack: %v, want %v", walked, tc.mode != ModeIPVS)
			}
		})
	}
}

// reportLog is an Observer that keeps the sync reports.
type reportLog struct{ reports []SyncReport }

func (r *reportLog) Started([]model.Family) {}
func (r *reportLog) Queued([]model.Family)  {}
func (r *reportLog) Synced(s SyncReport)    { r.reports = append(r.reports, s) }
func (r *reportLog) last() SyncReport       { return r.reports[len(r.reports)-1] }
