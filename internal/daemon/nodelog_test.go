package daemon

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/go-logr/logr/funcr"

	"github.com/kproxy/kproxy/internal/model"
)

func TestLogNodeChange(t *testing.T) {
	cidr := []netip.Prefix{netip.MustParsePrefix("198.18.64.0/24")}
	ip := []netip.Addr{netip.MustParseAddr("198.18.0.11")}
	node := model.NodeInfo{Name: "node1", Known: true, PodCIDRs: cidr, InternalIPs: ip}
	for _, tc := range []struct {
		name     string
		cur      model.NodeInfo
		nodeCIDR bool
		want     []string
	}{
		{"unknown", model.NodeInfo{Name: "node1"}, false, nil},
		{"podCIDRs lost, NodeCIDR", model.NodeInfo{Name: "node1", Known: true, InternalIPs: ip}, true, []string{"now counts no traffic as from local pods"}},
		{"podCIDRs lost", model.NodeInfo{Name: "node1", Known: true, InternalIPs: ip}, false, []string{"podCIDRs changed"}},
		{"addresses lost", model.NodeInfo{Name: "node1", Known: true, PodCIDRs: cidr}, false, []string{"addresses changed"}},
		{"unchanged", node, true, nil},
	} {
		var lines []string
		logger := funcr.New(func(_, args string) { lines = append(lines, args) }, funcr.Options{})
		logNodeChange(logger, node, tc.cur, tc.nodeCIDR)
		if len(lines) != len(tc.want) {
			t.Errorf("%s: logged %q, want %d lines", tc.name, lines, len(tc.want))
			continue
		}
		for i, w := range tc.want {
			if !strings.Contains(lines[i], w) {
				t.Errorf("%s: line %q lacks %q", tc.name, lines[i], w)
			}
		}
	}
}
