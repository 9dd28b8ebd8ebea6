package daemon

import (
	"context"
	"net/netip"
	"slices"
	"sync"
	"testing"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/objects"
)

// cidrDataplane is a fakeDataplane that takes Service ranges and records,
// for each Sync, the ranges it had then.
type cidrDataplane struct {
	*fakeDataplane
	mu     sync.Mutex
	sets   int
	cidrs  []netip.Prefix
	atSync [][]netip.Prefix
	setsAt []int
}

func (c *cidrDataplane) SetServiceCIDRs(cidrs []netip.Prefix) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sets++
	c.cidrs = slices.Clone(cidrs)
}

func (c *cidrDataplane) Sync(ctx context.Context, snap *model.Snapshot, req dataplane.SyncRequest) error {
	c.mu.Lock()
	c.atSync = append(c.atSync, slices.Clone(c.cidrs))
	c.setsAt = append(c.setsAt, c.sets)
	c.mu.Unlock()
	return c.fakeDataplane.Sync(ctx, snap, req)
}

func (c *cidrDataplane) state() ([][]netip.Prefix, []int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.atSync), slices.Clone(c.setsAt)
}

func (t *fakeTracker) setServiceCIDRs(list ...*objects.ServiceCIDR) {
	t.mu.Lock()
	t.in.ServiceCIDRs = list
	t.mu.Unlock()
	t.notify()
}

// TestServeServiceCIDRs: the dataplane gets the Service ranges before the
// Sync that programs them, and again only when they change.
func TestServeServiceCIDRs(t *testing.T) {
	node := &objects.Node{Name: "node-a", InternalIPs: []string{"198.18.1.1"}}
	tr := newFakeTracker(node)
	tr.in.ServiceCIDRs = []*objects.ServiceCIDR{{Name: "kubernetes", CIDRs: []string{"198.18.128.0/17", "fd00:0:0:ffff::/112"}}}
	dp := &cidrDataplane{fakeDataplane: newFakeDataplane()}
	inputs := func(_ *config.Options, _ string, notify func()) (Inputs, error) {
		tr.notify = notify
		return Inputs{Source: syncingSource{tr}, Tracker: tr, NodeExpected: true}, nil
	}
	e := testEnv(inputs, dp.fakeDataplane)
	e.dataplanes[ModeNFTables] = func(dataplane.Config) (dataplane.Dataplane, error) { return dp, nil }
	runInBackground(t, e)

	nextSync(t, dp.fakeDataplane)
	tr.putService(svcObj("web")) // ranges unchanged: not handed again
	nextSync(t, dp.fakeDataplane)
	tr.setServiceCIDRs(&objects.ServiceCIDR{Name: "kubernetes", CIDRs: []string{"198.18.128.0/17"}})
	nextSync(t, dp.fakeDataplane)
	tr.setServiceCIDRs()
	nextSync(t, dp.fakeDataplane)

	atSync, setsAt := dp.state()
	want := [][]netip.Prefix{
		{netip.MustParsePrefix("198.18.128.0/17"), netip.MustParsePrefix("fd00:0:0:ffff::/112")},
		{netip.MustParsePrefix("198.18.128.0/17"), netip.MustParsePrefix("fd00:0:0:ffff::/112")},
		{netip.MustParsePrefix("198.18.128.0/17")},
		nil,
	}
	if !slices.EqualFunc(atSync, want, slices.Equal) {
		t.Errorf("ranges at each Sync = %v, want %v", atSync, want)
	}
	if !slices.Equal(setsAt, []int{1, 1, 2, 3}) {
		t.Errorf("SetServiceCIDRs calls before each Sync = %v, want [1 1 2 3]", setsAt)
	}
}

// A dataplane without the rule (iptables) is simply not told.
func TestHandServiceCIDRsWithoutSetter(t *testing.T) {
	d := &daemon{dp: newFakeDataplane()}
	snap := &model.Snapshot{ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("198.18.128.0/17")}}
	d.handServiceCIDRs(context.Background(), snap)
	if !slices.Equal(d.cidrs, snap.ServiceCIDRs) {
		t.Errorf("cidrs = %v", d.cidrs)
	}
}
