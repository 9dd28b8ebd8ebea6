package netbed

import (
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
)

func TestLayoutValidate(t *testing.T) {
	if err := DefaultLayout().Validate(); err != nil {
		t.Fatalf("default layout: %v", err)
	}
	for _, tc := range []struct {
		name   string
		mutate func(*Layout)
		want   string
	}{
		{"node net outside 198.18/15", func(l *Layout) { l.NodeNet4 = netip.MustParsePrefix("10.0.0.0/24") }, "NodeNet4"},
		{"v6 outside fd00::/8", func(l *Layout) { l.Supernet6 = netip.MustParsePrefix("2001:db8::/48") }, "Supernet6"},
		{"host off the node net", func(l *Layout) { l.Host4 = netip.MustParseAddr("198.18.9.1") }, "Host4"},
		{"duplicate names", func(l *Layout) { l.Clients[0].Name = l.Nodes[0].Name }, "duplicate"},
		{"pod CIDR outside supernet", func(l *Layout) { l.Nodes[1].PodCIDR6 = netip.MustParsePrefix("fd01::/64") }, "PodCIDR6"},
		{"no nodes", func(l *Layout) { l.Nodes = nil }, "at least one node"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := DefaultLayout()
			tc.mutate(&l)
			err := l.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate() = %v, want an error about %s", err, tc.want)
			}
		})
	}
}

func TestNew(t *testing.T) {
	b := New(Options{})
	if !strings.HasPrefix(b.Prefix(), "kpt") || len(b.Layout().Nodes) != 2 {
		t.Errorf("New(Options{}) = prefix %q, %d nodes", b.Prefix(), len(b.Layout().Nodes))
	}
	if got := nthAddr(netip.MustParsePrefix("fd00:0:0:101::/64"), 10); got != netip.MustParseAddr("fd00:0:0:101::a") {
		t.Errorf("nthAddr = %s", got)
	}
	if errs := DeleteNamespaces(""); len(errs) == 0 {
		t.Error("DeleteNamespaces(\"\") must refuse")
	}
}

func TestOwnerGone(t *testing.T) {
	self := strconv.Itoa(os.Getpid())
	for _, tc := range []struct {
		name string
		want bool
	}{
		{"kpt" + self + "-node1", false},
		{"kptd" + self + "-hub", false},
		{"kpt999999999-node1", true},
		{"kptd999999999-h", true},
		{"eth0", false},
		{"kptnode1", false},
		{"other999999999-x", false},
	} {
		if got := ownerGone(tc.name); got != tc.want {
			t.Errorf("ownerGone(%q) = %v, want %v", tc.name, got, tc.want)
		}
	}
}
