package config

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
	"k8s.io/utils/ptr"
)

func TestValidateDefaults(t *testing.T) {
	for _, mode := range []string{"", ModeIPTables, ModeIPVS, ModeNFTables} {
		cfg := &kpv1alpha1.KubeProxyConfiguration{Mode: kpv1alpha1.ProxyMode(mode)}
		Default(cfg)
		if errs := Validate(cfg); len(errs) != 0 {
			t.Errorf("mode %q: defaults invalid: %v", mode, errs)
		}
	}
}

// TestValidate changes one field of a valid config per case and checks the
// problem reported, by its field path.
func TestValidate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(c *kpv1alpha1.KubeProxyConfiguration)
		want   []string // field paths, in order
	}{
		{"iptables masquerade bit", func(c *kpv1alpha1.KubeProxyConfiguration) { c.IPTables.MasqueradeBit = ptr.To[int32](32) }, []string{"iptables.masqueradeBit"}},
		{"negative masquerade bit", func(c *kpv1alpha1.KubeProxyConfiguration) { c.IPTables.MasqueradeBit = ptr.To[int32](-1) }, []string{"iptables.masqueradeBit"}},
		{"nftables bit ignored in iptables mode", func(c *kpv1alpha1.KubeProxyConfiguration) { c.NFTables.MasqueradeBit = ptr.To[int32](99) }, nil},
		{"nftables bit in nftables mode", func(c *kpv1alpha1.KubeProxyConfiguration) {
			c.Mode = ModeNFTables
			c.NFTables.MasqueradeBit = ptr.To[int32](99)
		}, []string{"nftables.masqueradeBit"}},
		{"sync period zero", func(c *kpv1alpha1.KubeProxyConfiguration) { c.IPTables.SyncPeriod.Duration = 0 }, []string{"iptables.syncPeriod", "iptables.syncPeriod"}},
		{"min sync negative", func(c *kpv1alpha1.KubeProxyConfiguration) { c.IPTables.MinSyncPeriod.Duration = -time.Second }, []string{"iptables.minSyncPeriod"}},
		{"min sync above sync", func(c *kpv1alpha1.KubeProxyConfiguration) { c.IPTables.MinSyncPeriod.Duration = time.Hour }, []string{"iptables.syncPeriod"}},
		{"other modes' periods ignored", func(c *kpv1alpha1.KubeProxyConfiguration) { c.IPVS.SyncPeriod.Duration = -1 }, nil},
		{"ipvs periods in ipvs mode", func(c *kpv1alpha1.KubeProxyConfiguration) {
			c.Mode = ModeIPVS
			c.IPVS.MinSyncPeriod.Duration = time.Hour
		}, []string{"ipvs.syncPeriod"}},
		{"ipvs section", func(c *kpv1alpha1.KubeProxyConfiguration) {
			c.Mode = ModeIPVS
			c.IPVS.TCPTimeout.Duration = -1
			c.IPVS.TCPFinTimeout.Duration = -1
			c.IPVS.UDPTimeout.Duration = -1
			c.IPVS.ExcludeCIDRs = []string{"198.18.0.0/15", "bad"}
			c.IPVS.Scheduler = "fancy"
		}, []string{"ipvs.tcpTimeout", "ipvs.tcpFinTimeout", "ipvs.udpTimeout", "ipvs.excludeCIDRs[1]", "ipvs.scheduler"}},
		{"config sync period", func(c *kpv1alpha1.KubeProxyConfiguration) { c.ConfigSyncPeriod.Duration = 0 }, []string{"configSyncPeriod"}},
		{"conntrack", func(c *kpv1alpha1.KubeProxyConfiguration) {
			c.Conntrack.MaxPerCore = ptr.To[int32](-1)
			c.Conntrack.Min = ptr.To[int32](-1)
			c.Conntrack.TCPEstablishedTimeout = &metav1.Duration{Duration: -1}
			c.Conntrack.TCPCloseWaitTimeout = &metav1.Duration{Duration: -1}
			c.Conntrack.UDPTimeout.Duration = -1
			c.Conntrack.UDPStreamTimeout.Duration = -1
		}, []string{"conntrack.maxPerCore", "conntrack.min", "conntrack.tcpEstablishedTimeout", "conntrack.tcpCloseWaitTimeout", "conntrack.udpTimeout", "conntrack.udpStreamTimeout"}},
		{"oom score adj", func(c *kpv1alpha1.KubeProxyConfiguration) { c.OOMScoreAdj = ptr.To[int32](-1001) }, []string{"oomScoreAdj"}},
		{"mode", func(c *kpv1alpha1.KubeProxyConfiguration) { c.Mode = "kernelspace" }, []string{"mode"}},
		{"burst", func(c *kpv1alpha1.KubeProxyConfiguration) { c.ClientConnection.Burst = -1 }, []string{"clientConnection.burst"}},
		{"bind address", func(c *kpv1alpha1.KubeProxyConfiguration) { c.BindAddress = "host" }, []string{"bindAddress"}},
		{"healthz empty is allowed", func(c *kpv1alpha1.KubeProxyConfiguration) { c.HealthzBindAddress = "" }, nil},
		{"metrics empty is not", func(c *kpv1alpha1.KubeProxyConfiguration) { c.MetricsBindAddress = "" }, []string{"metricsBindAddress"}},
		{"server addresses", func(c *kpv1alpha1.KubeProxyConfiguration) {
			c.HealthzBindAddress = "host:1"
			c.MetricsBindAddress = "1.2.3.4:0"
		}, []string{"healthzBindAddress", "metricsBindAddress"}},
		{"nodeport addresses", func(c *kpv1alpha1.KubeProxyConfiguration) {
			c.NodePortAddresses = []string{"198.18.0.0/15", "198.18.0.1", "fd00::/8"}
		}, []string{"nodePortAddresses[1]"}},
		{"primary with cidrs", func(c *kpv1alpha1.KubeProxyConfiguration) { c.NodePortAddresses = []string{"198.18.0.0/15", "primary"} }, []string{"nodePortAddresses[1]"}},
		{"primary alone", func(c *kpv1alpha1.KubeProxyConfiguration) { c.NodePortAddresses = []string{"primary"} }, nil},
		{"hidden metrics version", func(c *kpv1alpha1.KubeProxyConfiguration) { c.ShowHiddenMetricsForVersion = "1.30" }, []string{"showHiddenMetricsForVersion"}},
		{"hidden metrics previous minor", func(c *kpv1alpha1.KubeProxyConfiguration) { c.ShowHiddenMetricsForVersion = "1.35" }, nil},
		{"detect local mode", func(c *kpv1alpha1.KubeProxyConfiguration) { c.DetectLocalMode = "Magic" }, []string{"detectLocalMode"}},
		{"bridge needs interface", func(c *kpv1alpha1.KubeProxyConfiguration) { c.DetectLocalMode = LocalModeBridgeInterface }, []string{"detectLocal.bridgeInterface"}},
		{"prefix needs prefix", func(c *kpv1alpha1.KubeProxyConfiguration) { c.DetectLocalMode = LocalModeInterfaceNamePrefix }, []string{"detectLocal.interfaceNamePrefix"}},
		{"node cidr needs nothing", func(c *kpv1alpha1.KubeProxyConfiguration) { c.DetectLocalMode = LocalModeNodeCIDR }, nil},
		{"cluster cidr", func(c *kpv1alpha1.KubeProxyConfiguration) { c.ClusterCIDR = "198.18.0.0/33" }, []string{"clusterCIDR[0]"}},
		{"cluster cidr dual stack pair", func(c *kpv1alpha1.KubeProxyConfiguration) { c.ClusterCIDR = "198.18.0.0/16,fd00::/64" }, nil},
		{"cluster cidr same family pair", func(c *kpv1alpha1.KubeProxyConfiguration) { c.ClusterCIDR = "198.18.0.0/16,198.19.0.0/16" }, []string{"clusterCIDR"}},
		{"cluster cidr three", func(c *kpv1alpha1.KubeProxyConfiguration) { c.ClusterCIDR = "198.18.0.0/16,fd00::/64,198.19.0.0/16" }, []string{"clusterCIDR"}},
		{"cluster cidr unused in other modes", func(c *kpv1alpha1.KubeProxyConfiguration) {
			c.DetectLocalMode = LocalModeNodeCIDR
			c.ClusterCIDR = "bad"
		}, nil},
		{"unknown feature gate", func(c *kpv1alpha1.KubeProxyConfiguration) { c.FeatureGates = map[string]bool{"NoSuchGate": true} }, []string{"featureGates"}},
		{"logging", func(c *kpv1alpha1.KubeProxyConfiguration) { c.Logging.Format = "xml" }, []string{"logging.format"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := NewDefault()
			tc.mutate(cfg)
			errs := Validate(cfg)
			var got []string
			for _, e := range errs {
				got = append(got, e.Field)
			}
			if strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Errorf("problems at %q, want %q\n%v", got, tc.want, errs)
			}
		})
	}
}

// TestValidateReportsEverything is the acceptance case: an invalid
// masqueradeBit and another problem are both reported, one per line.
func TestValidateReportsEverything(t *testing.T) {
	path := writeFile(t, "bad.yaml", header+"iptables:\n  masqueradeBit: 40\noomScoreAdj: 2000\nmetricsBindAddress: nowhere\n")
	_, err := load(t, "--config="+path)
	verr, ok := err.(*ValidationError)
	if !ok {
		t.Fatalf("err = %v, want *ValidationError", err)
	}
	lines := strings.Split(verr.Error(), "\n")[1:]
	want := []string{"iptables.masqueradeBit: Invalid value: 40", "oomScoreAdj: Invalid value: 2000", "metricsBindAddress: Invalid value: \"nowhere\""}
	if len(lines) != len(want) {
		t.Fatalf("lines = %q, want %d", lines, len(want))
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("line %d = %q, want prefix %q", i, lines[i], w)
		}
	}
}
