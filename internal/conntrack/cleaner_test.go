package conntrack

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/objects"
)

func snapshot(v4 ...*model.ServicePort) *model.Snapshot {
	return &model.Snapshot{V4: fam(v4...), V6: &model.FamilySnapshot{Family: model.IPv6}}
}

func TestCleanerClean(t *testing.T) {
	ctx := context.Background()
	old := svc("dns", model.UDP, "198.18.0.10", 53, 0, ep("198.19.1.1:53", true))
	moved := svc("dns", model.UDP, "198.18.0.10", 53, 0, ep("198.19.1.2:53", true))
	table := NewFakeTable()
	keep := flow(model.UDP, "198.18.0.10:53", "198.19.1.2:53")
	gone := flow(model.UDP, "198.18.0.10:53", "198.19.1.1:53")
	other := flow(model.UDP, "198.18.0.99:53", "198.19.1.1:53")
	table.Add(model.IPv4, keep, gone, other)
	c := NewCleaner(table)

	res := c.Clean(ctx, snapshot(old), snapshot(moved), false)
	if len(res) != 2 || res[0].Family != model.IPv4 || res[0].Deleted != 1 || res[0].Err != nil {
		t.Fatalf("Clean results = %+v, want IPv4 with 1 deleted", res)
	}
	if !res[1].Skipped || table.Walks[model.IPv6] != 0 {
		t.Errorf("IPv6 has nothing to clean but was walked: %+v", res[1])
	}
	if got := table.Flows(model.IPv4); len(got) != 2 || got[0] != keep || got[1] != other {
		t.Errorf("flows left = %v, want [%v %v]", got, keep, other)
	}

	// Nothing changed: the table is not read at all.
	walks := table.Walks[model.IPv4]
	next := snapshot(moved)
	res = c.Clean(ctx, next, next, false)
	if !res[0].Skipped || table.Walks[model.IPv4] != walks {
		t.Errorf("unchanged snapshot walked the table: %+v", res)
	}

	table.Err = errors.New("netlink says no")
	res = c.Clean(ctx, snapshot(old), snapshot(moved), false)
	if res[0].Err == nil {
		t.Errorf("table error not reported: %+v", res)
	}
}

// TestCleanerCleanSYNs: the walk before a commit deletes the un-DNATed
// SYNs to the frontends that become reachable and leaves every other flow,
// stale UDP ones included, to Clean after the commit.
func TestCleanerCleanSYNs(t *testing.T) {
	ctx := context.Background()
	dnsOld, dnsNew, web, staleUDP, syn := synCase()
	otherSYN := synFlow("198.18.0.81:80", "198.18.0.81:80")
	table := NewFakeTable()
	table.Add(model.IPv4, staleUDP, syn, otherSYN)
	c := NewCleaner(table)

	res := c.CleanSYNs(ctx, snapshot(dnsOld), snapshot(dnsNew, web), false)
	if len(res) != 2 || res[0].Deleted != 1 || res[0].Err != nil || !res[1].Skipped {
		t.Fatalf("CleanSYNs results = %+v, want 1 deleted in IPv4, IPv6 skipped", res)
	}
	if got, want := table.Scopes, []Scope{{Protocol: model.TCP, Unreplied: true}}; !slices.Equal(got, want) {
		t.Errorf("walks = %v, want one of unanswered TCP", got)
	}
	if got := table.Flows(model.IPv4); !slices.Equal(got, []Flow{staleUDP, otherSYN}) {
		t.Errorf("flows left = %v, want [%v %v]", got, staleUDP, otherSYN)
	}

	// After the commit, Clean takes the UDP flow.
	if res := c.Clean(ctx, snapshot(dnsOld), snapshot(dnsNew, web), false); res[0].Deleted != 1 {
		t.Errorf("Clean after CleanSYNs deleted %d, want the stale UDP flow", res[0].Deleted)
	}

	// A change that makes no TCP frontend reachable reads nothing.
	walks := table.Walks[model.IPv4]
	if res := c.CleanSYNs(ctx, snapshot(dnsOld, web), snapshot(dnsNew, web), false); !res[0].Skipped || table.Walks[model.IPv4] != walks {
		t.Errorf("CleanSYNs of a UDP-only change walked the table: %+v", res)
	}
}

// TestCleanerPartial: between snapshots the model derived one from the
// other, Clean compares the changed Service's ports only, and cleans the
// same flows as a comparison of every port would.
func TestCleanerPartial(t *testing.T) {
	ctx := context.Background()
	in := model.Input{NodeName: "node1", Services: map[objects.Key]*objects.Service{}, Slices: map[objects.Key][]*objects.EndpointSlice{}}
	const n = 100
	for i := range n {
		name := fmt.Sprintf("svc-%03d", i)
		s := &objects.Service{Namespace: "ns", Name: name, Type: objects.ServiceTypeClusterIP,
			ClusterIPs: []string{fmt.Sprintf("198.18.0.%d", i+1)},
			Ports:      []objects.ServicePort{{Name: "dns", Protocol: "UDP", Port: 53}}}
		in.Services[s.Key()] = s
		in.Slices[s.Key()] = []*objects.EndpointSlice{udpSlice(name, fmt.Sprintf("198.19.0.%d", i+1))}
	}
	prev, _ := model.Build(in)
	key := objects.Key{Namespace: "ns", Name: "svc-042"}
	next := in
	next.Slices = maps.Clone(in.Slices)
	next.Slices[key] = []*objects.EndpointSlice{udpSlice(key.Name, "198.19.1.43")}
	snap, _ := model.Update(prev, next, map[objects.Key]struct{}{key: {}})

	gone := flow(model.UDP, "198.18.0.43:53", "198.19.0.43:53")
	kept := flow(model.UDP, "198.18.0.43:53", "198.19.1.43:53")
	other := flow(model.UDP, "198.18.0.44:53", "198.19.9.9:53") // stale, but its Service did not change
	for _, full := range []bool{false, true} {
		table := NewFakeTable()
		table.Add(model.IPv4, gone, kept, other)
		c := NewCleaner(table)
		c.Clean(ctx, prev, snap, full)
		want := []Flow{kept, other}
		if full {
			want = []Flow{kept}
		}
		if got := table.Flows(model.IPv4); !slices.Equal(got, want) {
			t.Errorf("full=%v: flows left %v, want %v", full, got, want)
		}
		if !full && c.compared != 1 {
			t.Errorf("a one-Service change compared %d ports, want 1", c.compared)
		}
		if full && c.compared != n {
			t.Errorf("a full clean compared %d ports, want %d", c.compared, n)
		}
	}
}

func udpSlice(svc, addr string) *objects.EndpointSlice {
	return &objects.EndpointSlice{Namespace: "ns", Name: svc + "-1", ServiceName: svc, AddressType: "IPv4",
		Ports:     []objects.EndpointPort{{Name: "dns", Protocol: "UDP", Port: 53}},
		Endpoints: []objects.Endpoint{{Addr: netip.MustParseAddr(addr), HasAddress: true, Node: objects.OnNode("other")}}}
}

// TestCleanerNodePortSYNsToTheNodeOnly: when a TCP NodePort becomes
// reachable, unanswered SYNs with its number are cleaned only when they
// went to the node's own addresses (or loopback); one the node forwarded
// to another host's port of the same number is left alone. A table that
// cannot tell its addresses cleans them all.
func TestCleanerNodePortSYNsToTheNodeOnly(t *testing.T) {
	ctx := context.Background()
	none := svc("web", model.TCP, "198.18.0.10", 80, 30080)
	reachable := svc("web", model.TCP, "198.18.0.10", 80, 30080, ep("198.19.1.1:8080", true))
	syn := func(dst string) Flow {
		a := netip.MustParseAddrPort(dst)
		return Flow{Protocol: model.TCP, OrigDst: a, ReplySrc: a, SynSent: true}
	}
	toNode, toLoopback, toRemote := syn("198.18.0.2:30080"), syn("127.0.0.1:30080"), syn("198.18.99.7:30080")
	for _, tc := range []struct {
		name  string
		local []netip.Addr
		left  []Flow
	}{
		{"addresses known", []netip.Addr{netip.MustParseAddr("198.18.0.2")}, []Flow{toRemote}},
		{"addresses unknown", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			table := NewFakeTable()
			table.LocalAddrs = tc.local
			table.Add(model.IPv4, toNode, toLoopback, toRemote)
			NewCleaner(table).Clean(ctx, snapshot(none), snapshot(reachable), false)
			if got := table.Flows(model.IPv4); !slices.Equal(got, tc.left) {
				t.Errorf("flows left = %v, want %v", got, tc.left)
			}
		})
	}
}

// TestMerge: the walks before and after a commit are one cleanup per
// family.
func TestMerge(t *testing.T) {
	before := []Result{{Family: model.IPv4, Deleted: 2, Duration: time.Millisecond}, {Family: model.IPv6, Skipped: true}}
	after := []Result{{Family: model.IPv4, Deleted: 1, Duration: 2 * time.Millisecond}, {Family: model.IPv6, Skipped: true}}
	got := Merge(before, after)
	want := []Result{{Family: model.IPv4, Deleted: 3, Duration: 3 * time.Millisecond}, {Family: model.IPv6, Skipped: true}}
	if !slices.Equal(got, want) {
		t.Errorf("Merge = %+v, want %+v", got, want)
	}
	if got := Merge(nil, after); !slices.Equal(got, after) {
		t.Errorf("Merge(nil, after) = %+v", got)
	}
	onlyV6 := Merge([]Result{{Family: model.IPv6, Deleted: 1}}, []Result{{Family: model.IPv6, Skipped: true}})
	if len(onlyV6) != 1 || onlyV6[0].Skipped || onlyV6[0].Deleted != 1 {
		t.Errorf("a family walked only before the commit: %+v", onlyV6)
	}
	failed := Merge([]Result{{Family: model.IPv4, Err: errors.New("no")}}, []Result{{Family: model.IPv4}})
	if failed[0].Err == nil {
		t.Errorf("the walk before the commit failed, the merge has no error")
	}
}
