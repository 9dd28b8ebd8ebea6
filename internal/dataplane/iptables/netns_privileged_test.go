package iptables

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/dataplane/dptest"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/nfacct"
)

// labPrefix names the namespaces of this package's labs (see dptest.NewLab).
const labPrefix = "kpipt"

func labConfig() dataplane.Config {
	cfg := dptest.Config()
	cfg.NodeIPs = nil
	return cfg
}

func TestPrivilegedClusterIPTraffic(t *testing.T) {
	for _, b := range []Backend{BackendNFT, BackendLegacy} {
		t.Run(string(b), func(t *testing.T) {
			l := dptest.NewLab(t, labPrefix)
			ex := NetnsExec{Namespace: l.Node}
			p, err := New(labConfig(), WithExec(ex), WithSysctl(ExecSysctl{Exec: ex}), WithBackend(b))
			if err != nil {
				t.Fatal(err)
			}
			l.Serve("198.18.64.10:8080", "hello")
			snap := dptest.Snapshot(
				dptest.Svc("ns", "web", "198.19.0.10", 80, dptest.WithEPs(dptest.EP("198.18.64.10", 8080, true))),
				dptest.Svc("ns", "none", "198.19.0.11", 80),
			)
			ctx := context.Background()
			if err := p.Sync(ctx, snap, dataplane.SyncRequest{Full: true}); err != nil {
				t.Fatal(err)
			}
			if got, err := l.Get("198.19.0.10:80", 2*time.Second); err != nil || got != "hello" {
				t.Fatalf("ClusterIP: got %q, %v; want hello", got, err)
			}
			counters := func() (errs []error) {
				l.In(l.Node, func() {
					for _, c := range []string{nfacct.CTStateInvalidDropped, nfacct.LocalhostNodePortsAccepted} {
						_, err := nfacct.Packets(c)
						errs = append(errs, err)
					}
				})
				return errs
			}
			for _, err := range counters() {
				if err != nil {
					t.Errorf("after the first sync: %v", err)
				}
			}
			if out, _ := ex.Run(ctx, nil, b.cmd(model.IPv4, "-save"), "-t", "filter"); !strings.Contains(string(out), "--nfacct-name") {
				t.Errorf("no rule counts into nfacct:\n%s", out)
			}
			start := time.Now()
			_, err = l.Get("198.19.0.11:80", 2*time.Second)
			if !errors.Is(err, syscall.ECONNREFUSED) || time.Since(start) > time.Second {
				t.Fatalf("no-endpoints Service: got %v after %v, want a fast connection refused", err, time.Since(start))
			}
			if d, err := p.Drifted(ctx); d || err != nil {
				t.Fatalf("Drifted right after sync: %v %v", d, err)
			}
			// Endpoint comes to "none" (partial sync), then the table is flushed.
			snap2 := dptest.Snapshot(
				dptest.Svc("ns", "web", "198.19.0.10", 80, dptest.WithEPs(dptest.EP("198.18.64.10", 8080, true))),
				dptest.Svc("ns", "none", "198.19.0.11", 80, dptest.WithEPs(dptest.EP("198.18.64.10", 8080, true))),
			)
			if err := p.Sync(ctx, snap2, changed("none")); err != nil {
				t.Fatal(err)
			}
			if got, err := l.Get("198.19.0.11:80", 2*time.Second); err != nil || got != "hello" {
				t.Fatalf("after partial sync: got %q, %v", got, err)
			}
			if _, err := ex.Run(ctx, nil, b.cmd(model.IPv4, ""), "-t", "nat", "-F"); err != nil {
				t.Fatal(err)
			}
			if d, _ := p.Drifted(ctx); !d {
				t.Fatal("nat flush not detected")
			}
			if err := p.Sync(ctx, snap2, changed()); err != nil {
				t.Fatal(err)
			}
			if got, err := l.Get("198.19.0.10:80", 2*time.Second); err != nil || got != "hello" {
				t.Fatalf("after repair: got %q, %v", got, err)
			}
			if err := p.Cleanup(ctx); err != nil {
				t.Fatal(err)
			}
			out, _ := ex.Run(ctx, nil, b.cmd(model.IPv4, "-save"))
			if s := strings.ReplaceAll(string(out), "KUBE-FIREWALL", ""); strings.Contains(s, "KUBE-") {
				t.Errorf("cleanup left rules:\n%s", out)
			}
			for _, err := range counters() {
				if !errors.Is(err, syscall.ENOENT) {
					t.Errorf("after cleanup, a counter: %v; want none (ENOENT)", err)
				}
			}
		})
	}
}

// TestPrivilegedRenderLoads loads the feature ruleset (both families) into
// each real backend: every rule render emits must be valid.
func TestPrivilegedRenderLoads(t *testing.T) {
	for _, b := range []Backend{BackendNFT, BackendLegacy} {
		t.Run(string(b), func(t *testing.T) {
			l := dptest.NewLab(t, labPrefix)
			ex := NetnsExec{Namespace: l.Node}
			cfg := dptest.Config()
			cfg.Families = []model.Family{model.IPv4, model.IPv6}
			p, _ := New(cfg, WithExec(ex), WithSysctl(ExecSysctl{Exec: ex}), WithBackend(b))
			if err := p.Sync(context.Background(), featureSnapshot(), dataplane.SyncRequest{Full: true}); err != nil {
				t.Fatal(err)
			}
		})
	}
}
