package changes

import (
	"slices"
	"testing"

	"github.com/kproxy/kproxy/internal/objects"
	"github.com/kproxy/kproxy/internal/source"
)

func cidr(name, rv string, cidrs ...string) *objects.ServiceCIDR {
	return &objects.ServiceCIDR{Name: name, ResourceVersion: rv, CIDRs: cidrs}
}

func putCIDR(c *objects.ServiceCIDR) func(*Tracker) { return func(t *Tracker) { t.OnServiceCIDR(c) } }
func delCIDR(name string) func(*Tracker)            { return func(t *Tracker) { t.OnServiceCIDRDeleted(name) } }

func cidrNames(list []*objects.ServiceCIDR) []string {
	var out []string
	for _, c := range list {
		out = append(out, c.Name+"="+c.ResourceVersion)
	}
	return out
}

func TestTrackerServiceCIDRs(t *testing.T) {
	tests := []struct {
		name           string
		before, events []func(*Tracker)
		wantChanged    bool
		transient      bool     // something was pending for a while: notified
		wantInput      []string // name=resourceVersion, sorted by name
	}{{
		name:        "added, sorted by name",
		events:      []func(*Tracker){putCIDR(cidr("z", "1", "198.18.200.0/24")), putCIDR(cidr("kubernetes", "1", "198.18.128.0/17"))},
		wantChanged: true,
		wantInput:   []string{"kubernetes=1", "z=1"},
	}, {
		name:      "same resource version is a no-op",
		before:    []func(*Tracker){putCIDR(cidr("kubernetes", "1", "198.18.128.0/17"))},
		events:    []func(*Tracker){putCIDR(cidr("kubernetes", "1", "198.18.0.0/16"))},
		wantInput: []string{"kubernetes=1"},
	}, {
		name:      "equal content is a no-op",
		before:    []func(*Tracker){putCIDR(cidr("kubernetes", "1", "198.18.128.0/17"))},
		events:    []func(*Tracker){putCIDR(cidr("kubernetes", "2", "198.18.128.0/17"))},
		wantInput: []string{"kubernetes=1"},
	}, {
		name:        "updated",
		before:      []func(*Tracker){putCIDR(cidr("kubernetes", "1", "198.18.128.0/17"))},
		events:      []func(*Tracker){putCIDR(cidr("kubernetes", "2", "198.18.128.0/17", "fd00:0:0:ffff::/112"))},
		wantChanged: true,
		wantInput:   []string{"kubernetes=2"},
	}, {
		name:        "deleted",
		before:      []func(*Tracker){putCIDR(cidr("a", "1", "198.18.200.0/24")), putCIDR(cidr("kubernetes", "1", "198.18.128.0/17"))},
		events:      []func(*Tracker){delCIDR("a"), delCIDR("unknown")},
		wantChanged: true,
		wantInput:   []string{"kubernetes=1"},
	}, {
		name:      "added and deleted before a sync is a no-op",
		events:    []func(*Tracker){putCIDR(cidr("a", "1", "198.18.200.0/24")), delCIDR("a")},
		transient: true,
		wantInput: nil,
	}, {
		name:      "deleting an unknown one is a no-op",
		events:    []func(*Tracker){delCIDR("a")},
		wantInput: nil,
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			notified := 0
			tr := NewTracker("node-a", func() { notified++ })
			run(tr, tc.before)
			syncOnce(tr, true)
			notified = 0
			run(tr, tc.events)
			b := tr.Take()
			tr.Done(b, true)
			if b.ServiceCIDRsChanged != tc.wantChanged || (notified > 0) != (tc.wantChanged || tc.transient) {
				t.Errorf("ServiceCIDRsChanged = %v, notified %d times; want %v", b.ServiceCIDRsChanged, notified, tc.wantChanged)
			}
			if got := cidrNames(b.Input.ServiceCIDRs); !slices.Equal(got, tc.wantInput) {
				t.Errorf("Input.ServiceCIDRs = %q, want %q", got, tc.wantInput)
			}
			if len(b.Changed) != 0 || b.NodeChanged {
				t.Errorf("a ServiceCIDR event changed Services or the Node: %v %v", b.Changed, b.NodeChanged)
			}
			if tr.Pending() != 0 {
				t.Errorf("still pending after a successful sync: %d", tr.Pending())
			}
		})
	}
}

func TestTrackerServiceCIDRsDone(t *testing.T) {
	tr := newTestTracker()
	old := cidr("kubernetes", "1", "198.18.128.0/17")
	tr.OnServiceCIDR(old)

	// A failed sync keeps the change pending.
	b := tr.Take()
	tr.Done(b, false)
	if tr.Pending() != 1 || !tr.Take().ServiceCIDRsChanged {
		t.Fatalf("failed sync: pending %d", tr.Pending())
	}

	// A change during a sync stays pending after it, against what it programmed.
	b = tr.Take()
	tr.OnServiceCIDR(cidr("kubernetes", "2", "198.18.128.0/17", "fd00:0:0:ffff::/112"))
	tr.Done(b, true)
	next := tr.Take()
	if !next.ServiceCIDRsChanged || cidrNames(next.Input.ServiceCIDRs)[0] != "kubernetes=2" {
		t.Fatalf("change during sync lost: %+v", next)
	}
	tr.Done(next, true)

	// Changed during a sync, then changed back to what was synced before:
	// the sync programmed the intermediate state, so it is pending again.
	tr.OnServiceCIDRDeleted("kubernetes")
	b = tr.Take()
	tr.OnServiceCIDR(next.Input.ServiceCIDRs[0])
	tr.Done(b, true)
	if again := tr.Take(); !again.ServiceCIDRsChanged || len(again.Input.ServiceCIDRs) != 1 {
		t.Fatalf("changed back during a sync: %+v", again)
	}
}

func TestTrackerServiceCIDRsDoNotGateSynced(t *testing.T) {
	tr := newTestTracker()
	tr.OnSynced(source.Services)
	tr.OnSynced(source.EndpointSlices)
	if !tr.Synced() {
		t.Errorf("Synced waits for ServiceCIDRs")
	}
}

func TestTrackerServiceCIDRsImmutable(t *testing.T) {
	tr := newTestTracker()
	tr.OnServiceCIDR(cidr("b", "1", "198.18.200.0/24"))
	b := tr.Take()
	held := slices.Clone(b.Input.ServiceCIDRs)
	tr.OnServiceCIDR(cidr("a", "1", "198.18.128.0/17"))
	tr.OnServiceCIDR(cidr("b", "2", "198.18.201.0/24"))
	if !slices.Equal(b.Input.ServiceCIDRs, held) {
		t.Errorf("a taken batch changed under its holder: %q", cidrNames(b.Input.ServiceCIDRs))
	}
	tr.Done(b, true)
}
