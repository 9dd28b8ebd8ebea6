package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/dataplane/iptables"
	"github.com/kproxy/kproxy/internal/model"
)

// kube-proxy's iptables mode (upstream's and kproxy's) also creates
// KUBE-FIREWALL in the filter table, a copy of kubelet's chain that drops
// martian packets to 127.0.0.0/8 (CVE-2020-8558), because it sets
// route_localnet=1 for NodePorts on localhost. Neither upstream's cleanup
// nor the iptables backend's Cleanup removes it, as kubelet may own it.
// When no kubelet manages iptables on this node (none of its hint chains
// exist), the chain is a proxy leftover: removeFirewallLeftovers deletes it
// and its jumps, and resets route_localnet to 0 first, so that the martian
// protection is never gone while localnet routing is on.

// kubeletHintChains are mangle chains a kubelet managing iptables creates.
var kubeletHintChains = []string{"KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT"}

const (
	firewallChain       = "KUBE-FIREWALL"
	sysctlRouteLocalnet = "/proc/sys/net/ipv4/conf/all/route_localnet"
)

// iptablesTools are the iptables programs of both backends and families.
var iptablesTools = []struct {
	name    string
	backend iptables.Backend
	family  model.Family
}{
	{"iptables-nft", iptables.BackendNFT, model.IPv4},
	{"ip6tables-nft", iptables.BackendNFT, model.IPv6},
	{"iptables-legacy", iptables.BackendLegacy, model.IPv4},
	{"ip6tables-legacy", iptables.BackendLegacy, model.IPv6},
}

// removeFirewallLeftovers removes KUBE-FIREWALL from every iptables backend
// and family where it is a proxy's leftover (see above).
func removeFirewallLeftovers(ctx context.Context) error {
	var errs []error
	for _, tool := range iptablesTools {
		if !iptables.HasTables(tool.backend, tool.family) {
			continue // no filter table, no KUBE-FIREWALL
		}
		if err := removeFirewall(ctx, tool.name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removeFirewall handles one tool. It reads every table with one -save
// without -t: naming a table would make the legacy backend create it.
func removeFirewall(ctx context.Context, tool string) error {
	if _, err := exec.LookPath(tool + "-save"); err != nil {
		return nil
	}
	out, err := exec.CommandContext(ctx, tool+"-save").Output()
	if err != nil || hasKubeletHint(string(out)) {
		return nil // nothing there, or kubelet owns KUBE-FIREWALL
	}
	text := firewallRemoval(tableSection(string(out), "filter"))
	if text == "" {
		return nil
	}
	if err := resetRouteLocalnet(ctx); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, tool+"-restore", "--noflush", "--wait")
	cmd.Stdin = strings.NewReader(text)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s-restore: removing %s: %w: %s", tool, firewallChain, err, bytes.TrimSpace(out))
	}
	klog.FromContext(ctx).Info("Removed proxy leftover chain", "chain", firewallChain, "tool", tool)
	return nil
}

// tableSection is one table's part of an iptables-save output, "" when
// the table is absent.
func tableSection(save, table string) string {
	start := strings.Index(save, "*"+table+"\n")
	if start < 0 {
		return ""
	}
	rest := save[start:]
	if end := strings.Index(rest, "\nCOMMIT"); end >= 0 {
		return rest[:end+1]
	}
	return rest
}

func hasKubeletHint(mangle string) bool {
	for _, c := range kubeletHintChains {
		if strings.Contains(mangle, ":"+c+" ") {
			return true
		}
	}
	return false
}

// firewallRemoval is the iptables-restore --noflush input that deletes the
// jumps to KUBE-FIREWALL and the chain itself from a saved filter table; ""
// when the chain is absent.
func firewallRemoval(filter string) string {
	if !strings.Contains(filter, "\n:"+firewallChain+" ") {
		return ""
	}
	var b strings.Builder
	b.WriteString("*filter\n")
	for _, l := range strings.Split(filter, "\n") {
		f := strings.Fields(l)
		if len(f) > 2 && f[0] == "-A" && f[1] != firewallChain && f[len(f)-2] == "-j" && f[len(f)-1] == firewallChain {
			b.WriteString("-D" + strings.TrimPrefix(l, "-A") + "\n")
		}
	}
	b.WriteString(":" + firewallChain + " - [0:0]\n-X " + firewallChain + "\nCOMMIT\n")
	return b.String()
}

// resetRouteLocalnet turns route_localnet off when it is on: only the
// iptables mode's localhost NodePorts needed it.
func resetRouteLocalnet(ctx context.Context) error {
	b, err := os.ReadFile(sysctlRouteLocalnet)
	if err != nil || strings.TrimSpace(string(b)) != "1" {
		return nil
	}
	klog.FromContext(ctx).Info("Setting route_localnet=0: no proxy needs NodePorts on localhost any more")
	if err := os.WriteFile(sysctlRouteLocalnet, []byte("0"), 0o644); err != nil {
		return fmt.Errorf("resetting route_localnet before removing %s: %w", firewallChain, err)
	}
	return nil
}
