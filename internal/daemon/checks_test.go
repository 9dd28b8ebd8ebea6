package daemon

import (
	"strings"
	"testing"

	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"

	"github.com/kproxy/kproxy/internal/model"
)

// TestCheckConfig: upstream's start-up checks, with its messages; only
// the two it has always refused to start with are fatal.
func TestCheckConfig(t *testing.T) {
	v4 := []model.Family{model.IPv4}
	dual := []model.Family{model.IPv4, model.IPv6}
	tests := []struct {
		name      string
		cfg       kpv1alpha1.KubeProxyConfiguration
		fams      []model.Family
		podCIDRs  []string
		nodePorts []string
		warnings  []string
		fatal     string
	}{
		{name: "kubeadm's default: nodePortAddresses unset", cfg: kpv1alpha1.KubeProxyConfiguration{ClusterCIDR: "198.18.0.0/16"}, fams: dual,
			warnings: []string{"nodePortAddresses is unset"}},
		{name: "primary resolved, single-stack: nothing", cfg: kpv1alpha1.KubeProxyConfiguration{ClusterCIDR: "198.18.0.0/16"}, fams: v4,
			nodePorts: []string{"198.18.1.1/32"}},
		{name: "dual-stack config, IPv4 NodePorts only", cfg: kpv1alpha1.KubeProxyConfiguration{ClusterCIDR: "198.18.0.0/16,fd00:1::/64"}, fams: dual,
			nodePorts: []string{"198.18.1.1/32"}, warnings: []string{"cluster appears to be dual-stack but nodePortAddresses contains only IPv4 addresses"}},
		{name: "IPv6 NodePorts only", fams: dual, nodePorts: []string{"fd00::/64"},
			warnings: []string{"cluster appears to be IPv4-primary but nodePortAddresses contains only IPv6 addresses"}},
		{name: "ClusterCIDR mode, single-stack, other family only: fatal",
			cfg: kpv1alpha1.KubeProxyConfiguration{DetectLocalMode: "ClusterCIDR", ClusterCIDR: "fd00:1::/64"}, fams: v4, nodePorts: []string{"198.18.1.1/32"},
			fatal: "cluster is IPv4-only but clusterCIDRs contains only IPv6 addresses"},
		{name: "the same on a dual-stack node: a warning",
			cfg: kpv1alpha1.KubeProxyConfiguration{DetectLocalMode: "ClusterCIDR", ClusterCIDR: "fd00:1::/64"}, fams: dual, nodePorts: []string{"198.18.1.1/32"},
			warnings: []string{"cluster is IPv4-primary but clusterCIDRs contains only IPv6 addresses"}},
		{name: "NodeCIDR mode, podCIDRs of the other family: fatal",
			cfg: kpv1alpha1.KubeProxyConfiguration{DetectLocalMode: "NodeCIDR"}, fams: dual, podCIDRs: []string{"fd00:2::/64"}, nodePorts: []string{"198.18.1.1/32"},
			fatal: "node.spec.podCIDRs contains only IPv6 addresses"},
		{name: "single-stack: a metrics address of the other family",
			cfg: kpv1alpha1.KubeProxyConfiguration{MetricsBindAddress: "[fd00::1]:10249", HealthzBindAddress: "0.0.0.0:10256"}, fams: v4, nodePorts: []string{"198.18.1.1/32"},
			warnings: []string{"cluster is IPv4-only but metricsBindAddress is IPv6"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			warnings, fatal := checkConfig(&tc.cfg, model.IPv4, tc.fams, tc.podCIDRs, tc.nodePorts)
			if len(warnings) != len(tc.warnings) {
				t.Fatalf("warnings %v, want %q", warnings, tc.warnings)
			}
			for i, w := range warnings {
				if !strings.Contains(w.Error(), tc.warnings[i]) {
					t.Errorf("warning %q, want %q", w, tc.warnings[i])
				}
			}
			if (fatal != nil) != (tc.fatal != "") || (fatal != nil && !strings.Contains(fatal.Error(), tc.fatal)) {
				t.Errorf("fatal %v, want %q", fatal, tc.fatal)
			}
		})
	}
}
