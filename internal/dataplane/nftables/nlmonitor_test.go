package nftables

import (
	"encoding/binary"
	"maps"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/nfnl"
)

// notification is one nf_tables notification as the kernel multicasts it.
type notification struct {
	port  uint32 // netlink port of the sender of the transaction
	fam   byte
	typ   uint16
	attrs map[uint16]string
}

func encodeNotifications(ns ...notification) []byte {
	var out []byte
	for _, n := range ns {
		m := nfnl.Message(n.typ, 0, n.fam, func(b *nfnl.Batch) {
			for _, k := range slices.Sorted(maps.Keys(n.attrs)) {
				b.AttrStr(k, n.attrs[k])
			}
		})
		binary.NativeEndian.PutUint32(m[12:], n.port)
		out = append(out, m...)
	}
	return out
}

// TestClassifyNotifications: only changes to kproxy's own table made by
// others count, named by the object they touch.
func TestClassifyNotifications(t *testing.T) {
	const own, other = 77, 99
	v4, v6 := byte(unix.NFPROTO_IPV4), byte(unix.NFPROTO_IPV6)
	rule := func(port uint32, fam byte, typ uint16, table, chain string) notification {
		return notification{port, fam, typ, map[uint16]string{unix.NFTA_RULE_TABLE: table, unix.NFTA_RULE_CHAIN: chain}}
	}
	elems := func(port uint32, typ uint16, set string) notification {
		return notification{port, v4, typ, map[uint16]string{unix.NFTA_SET_ELEM_LIST_TABLE: "kproxy", unix.NFTA_SET_ELEM_LIST_SET: set}}
	}
	cases := []struct {
		name string
		in   []notification
		want map[model.Family][]string
	}{
		{"own rewrite ignored", []notification{rule(own, v4, unix.NFT_MSG_DELRULE, "kproxy", "services"), rule(own, v4, unix.NFT_MSG_NEWRULE, "kproxy", "services"),
			{own, 0, unix.NFT_MSG_NEWGEN, map[uint16]string{}}}, nil},
		{"another table ignored", []notification{rule(other, v4, unix.NFT_MSG_DELRULE, "filter", "input"), {other, v4, unix.NFT_MSG_DELTABLE, map[uint16]string{unix.NFTA_TABLE_NAME: "kube-proxy"}}}, nil},
		{"service chain flushed", []notification{rule(other, v4, unix.NFT_MSG_DELRULE, "kproxy", "svc-ABC-ns/a/tcp/p/1.1")}, map[model.Family][]string{model.IPv4: {"svc-ABC-ns/a/tcp/p/1.1"}}},
		{"rule added to an ip6 chain", []notification{rule(other, v6, unix.NFT_MSG_NEWRULE, "kproxy", "filter-input")}, map[model.Family][]string{model.IPv6: {"filter-input"}}},
		{"map flushed", []notification{elems(other, unix.NFT_MSG_DELSETELEM, "service-ips"), elems(other, unix.NFT_MSG_DELSETELEM, "endpoint-ranges-tcp-03")},
			map[model.Family][]string{model.IPv4: {"endpoint-ranges-tcp-03", "service-ips"}}},
		{"affinity elements ignored", []notification{elems(0, unix.NFT_MSG_DELSETELEM, "affinity"), elems(0, unix.NFT_MSG_NEWSETELEM, "affinity")}, nil},
		{"old per-endpoint affinity elements ignored", []notification{elems(0, unix.NFT_MSG_DELSETELEM, "aff-XYZ-ns/a/tcp/p/198.18.65.10/80")}, nil},
		{"affinity set deleted", []notification{{other, v4, unix.NFT_MSG_DELSET, map[uint16]string{unix.NFTA_SET_TABLE: "kproxy", unix.NFTA_SET_NAME: "affinity"}}}, map[model.Family][]string{model.IPv4: {"affinity"}}},
		{"table deleted", []notification{{other, v4, unix.NFT_MSG_DELTABLE, map[uint16]string{unix.NFTA_TABLE_NAME: "kproxy"}}}, map[model.Family][]string{model.IPv4: {""}}},
		{"chain deleted", []notification{{other, v4, unix.NFT_MSG_DELCHAIN, map[uint16]string{unix.NFTA_CHAIN_TABLE: "kproxy", unix.NFTA_CHAIN_NAME: "ext-Q-ns/a/tcp/p"}}}, map[model.Family][]string{model.IPv4: {"ext-Q-ns/a/tcp/p"}}},
		{"set deleted", []notification{{other, v4, unix.NFT_MSG_DELSET, map[uint16]string{unix.NFTA_SET_TABLE: "kproxy", unix.NFTA_SET_NAME: "cluster-ips"}}}, map[model.Family][]string{model.IPv4: {"cluster-ips"}}},
		{"bridge family ignored", []notification{rule(other, 7, unix.NFT_MSG_DELRULE, "kproxy", "x")}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			touched := map[model.Family]map[string]bool{}
			classifyNotifications(encodeNotifications(tc.in...), "kproxy", func(p uint32) bool { return p == own }, touched)
			got := map[model.Family][]string{}
			for f, names := range touched {
				got[f] = slices.Sorted(maps.Keys(names))
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for f, w := range tc.want {
				if !slices.Equal(got[f], w) {
					t.Errorf("%s: got %v, want %v", f, got[f], w)
				}
			}
		})
	}
}

// TestPortRing: kproxy's own ports are remembered, the oldest forgotten.
func TestPortRing(t *testing.T) {
	r := &portRing{}
	for p := uint32(1); p <= 300; p++ {
		r.add(p)
	}
	if !r.has(300) || !r.has(45) || r.has(44) || r.has(0) {
		t.Errorf("ring: has(300)=%v has(45)=%v has(44)=%v has(0)=%v", r.has(300), r.has(45), r.has(44), r.has(0))
	}
}
