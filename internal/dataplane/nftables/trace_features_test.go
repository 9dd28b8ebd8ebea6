package nftables

import (
	"net/netip"
	"testing"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/dataplane/dptest"
	"github.com/kproxy/kproxy/internal/model"
)

func pkt(src, dst string, proto string, dport uint16, iif string) dptest.Packet {
	return dptest.Packet{Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr(dst), Proto: proto, DPort: dport, Iif: iif}
}

func fromHost(p dptest.Packet) dptest.Packet { p.FromHost = true; return p }

// TestTraceFeatures covers the features outside the policy matrix.
func TestTraceFeatures(t *testing.T) {
	masqAll := dptest.Config()
	masqAll.MasqueradeAll = true
	nodeCIDR := dptest.Config()
	nodeCIDR.LocalMode = dataplane.LocalNodeCIDR
	bridge := dptest.Config()
	bridge.LocalMode, bridge.BridgeInterface = dataplane.LocalBridgeInterface, "cbr0"
	prefix := dptest.Config()
	prefix.LocalMode, prefix.InterfacePrefix = dataplane.LocalInterfacePrefix, "veth"
	noLocal := dptest.Config()
	noLocal.LocalMode = dataplane.LocalNone
	npPrimary := dptest.Config()
	npPrimary.NodePortAddresses = []string{"primary"}
	npOther := dptest.Config()
	npOther.NodePortAddresses = []string{"198.18.1.0/24"}
	dual := dptest.Config()
	dual.Families = []model.Family{model.IPv4, model.IPv6}
	cidrs := dual
	cidrs.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("198.19.0.0/24"), netip.MustParsePrefix("fd00:19::/112")}

	feats := featureSnapshot()
	one := dptest.Snapshot(dptest.Svc("ns", "one", "198.19.0.30", 80, dptest.WithNodePort(30030), dptest.WithEPs(dptest.EP("198.18.65.10", 8080, false))))
	local := dptest.Snapshot(dptest.Svc("ns", "one", "198.19.0.30", 80, dptest.WithNodePort(30030), dptest.WithEPs(dptest.EP("198.18.64.10", 8080, true))))
	lbNode := dptest.Snapshot(dptest.Svc("ns", "lb", "198.19.0.31", 80, dptest.WithLB("198.19.100.31"), dptest.WithSourceRanges("198.18.0.0/24"), dptest.WithEPs(dptest.EP("198.18.65.10", 8080, false))))

	cases := []struct {
		name string
		cfg  dataplane.Config
		snap *model.Snapshot
		fam  model.Family
		p    dptest.Packet
		want string
	}{
		{"udp", dptest.Config(), feats, 4, pkt("198.18.64.50", "198.19.0.11", "udp", 53, "veth1"), "accept dnat=[198.18.65.12:5353] masq=false"},
		{"sctp", dptest.Config(), feats, 4, pkt("198.18.64.50", "198.19.0.12", "sctp", 9000, "veth1"), "accept dnat=[198.18.65.13:9000] masq=false"},
		{"wrong protocol rejected", dptest.Config(), feats, 4, pkt("198.18.64.50", "198.19.0.11", "tcp", 53, "veth1"), "reject dnat=[] masq=false"},
		{"unknown port rejected", dptest.Config(), feats, 4, pkt("198.18.64.50", "198.19.0.10", "tcp", 81, "veth1"), "reject dnat=[] masq=false"},
		{"unknown port rejected from node", dptest.Config(), feats, 4, fromHost(pkt("198.18.0.2", "198.19.0.10", "tcp", 81, "")), "reject dnat=[] masq=false"},
		{"non-service traffic untouched", dptest.Config(), feats, 4, pkt("198.18.64.50", "198.18.65.99", "tcp", 80, "veth1"), "accept dnat=[] masq=false"},
		{"three endpoints all reachable", dptest.Config(), feats, 4, pkt("198.18.64.50", "198.19.0.10", "tcp", 80, "veth1"), "accept dnat=[198.18.64.10:8080 198.18.65.10:8080 198.18.65.11:8080] masq=false"},
		{"hairpin masqueraded", dptest.Config(), feats, 4, pkt("198.18.64.10", "198.19.0.10", "tcp", 80, "veth1"), "accept dnat=[198.18.64.10:8080 198.18.65.10:8080 198.18.65.11:8080] masq=true"},
		{"round-robin reaches every endpoint", dptest.Config(), feats, 4, pkt("198.18.64.50", "198.19.0.24", "tcp", 80, "veth1"), "accept dnat=[198.18.64.10:8080 198.18.65.10:8080 198.18.65.11:8080] masq=false"},
		{"affinity", dptest.Config(), feats, 4, pkt("198.18.64.50", "198.19.0.21", "tcp", 80, "veth1"), "accept dnat=[198.18.64.10:8080 198.18.65.10:8080] masq=false"},
		{"masqueradeAll pod", masqAll, one, 4, pkt("198.18.64.50", "198.19.0.30", "tcp", 80, "veth1"), "accept dnat=[198.18.65.10:8080] masq=true"},
		{"NodeCIDR local pod kept", nodeCIDR, one, 4, pkt("198.18.64.50", "198.19.0.30", "tcp", 80, "veth1"), "accept dnat=[198.18.65.10:8080] masq=false"},
		{"NodeCIDR remote pod masqueraded", nodeCIDR, one, 4, pkt("198.18.65.50", "198.19.0.30", "tcp", 80, "eth0"), "accept dnat=[198.18.65.10:8080] masq=true"},
		{"bridge local pod kept", bridge, one, 4, pkt("198.18.64.50", "198.19.0.30", "tcp", 80, "cbr0"), "accept dnat=[198.18.65.10:8080] masq=false"},
		{"bridge other iface masqueraded", bridge, one, 4, pkt("198.18.64.50", "198.19.0.30", "tcp", 80, "eth0"), "accept dnat=[198.18.65.10:8080] masq=true"},
		{"prefix local pod kept", prefix, one, 4, pkt("198.18.64.50", "198.19.0.30", "tcp", 80, "veth9"), "accept dnat=[198.18.65.10:8080] masq=false"},
		{"prefix other iface masqueraded", prefix, one, 4, pkt("198.18.64.50", "198.19.0.30", "tcp", 80, "eth0"), "accept dnat=[198.18.65.10:8080] masq=true"},
		{"no detect-local: not masqueraded", noLocal, one, 4, pkt("198.18.200.5", "198.19.0.30", "tcp", 80, "eth0"), "accept dnat=[198.18.65.10:8080] masq=false"},
		{"nodePortAddresses primary", npPrimary, one, 4, pkt("198.18.200.5", "198.18.0.2", "tcp", 30030, "eth0"), "accept dnat=[198.18.65.10:8080] masq=true"},
		{"nodePortAddresses elsewhere", npOther, one, 4, pkt("198.18.200.5", "198.18.0.2", "tcp", 30030, "eth0"), "accept dnat=[] masq=false"},
		{"NodePort on loopback ignored", dptest.Config(), one, 4, fromHost(pkt("127.0.0.1", "127.0.0.1", "tcp", 30030, "")), "accept dnat=[] masq=false"},
		{"NodePort to local endpoint from node", dptest.Config(), local, 4, fromHost(pkt("198.18.0.2", "198.18.0.2", "tcp", 30030, "")), "accept dnat=[198.18.64.10:8080] masq=true"},
		{"LB range with node IP admits node", dptest.Config(), lbNode, 4, fromHost(pkt("198.18.0.2", "198.19.100.31", "tcp", 80, "")), "accept dnat=[198.18.65.10:8080] masq=true"},
		{"LB range with node IP admits VIP source", dptest.Config(), lbNode, 4, fromHost(pkt("198.19.100.31", "198.19.100.31", "tcp", 80, "")), "accept dnat=[198.18.65.10:8080] masq=true"},
		{"LB range drops others", dptest.Config(), lbNode, 4, pkt("198.18.200.5", "198.19.100.31", "tcp", 80, "eth0"), "drop dnat=[] masq=false"},
		{"no endpoints NodePort rejected", dptest.Config(), feats, 4, pkt("198.18.200.5", "198.18.0.2", "tcp", 30013, "eth0"), "reject dnat=[] masq=false"},
		{"no endpoints externalIP rejected", dptest.Config(), feats, 4, pkt("198.18.200.5", "198.19.100.13", "tcp", 80, "eth0"), "reject dnat=[] masq=false"},
		{"IPv6 ClusterIP", dual, feats, 6, pkt("fd00:64::50", "fd00:19::10", "tcp", 80, "veth1"), "accept dnat=[[fd00:64::10]:8080 [fd00:65::10]:8080] masq=false"},
		{"IPv6 NodePort", dual, feats, 6, pkt("fd00:200::5", "fd00::2", "tcp", 30023, "eth0"), "accept dnat=[[fd00:64::10]:8080 [fd00:65::10]:8080] masq=true"},
		{"IPv6 unknown port", dual, feats, 6, pkt("fd00:64::50", "fd00:19::10", "tcp", 81, "veth1"), "reject dnat=[] masq=false"},
		// Service CIDRs: an unallocated address in them is dropped; the
		// allocated ClusterIPs behave as without them.
		{"unallocated service IP without ranges untouched", dptest.Config(), feats, 4, pkt("198.18.64.50", "198.19.0.99", "tcp", 80, "veth1"), "accept dnat=[] masq=false"},
		{"unallocated service IP dropped", cidrs, feats, 4, pkt("198.18.64.50", "198.19.0.99", "tcp", 80, "veth1"), "drop dnat=[] masq=false"},
		{"unallocated service IP dropped from node", cidrs, feats, 4, fromHost(pkt("198.18.0.2", "198.19.0.99", "udp", 53, "")), "drop dnat=[] masq=false"},
		{"unallocated service IP dropped from outside", cidrs, feats, 4, pkt("198.18.200.5", "198.19.0.99", "tcp", 80, "eth0"), "drop dnat=[] masq=false"},
		{"service ranges: unknown port still rejected", cidrs, feats, 4, pkt("198.18.64.50", "198.19.0.10", "tcp", 81, "veth1"), "reject dnat=[] masq=false"},
		{"service ranges: no endpoints still rejected", cidrs, feats, 4, pkt("198.18.64.50", "198.19.0.13", "tcp", 80, "veth1"), "reject dnat=[] masq=false"},
		{"service ranges: ClusterIP served", cidrs, feats, 4, pkt("198.18.64.50", "198.19.0.11", "udp", 53, "veth1"), "accept dnat=[198.18.65.12:5353] masq=false"},
		{"service ranges: outside untouched", cidrs, feats, 4, pkt("198.18.64.50", "198.19.1.99", "tcp", 80, "veth1"), "accept dnat=[] masq=false"},
		{"IPv6 unallocated service IP dropped", cidrs, feats, 6, pkt("fd00:64::50", "fd00:19::99", "tcp", 80, "veth1"), "drop dnat=[] masq=false"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := traceOf(t, tc.cfg, tc.snap, tc.fam).trace(tc.p)
			if got.String() != tc.want {
				t.Errorf("got  %v\nwant %v", got, tc.want)
			}
		})
	}
}

// TestTraceSourceHash: a source-hash port sends each client to exactly the
// endpoint the model's table and the kernel's jhash give it, and different
// clients to different endpoints.
func TestTraceSourceHash(t *testing.T) {
	feats := featureSnapshot()
	var sp *model.ServicePort
	for _, p := range feats.V4.Ports {
		if p.ID.Name == "sourcehash" {
			sp = p
		}
	}
	tr := traceOf(t, dptest.Config(), feats, 4)
	seen := map[string]bool{}
	for i := range 40 {
		src := netip.AddrFrom4([4]byte{198, 18, 64, byte(50 + i)})
		want := sp.SourceHashPick(sp.ClusterEndpoints, src)
		got := tr.trace(pkt(src.String(), "198.19.0.25", "tcp", 80, "veth1")).String()
		if w := "accept dnat=[" + want.AddrPort().String() + "] masq=false"; got != w {
			t.Fatalf("client %s: got %s, want %s", src, got, w)
		}
		seen[want.AddrPort().String()] = true
	}
	if len(seen) != 3 {
		t.Errorf("40 clients reached %d of 3 endpoints", len(seen))
	}
}
