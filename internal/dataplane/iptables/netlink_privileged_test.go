package iptables

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/dataplane/dptest"
	"github.com/kproxy/kproxy/internal/model"
)

// TestPrivilegedNetlinkMatchesIPTables writes the same syncs (a first full
// sync, a partial one, a restart's full sync with a Service gone) once
// through iptables-nft-restore and iptables-save and once over netlink,
// into two namespaces, and requires the kernel to hold the same thing: the same iptables-save text
// (what operators and upstream's kube-proxy read back) and the same
// nf_tables expressions.
func TestPrivilegedNetlinkMatchesIPTables(t *testing.T) {
	for _, tc := range configVariants(labConfig) {
		t.Run(tc.name, func(t *testing.T) {
			var dumps [2]string
			for i, viaNetlink := range []bool{false, true} {
				l := dptest.NewLab(t, labPrefix)
				ex := NetnsExec{Namespace: l.Node}
				opts := append([]Option{WithExec(ex), WithSysctl(ExecSysctl{Exec: ex}), WithBackend(BackendNFT), WithNetlink(viaNetlink), WithUnprovenNetlink()}, tc.opts...)
				p, err := New(tc.cfg, opts...)
				if err != nil {
					t.Fatal(err)
				}
				ctx := context.Background()
				snap := featureSnapshot()
				sctp := dptest.Svc("ns", "sctp", "198.19.0.77", 9999, dptest.WithProto(model.SCTP), dptest.WithNodePort(30077),
					dptest.WithEPs(dptest.EP("198.18.65.12", 9999, true), dptest.EP("198.18.65.13", 9999, true)))
				udpEmpty := dptest.Svc("ns", "udp-empty", "198.19.0.78", 53, dptest.WithProto(model.UDP))
				snap = dptest.Snapshot(append(append(snap.V4.Ports, snap.V6.Ports...), sctp, udpEmpty)...)
				if err := p.Sync(ctx, snap, dataplane.SyncRequest{Full: true}); err != nil {
					t.Fatal(err)
				}
				// A partial sync: one Service loses an endpoint, another
				// goes away.
				for _, sp := range snap.V4.Ports {
					if len(sp.Endpoints) > 1 {
						sp.Endpoints = sp.Endpoints[1:]
						dptest.Categorize(sp)
						if err := p.Sync(ctx, snap, changedKey(sp.ID)); err != nil {
							t.Fatal(err)
						}
						break
					}
				}
				if nl, rs := p.writes.netlink.Load(), p.writes.restore.Load(); viaNetlink && (nl < 2 || rs != 0) || !viaNetlink && nl != 0 {
					t.Fatalf("netlink=%v: %d netlink writes, %d iptables-restore runs", viaNetlink, nl, rs)
				}
				// A restart that finds the table loaded, with one Service
				// gone: its chains are stale, the jumps are already there.
				p2, err := New(tc.cfg, opts...)
				if err != nil {
					t.Fatal(err)
				}
				snap.V4.Ports = snap.V4.Ports[1:]
				if err := p2.Sync(ctx, snap, dataplane.SyncRequest{Full: true}); err != nil {
					t.Fatal(err)
				}
				dumps[i] = kernelDump(t, ex)
			}
			if dumps[0] != dumps[1] {
				a, b := strings.Split(dumps[0], "\n"), strings.Split(dumps[1], "\n")
				for j := range max(len(a), len(b)) {
					var x, y string
					if j < len(a) {
						x = a[j]
					}
					if j < len(b) {
						y = b[j]
					}
					if x != y {
						t.Fatalf("netlink and iptables-restore differ at line %d:\niptables-restore: %s\nnetlink:          %s\n\n%s", j+1, x, y, dumps[1])
					}
				}
			}
			if !strings.Contains(dumps[0], "KUBE-SVC-") || !strings.Contains(dumps[0], "DNAT") {
				t.Fatalf("the dump holds no Service rules:\n%s", dumps[0])
			}
			// Upstream's nfacct counters, which the lab's kernel has.
			want := []string{"-m conntrack --ctstate INVALID -m nfacct --nfacct-name  ct_state_invalid_dropped_pkts -j DROP"}
			if tc.name != "bridge-no-localhost" {
				want = append(want, `-d 127.0.0.0/8 -p tcp -m comment --comment "ns/np:p" -m tcp --dport 30004 -m nfacct --nfacct-name  localhost_nps_accepted_pkts -j KUBE-EXT-`)
			}
			for _, w := range want {
				if !strings.Contains(dumps[0], w) {
					t.Errorf("no rule holds %q\n%s", w, dumps[0])
				}
			}
		})
	}
}

var (
	saveNoise   = regexp.MustCompile(`(?m)^#.*$`)
	handleNoise = regexp.MustCompile(`(?m)^(ip6? \S+ \S+)( \d+)+$`)
)

// kernelDump is iptables-save and ip6tables-save of every table, and the
// nf_tables expressions of the ip and ip6 families, without comments,
// timestamps and rule handles.
func kernelDump(t *testing.T, ex Exec) string {
	t.Helper()
	var b strings.Builder
	for _, cmd := range []string{"iptables-nft-save", "ip6tables-nft-save"} {
		out, err := ex.Run(context.Background(), nil, cmd)
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString(saveNoise.ReplaceAllString(string(out), ""))
	}
	out, err := ex.Run(context.Background(), nil, "nft", "--debug=netlink", "list", "ruleset")
	if err != nil {
		t.Fatal(err)
	}
	// Keep the expression blocks; sort them so that creation order does
	// not matter.
	var blocks []string
	for _, blk := range strings.Split(string(out), "\n\n") {
		if !strings.HasPrefix(blk, "ip") {
			continue
		}
		blk = handleNoise.ReplaceAllString(blk, "$1")
		// The designed difference: no counter on KUBE-SEP's hairpin rule
		// and on the KUBE-SVC/SVL rules that pick an endpoint, over
		// netlink (see addRule).
		if strings.Contains(blk, " KUBE-SEP-") && strings.Contains(blk, "jump -> KUBE-MARK-MASQ") ||
			(strings.Contains(blk, " KUBE-SVC-") || strings.Contains(blk, " KUBE-SVL-")) && strings.Contains(blk, "jump -> KUBE-SEP-") {
			blk = strings.Replace(blk, "  [ counter pkts 0 bytes 0 ]\n", "", 1)
		}
		blocks = append(blocks, blk)
	}
	slices.Sort(blocks)
	b.WriteString(strings.Join(blocks, "\n\n"))
	return b.String()
}
