package model

import (
	"strings"
	"testing"

	"github.com/kproxy/kproxy/internal/objects"
)

func TestParseBalancing(t *testing.T) {
	nft := BalancingOptions{Default: BalanceRoundRobin, Supported: []Balancing{BalanceRandom, BalanceRoundRobin, BalanceSourceHash}, Mode: "nftables"}
	for _, tc := range []struct {
		annotation string
		opts       BalancingOptions
		want       Balancing
		event      string
	}{
		{"", BalancingOptions{}, BalanceRandom, ""},
		{"", nft, BalanceRoundRobin, ""},
		{"source-hash", nft, BalanceSourceHash, ""},
		{" random ", nft, BalanceRandom, ""},
		{"least-connections", nft, BalanceRoundRobin, ReasonUnsupportedBalancing},
		{"least-connections", BalancingOptions{}, BalanceLeastConnections, ""},
		{"Round-Robin", nft, BalanceRoundRobin, ReasonUnknownBalancing},
		{"wrr", BalancingOptions{}, BalanceRandom, ReasonUnknownBalancing},
	} {
		svc := &objects.Service{Namespace: "ns", Name: "web", Type: "ClusterIP", ClusterIPs: []string{"198.19.0.10"},
			Ports: []objects.ServicePort{{Protocol: "TCP", Port: 80}}, LoadBalancing: tc.annotation}
		snap, probs := Build(Input{Services: map[objects.Key]*objects.Service{svc.Key(): svc}, Balancing: tc.opts})
		if got := snap.V4.Ports[0].Balancing; got != tc.want {
			t.Errorf("%q: %v, want %v", tc.annotation, got, tc.want)
		}
		switch {
		case tc.event == "" && len(probs) != 0:
			t.Errorf("%q: problems %v", tc.annotation, probs)
		case tc.event != "" && (len(probs) != 1 || probs[0].Event != tc.event || !strings.Contains(probs[0].Field, objects.AnnotationLoadBalancing)):
			t.Errorf("%q: problems %v, want one %s", tc.annotation, probs, tc.event)
		}
	}
	for _, name := range BalancingNames() {
		if b, ok := ParseBalancing(name); !ok || b.String() != name {
			t.Errorf("ParseBalancing(%q) = %v, %v", name, b, ok)
		}
	}
}
