package iptables

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/kproxy/kproxy/internal/dataplane/dptest"
	"github.com/kproxy/kproxy/internal/model"
)

// TestTraceSourceRangesIPv6 is the e2e LoadBalancerSourceRanges case over
// IPv6 (the model hands the IPv6 port only the /128 of the spec's ranges):
// an in-range client, an out-of-range neighbour of it, and the in-range
// client again. The ip6tables rules DNAT exactly the /128 and drop the
// rest, and carry no state between packets: a failure of the in-range
// client after an out-of-range one (the e2e "no route to host") cannot
// come from these rules. It came from the ICMPv6 redirect that the node's
// forwarding path sends before filter FORWARD drops the out-of-range
// packet, as it does with upstream's identical rules (see
// test/e2e/redirects_test.go).
func TestTraceSourceRangesIPv6(t *testing.T) {
	const lb = "fd00:40::1"
	p := testParams()
	p.Config.Families = []model.Family{model.IPv4, model.IPv6}
	eps := []*model.Endpoint{dptest.EP("fd00:64::10", 8080, true), dptest.EP("fd00:65::10", 8080, false)}
	sp := dptest.Svc("ns", "lbsrc", "fd00:ffff::10", 80, dptest.WithNodePort(30010), dptest.WithLB(lb),
		dptest.WithSourceRanges("fd00:10::100/128"), dptest.WithEPs(eps...))
	text := RestoreText(Render(p, dptest.Snapshot(sp).Family(model.IPv6), dptest.Node()))
	tr := newTracer(t, text, dptest.NodeIP6)
	accepted := dptest.Result{Verdict: "accept", DNAT: []string{"[fd00:64::10]:8080", "[fd00:65::10]:8080"}, Masq: true}
	dropped := dptest.Result{Verdict: "drop"}
	for _, tc := range []struct {
		name     string
		src, iif string
		fromHost bool
		want     dptest.Result
	}{
		{"in-range", "fd00:10::100", "eth0", false, accepted},
		{"out-of-range-neighbour", "fd00:10::101", "eth0", false, dropped},
		{"in-range-again", "fd00:10::100", "eth0", false, accepted},
		{"same-/64-outside-/128", "fd00:10::1:100", "eth0", false, dropped},
		{"ipv4-mapped-range-address", "::ffff:198.18.0.100", "eth0", false, dropped},
		{"local-pod-outside-ranges", "fd00:64::20", "veth1", false, dropped},
		{"node-outside-ranges", dptest.NodeIP6.String(), "", true, dropped},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pkt := dptest.Packet{Src: netip.MustParseAddr(tc.src), Dst: netip.MustParseAddr(lb), Proto: "tcp",
				DPort: 80, Iif: tc.iif, FromHost: tc.fromHost}
			got := tr.trace(pkt)
			if got.Verdict != tc.want.Verdict || !slices.Equal(got.DNAT, tc.want.DNAT) || got.Masq != tc.want.Masq {
				t.Errorf("%s -> [%s]:80: got %s, want %s", tc.src, lb, got, tc.want)
			}
		})
	}
}
