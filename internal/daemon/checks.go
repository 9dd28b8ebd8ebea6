package daemon

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/model"
)

// Start-up checks of the configuration against the node, as upstream makes
// them once it knows the node's primary family: most only warn (the same
// messages, so that operators find them in the log), two have always
// stopped upstream and stop kproxy: in ClusterCIDR mode on a node without
// dual-stack, clusterCIDR entirely of the other family; in NodeCIDR mode,
// podCIDRs entirely of the other family.

// checkConfig returns the warnings about c on a node whose primary family
// is primary, whose proxy families are fams, whose pod CIDRs are podCIDRs
// and whose resolved nodePortAddresses are nodePorts; fatal is non-nil
// when kproxy must not start.
func checkConfig(c *kpv1alpha1.KubeProxyConfiguration, primary model.Family, fams []model.Family, podCIDRs, nodePorts []string) (warnings []error, fatal error) {
	clusterCIDRs := splitList(c.ClusterCIDR)
	anyDual := false
	for _, list := range [][]string{clusterCIDRs, nodePorts, c.IPVS.ExcludeCIDRs, podCIDRs} {
		anyDual = anyDual || (familyCount(list, model.IPv4) > 0 && familyCount(list, model.IPv6) > 0)
	}
	other := otherFamily(primary)
	switch {
	case len(nodePorts) == 0:
		warnings = append(warnings, errors.New("nodePortAddresses is unset; NodePort connections will be accepted on all local IPs. Consider using `--nodeport-addresses primary`"))
	case anyDual && familyCount(nodePorts, primary) == len(nodePorts):
		warnings = append(warnings, fmt.Errorf("cluster appears to be dual-stack but nodePortAddresses contains only %s addresses; NodePort connections will be accepted on all local %s IPs", primary, other))
	case familyCount(nodePorts, primary) == 0:
		warnings = append(warnings, fmt.Errorf("cluster appears to be %s-primary but nodePortAddresses contains only %s addresses; NodePort connections will be accepted on all local %s IPs", primary, other, primary))
	}

	dual := len(fams) > 1
	kind := primary.String() + "-only"
	if dual {
		kind = primary.String() + "-primary"
	}
	onlyOther := func(list []string) bool { return len(list) > 0 && familyCount(list, other) == len(list) }
	var fatals []error
	if onlyOther(clusterCIDRs) {
		err := fmt.Errorf("cluster is %s but clusterCIDRs contains only %s addresses", kind, other)
		if dataplane.LocalMode(c.DetectLocalMode) == dataplane.LocalClusterCIDR && !dual {
			fatals = append(fatals, err)
		} else {
			warnings = append(warnings, err)
		}
	}
	if onlyOther(podCIDRs) {
		err := fmt.Errorf("cluster is %s but node.spec.podCIDRs contains only %s addresses", kind, other)
		if dataplane.LocalMode(c.DetectLocalMode) == dataplane.LocalNodeCIDR {
			fatals = append(fatals, err)
		} else {
			warnings = append(warnings, err)
		}
	}
	if !dual {
		if onlyOther(c.IPVS.ExcludeCIDRs) {
			warnings = append(warnings, fmt.Errorf("cluster is %s but ipvs.excludeCIDRs contains only %s addresses", kind, other))
		}
		for _, b := range []struct{ name, addr string }{{"healthzBindAddress", c.HealthzBindAddress}, {"metricsBindAddress", c.MetricsBindAddress}} {
			if ap, err := netip.ParseAddrPort(b.addr); err == nil && !ap.Addr().IsUnspecified() && model.FamilyOf(ap.Addr()) == other {
				warnings = append(warnings, fmt.Errorf("cluster is %s but %s is %s", kind, b.name, other))
			}
		}
	}
	return warnings, errors.Join(fatals...)
}

// familyCount counts the CIDRs of list in family f.
func familyCount(list []string, f model.Family) int {
	n := 0
	for _, s := range list {
		if p, ok := model.ParsePrefix(s); ok && model.FamilyOf(p.Addr()) == f {
			n++
		}
	}
	return n
}

// splitList splits a comma-separated list, dropping blanks.
func splitList(s string) []string {
	var out []string
	for _, x := range strings.Split(s, ",") {
		if x = strings.TrimSpace(x); x != "" {
			out = append(out, x)
		}
	}
	return out
}
