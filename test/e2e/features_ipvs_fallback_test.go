//go:build e2e

package e2e

import (
	"context"
	"os"
	"strings"
	"testing"
)

// TestFallbackToIPTables: on a kernel without IPVS (this machine's), kproxy asked
// for `--proxy-mode ipvs` warns, naming what is missing, and runs iptables
// mode: traffic through node1 works through iptables rules, and /proxyMode
// and the metrics report iptables. In the IPVS VM (make e2e-ipvs) the mode
// itself is tested instead.
func TestFallbackToIPTables(t *testing.T) {
	kproxyOnly(t, "kproxy's fallback; upstream v1.36 exits instead")
	if _, err := os.Stat("/proc/net/ip_vs"); err == nil {
		t.Skip("this kernel has IPVS: the fallback cannot happen here (make e2e-ipvs tests the mode)")
	}
	b := newMigBed(t, "e2e-ipvs-fallback")
	b.start(proxySpec{bin: kproxyBinary(t), mode: "ipvs"})
	b.waitServing(b.pods...)
	if log := b.proc.Log(); !strings.Contains(log, "falling back to iptables mode") || !strings.Contains(log, "ip_vs") {
		t.Errorf("no warning naming what IPVS lacks in kproxy's log:\n%s", tail(log, 20))
	}
	if !strings.Contains(b.iptablesSave(), "-j KUBE-SVC-IP-") {
		t.Error("no iptables-mode rules after the fallback")
	}
	ctx := context.Background()
	_, mode, err := b.node.HTTPGet(ctx, "http://127.0.0.1:10249/proxyMode")
	if err != nil || strings.TrimSpace(mode) != "iptables" {
		t.Errorf("/proxyMode = %q, %v; want iptables", mode, err)
	}
	// Full-sync latency is a metric of the iptables and nftables modes,
	// not of IPVS mode (as upstream registers them).
	_, metrics, err := b.node.HTTPGet(ctx, "http://127.0.0.1:10249/metrics")
	if err != nil || !strings.Contains(metrics, "# TYPE kubeproxy_sync_full_proxy_rules_duration_seconds") {
		t.Errorf("metrics are not the iptables mode's (no kubeproxy_sync_full_proxy_rules_duration_seconds; err %v)", err)
	}
}
