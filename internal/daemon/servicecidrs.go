package daemon

import (
	"context"
	"net/netip"
	"slices"

	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/model"
)

// serviceCIDRSetter is implemented by dataplanes that drop traffic to the
// unallocated addresses of the cluster's Service ranges (nftables, as
// upstream). They take the ranges at run time, since ServiceCIDR objects
// come and go; the change lands with their next Sync.
type serviceCIDRSetter interface {
	SetServiceCIDRs(cidrs []netip.Prefix)
}

// handServiceCIDRs gives the dataplane snap's Service ranges when they differ
// from those it has, before the Sync that must program them. Dataplanes
// without the rule (iptables, as upstream) are left alone.
func (d *daemon) handServiceCIDRs(ctx context.Context, snap *model.Snapshot) {
	if slices.Equal(snap.ServiceCIDRs, d.cidrs) {
		return
	}
	d.cidrs = snap.ServiceCIDRs
	s, ok := d.dp.(serviceCIDRSetter)
	if !ok {
		return
	}
	s.SetServiceCIDRs(snap.ServiceCIDRs)
	klog.FromContext(ctx).V(2).Info("Service IP ranges changed", "serviceCIDRs", prefixStrings(snap.ServiceCIDRs))
}

func prefixStrings(ps []netip.Prefix) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return out
}
