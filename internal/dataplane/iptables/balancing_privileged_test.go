package iptables

import (
	"context"
	"fmt"
	"testing"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/dataplane/dptest"
	"github.com/kproxy/kproxy/internal/model"
)

// TestPrivilegedRoundRobin sends real connections through each backend's
// rules (and the netlink writer's): round-robin takes the endpoints
// exactly in turn.
func TestPrivilegedRoundRobin(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []Option
	}{
		{"nft-restore", []Option{WithBackend(BackendNFT), WithNetlink(false)}},
		{"nft-netlink", []Option{WithBackend(BackendNFT), WithNetlink(true), WithUnprovenNetlink()}},
		{"legacy", []Option{WithBackend(BackendLegacy)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := dptest.NewLab(t, labPrefix)
			ex := NetnsExec{Namespace: l.Node}
			p, err := New(labConfig(), append([]Option{WithExec(ex), WithSysctl(ExecSysctl{Exec: ex})}, tc.opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			var eps []*model.Endpoint
			for port := uint16(8080); port < 8083; port++ {
				l.Serve(fmt.Sprintf("198.18.64.10:%d", port), fmt.Sprint(port))
				eps = append(eps, dptest.EP("198.18.64.10", port, true))
			}
			snap := dptest.Snapshot(dptest.Svc("ns", "rr", "198.19.0.10", 80, dptest.WithBalancing(model.BalanceRoundRobin), dptest.WithEPs(eps...)))
			if err := p.Sync(context.Background(), snap, dataplane.SyncRequest{Full: true}); err != nil {
				t.Fatal(err)
			}
			l.GetInTurn("198.19.0.10:80", 3, 9)
		})
	}
}
