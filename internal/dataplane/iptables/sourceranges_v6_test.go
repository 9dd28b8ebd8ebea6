package iptables

import (
	"net/netip"
	"slices"
	"testing"

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
	eps := []*model.Endpoint{ep("fd00:64::10", 8080, true), ep("fd00:65::10", 8080, false)}
	sp := svc("ns", "lbsrc", "fd00:ffff::10", 80, withNodePort(30010), withLB(lb),
		withSourceRanges("fd00:10::100/128"), withEPs(eps...))
	text := RestoreText(Render(p, snapshot(sp).Family(model.IPv6), testNode()))
	tr := newTracer(t, text, nodeIP6)
	accepted := traceResult{verdict: "accept", dnat: []string{"[fd00:64::10]:8080", "[fd00:65::10]:8080"}, masq: true}
	dropped := traceResult{verdict: "drop"}
	for _, tc := range []struct {
		name     string
		src, iif string
		fromHost bool
		want     traceResult
	}{
		{"in-range", "fd00:10::100", "eth0", false, accepted},
		{"out-of-range-neighbour", "fd00:10::101", "eth0", false, dropped},
		{"in-range-again", "fd00:10::100", "eth0", false, accepted},
		{"same-/64-outside-/128", "fd00:10::1:100", "eth0", false, dropped},
		{"ipv4-mapped-range-address", "::ffff:198.18.0.100", "eth0", false, dropped},
		{"local-pod-outside-ranges", "fd00:64::20", "veth1", false, dropped},
		{"node-outside-ranges", nodeIP6.String(), "", true, dropped},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pkt := tracePacket{src: netip.MustParseAddr(tc.src), dst: netip.MustParseAddr(lb), proto: "tcp",
				dport: 80, iif: tc.iif, fromHost: tc.fromHost}
			got := tr.trace(pkt)
			if got.verdict != tc.want.verdict || !slices.Equal(got.dnat, tc.want.dnat) || got.masq != tc.want.masq {
				t.Errorf("%s -> [%s]:80: got %s, want %s", tc.src, lb, got, tc.want)
			}
		})
	}
}
