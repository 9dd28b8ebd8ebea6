package daemon

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"strings"

	"github.com/vishvananda/netlink"
	"k8s.io/klog/v2"
)

// Leftovers of other proxy modes (kproxy's own or upstream kube-proxy's) are
// removed once, right after the first successful sync of this mode's
// dataplane, so a node switching proxies is never without rules: until then
// the old rules keep answering, after it the new ones do. Upstream removes
// them before its first sync, which leaves a window without rules.

// removeLeftovers removes, best effort, the kernel state of every other
// mode, and upstream's IPVS remnants. Failures are logged, as upstream does.
func (d *daemon) removeLeftovers(ctx context.Context) {
	logger := klog.FromContext(ctx)
	for _, mode := range leftoverModes(d.mode, d.env.dataplanes) {
		if err := cleanupMode(ctx, d.env, mode); err != nil {
			logger.Error(err, "Removing leftovers of another proxy mode failed", "mode", mode)
		}
	}
	if d.mode == ModeNFTables && d.env.firewallCleanup != nil {
		if err := d.env.firewallCleanup(ctx); err != nil {
			logger.Error(err, "Removing the iptables mode's KUBE-FIREWALL failed")
		}
	}
	if d.mode != ModeIPVS && d.env.ipvsCleanup != nil {
		if err := d.env.ipvsCleanup(ctx); err != nil {
			logger.Error(err, "Removing IPVS leftovers failed")
		}
	}
}

// ipvsDummyDevice is the dummy interface upstream's ipvs mode binds every
// Service IP to.
const ipvsDummyDevice = "kube-ipvs0"

// ipsetPrefix names the ip sets upstream's ipvs mode creates.
const ipsetPrefix = "KUBE-"

// removeIPVSLeftovers deletes what upstream's ipvs mode leaves besides its
// iptables chains (which the iptables backend's Cleanup removes): the
// kube-ipvs0 dummy interface that holds every Service IP as a local
// address, the IPVS virtual servers (when the kernel has IPVS and ipvsadm
// is installed) and its KUBE-* ip sets. What is absent is no error.
func removeIPVSLeftovers(ctx context.Context) error {
	var errs []error
	if link, err := netlink.LinkByName(ipvsDummyDevice); err == nil {
		if err := netlink.LinkDel(link); err != nil {
			errs = append(errs, fmt.Errorf("deleting interface %s: %w", ipvsDummyDevice, err))
		} else {
			klog.FromContext(ctx).Info("Deleted IPVS leftover interface", "interface", ipvsDummyDevice)
		}
	}
	if _, err := os.Stat("/proc/net/ip_vs"); err == nil {
		if path, err := exec.LookPath("ipvsadm"); err == nil {
			if out, err := exec.CommandContext(ctx, path, "--clear").CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("ipvsadm --clear: %w: %s", err, strings.TrimSpace(string(out))))
			}
		}
	}
	destroyIPSets(ctx)
	return errors.Join(errs...)
}

// destroyIPSets destroys the KUBE-* ip sets, each on its own: a set still
// referenced by an iptables rule stays (logged at V(2)). Without the ip_set
// module there are no sets, and ipset is not run.
func destroyIPSets(ctx context.Context) {
	if _, err := os.Stat("/sys/module/ip_set"); errors.Is(err, fs.ErrNotExist) {
		return
	}
	path, err := exec.LookPath("ipset")
	if err != nil {
		return
	}
	out, err := exec.CommandContext(ctx, path, "list", "-n").Output()
	if err != nil {
		return
	}
	logger := klog.FromContext(ctx)
	for _, name := range kubeIPSets(string(out)) {
		if out, err := exec.CommandContext(ctx, path, "destroy", name).CombinedOutput(); err != nil {
			logger.V(2).Info("Could not destroy IPVS leftover ip set", "set", name, "err", err, "output", strings.TrimSpace(string(out)))
			continue
		}
		logger.Info("Destroyed IPVS leftover ip set", "set", name)
	}
}

// kubeIPSets picks upstream's set names out of `ipset list -n`.
func kubeIPSets(list string) []string {
	var out []string
	for _, l := range strings.Split(list, "\n") {
		if name := strings.TrimSpace(l); strings.HasPrefix(name, ipsetPrefix) {
			out = append(out, name)
		}
	}
	return out
}
