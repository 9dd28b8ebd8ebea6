//go:build e2e

package e2e

import (
	"context"
	"net/netip"
	"strings"

	"github.com/kproxy/kproxy/test/testbed/netbed"
)

// The client namespace shares the node network segment with the nodes and
// reaches Service addresses through static routes via a node, while every
// node routes the whole testbed supernet on-link on that segment. A packet
// a node forwards without DNAT (an out-of-range source of
// loadBalancerSourceRanges, dropped later in filter FORWARD) leaves by the
// interface it came in on, so the node's IPv6 forwarding path sends the
// client an ICMPv6 redirect ("<LB IP> is on-link") before netfilter's
// FORWARD hook drops the packet. The client's kernel applies it to the
// socket's route and caches "<LB IP> dev eth0" for every source address:
// the next in-range connect does neighbour discovery for the LB IP, which
// nobody answers, and fails with "no route to host". Upstream kube-proxy's
// rules drop at the same place and fail the same way; nftables mode drops
// at prerouting, before the routing decision, so no redirect is sent. An
// IPv4 redirect is sent too but discarded by the client, since its new
// gateway is not on the client's subnet. A real external client sits behind
// a router that ignores redirects, so netbed makes every client namespace
// ignore them (clientSysctls); redirectState shows the routing state when
// the case fails anyway.

// redirectState describes, for failure messages, how the client ns routes
// src -> dst (a route cached from a redirect shows as "dst dev eth0"), its
// neighbour entry for dst, its ICMPv6 redirect counter, and the conntrack
// entries node holds for dst.
func redirectState(client *netbed.Netns, node *netbed.Node, src, dst netip.Addr) string {
	ctx := context.Background()
	fam := "-4"
	if dst.Is6() {
		fam = "-6"
	}
	var b strings.Builder
	out := func(label string, s string, err error) {
		b.WriteString(label + ": " + strings.TrimSpace(s))
		if err != nil {
			b.WriteString(" (" + err.Error() + ")")
		}
		b.WriteString("\n")
	}
	s, err := client.IP(ctx, fam, "route", "get", dst.String(), "from", src.String())
	out("client route get", s, err)
	s, err = client.IP(ctx, fam, "route", "show", "cache")
	out("client route cache", s, err)
	s, err = client.IP(ctx, fam, "neigh", "show", dst.String())
	out("client neigh", s, err)
	if s, err := client.Run(ctx, "nstat", "-asz", "Icmp6InRedirects", "IcmpInRedirects"); err == nil {
		out("client nstat", strings.Join(strings.Fields(strings.TrimPrefix(s, "#kernel")), " "), nil)
	}
	s, err = node.Run(ctx, "conntrack", "-L", "-f", map[string]string{"-4": "ipv4", "-6": "ipv6"}[fam], "-d", dst.String())
	out(node.Spec.Name+" conntrack -d "+dst.String(), s, err)
	return b.String()
}
