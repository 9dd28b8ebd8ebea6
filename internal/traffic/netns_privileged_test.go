package traffic

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"net/netip"

	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/dataplane/dptest"
	"github.com/kproxy/kproxy/internal/dataplane/nftables"
	"github.com/kproxy/kproxy/internal/model"
)

// TestPrivilegedCountsTraffic: behind kproxy's nftables rules in a lab
// namespace, N connections to a ClusterIP and M to a NodePort show up as
// exactly N and M new connections of the Service port, with the packets
// and bytes of both directions; the other port counts nothing; a port
// that goes takes its counters with it; Run deletes the table at its end.
func TestPrivilegedCountsTraffic(t *testing.T) {
	l := dptest.NewLab(t, "kptr")
	l.Serve("198.18.64.10:8080", "hello")
	web := dptest.Svc("ns", "web", "198.19.0.10", 80, dptest.WithNodePort(30080), dptest.WithEPs(dptest.EP("198.18.64.10", 8080, true)))
	other := dptest.Svc("ns", "other", "198.19.0.11", 80, dptest.WithEPs(dptest.EP("198.18.64.10", 8080, true)))
	snap := dptest.Snapshot(web, other)
	cfg := dataplane.Config{Families: []model.Family{model.IPv4}, MasqueradeBit: 14,
		LocalMode: dataplane.LocalClusterCIDR, ClusterCIDRs: []netip.Prefix{dptest.ClusterNet}}
	p, err := nftables.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := NewReconciler(cfg.Families, klog.Background())
	l.In(l.Node, func() {
		if err = p.Sync(context.Background(), snap, dataplane.SyncRequest{Full: true}); err == nil {
			r.apply(snap)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	const clusterConns, nodePortConns = 7, 3
	for i := range clusterConns + nodePortConns {
		addr := "198.19.0.10:80"
		if i >= clusterConns {
			addr = "198.18.200.1:30080"
		}
		if got, err := l.Get(addr, 2*time.Second); err != nil || got != "hello" {
			t.Fatalf("connection %d to %s: %q, %v", i, addr, got, err)
		}
	}
	got := read(t, l)
	w := got[web.ID]
	if w.NewConnections != clusterConns+nodePortConns {
		t.Errorf("web: %d new connections, want %d (%+v)", w.NewConnections, clusterConns+nodePortConns, w)
	}
	// A TCP connection: handshake, request-less reply, two FINs: at least
	// 5 packets, 40+ bytes each.
	if w.Packets < 5*(clusterConns+nodePortConns) || w.Bytes < 40*w.Packets {
		t.Errorf("web: %d packets, %d bytes for %d connections", w.Packets, w.Bytes, clusterConns+nodePortConns)
	}
	if o, ok := got[other.ID]; !ok || o.NewConnections != 0 || o.Packets != 0 {
		t.Errorf("other: %+v (present %v), want zero counters", o, ok)
	}
	l.In(l.Node, func() { r.apply(dptest.Snapshot(web)) })
	if _, ok := read(t, l)[other.ID]; ok {
		t.Errorf("the removed port still has counters")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	l.In(l.Node, func() { r.Run(ctx) })
	if out, _ := exec.Command("ip", "netns", "exec", l.Node, "nft", "list", "tables").CombinedOutput(); strings.Contains(string(out), Table) {
		t.Errorf("table %s is left after Run:\n%s", Table, out)
	}
}

func read(t *testing.T, l *dptest.Lab) map[model.PortID]Sample {
	t.Helper()
	var samples []Sample
	var err error
	l.In(l.Node, func() { samples, err = Read([]model.Family{model.IPv4}) })
	if err != nil {
		t.Fatal(err)
	}
	out := map[model.PortID]Sample{}
	for _, s := range samples {
		out[s.ID] = s
	}
	t.Logf("samples: %v", fmt.Sprint(samples))
	return out
}
