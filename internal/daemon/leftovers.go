package daemon

import (
	"context"

	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/dataplane/ipvs"
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
	if (d.mode == ModeNFTables || d.mode == ModeUserspace) && d.env.firewallCleanup != nil {
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

// removeIPVSLeftovers deletes what an IPVS mode (upstream's or kproxy's)
// leaves besides its iptables chains (which the iptables backend's Cleanup
// removes): the IPVS virtual servers, kube-ipvs0 with every Service IP on
// it, and the KUBE-* ip sets no rule refers to any more.
func removeIPVSLeftovers(ctx context.Context) error {
	p, err := ipvs.New(dataplane.Config{})
	if err != nil {
		return err
	}
	return p.Cleanup(ctx)
}
