package config

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

const header = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"

func TestDecode(t *testing.T) {
	tests := []struct {
		name     string
		data     string
		warnings []string // each warning must contain this
		err      string
		mode     string
	}{
		{name: "strict yaml", data: header + "mode: nftables\n", mode: "nftables"},
		{name: "json", data: `{"apiVersion":"kubeproxy.config.k8s.io/v1alpha1","kind":"KubeProxyConfiguration","mode":"ipvs"}`, mode: "ipvs"},
		{name: "unknown top-level field", data: header + "mode: nftables\nmasqueradeBitt: 3\n", mode: "nftables",
			warnings: []string{`unknown field "masqueradeBitt"`}},
		{name: "unknown nested fields", data: header + "iptables:\n  masqueradeBitt: 3\nconntrack:\n  mn: 1\n",
			warnings: []string{`unknown field "conntrack.mn"`, `unknown field "iptables.masqueradeBitt"`}},
		{name: "duplicate field", data: header + "mode: ipvs\nmode: nftables\n", mode: "nftables",
			warnings: []string{`"mode" already set`}},
		{name: "wrong kind", data: "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeletConfiguration\n", err: `no kind "KubeletConfiguration" is registered`},
		{name: "wrong version", data: "apiVersion: kubeproxy.config.k8s.io/v1beta1\nkind: KubeProxyConfiguration\n", err: "no kind"},
		{name: "no apiVersion", data: "kind: KubeProxyConfiguration\n", err: "apiVersion"},
		{name: "empty", data: "", err: "failed to decode"},
		{name: "malformed yaml", data: header + "mode: [\n", err: "failed to decode"},
		{name: "wrong type", data: header + "oomScoreAdj: lots\n", err: "failed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, warnings, err := Decode([]byte(tc.data))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want it to contain %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if string(cfg.Mode) != tc.mode {
				t.Errorf("mode = %q, want %q", cfg.Mode, tc.mode)
			}
			if len(warnings) != len(tc.warnings) {
				t.Fatalf("warnings = %q, want %d", warnings, len(tc.warnings))
			}
			for i, w := range tc.warnings {
				if !strings.Contains(warnings[i], w) {
					t.Errorf("warning %d = %q, want it to contain %q", i, warnings[i], w)
				}
			}
		})
	}
}

func TestLoadFileDefaults(t *testing.T) {
	path := writeFile(t, "c.yaml", header+"mode: ipvs\nbindAddress: \"::\"\n")
	cfg, warnings, err := LoadFile(path)
	if err != nil || len(warnings) != 0 {
		t.Fatalf("LoadFile: %v %q", err, warnings)
	}
	// Upstream gives ipvs.minSyncPeriod no default, and derives the server
	// addresses from an IPv6 bindAddress.
	got := []any{cfg.IPVS.SyncPeriod.Duration, cfg.IPVS.MinSyncPeriod.Duration, cfg.HealthzBindAddress, cfg.MetricsBindAddress}
	want := []any{30 * time.Second, time.Duration(0), "[::]:10256", "[::1]:10249"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got)\n%s", diff)
	}
	if _, _, err := LoadFile(path + ".missing"); err == nil {
		t.Error("missing file accepted")
	}
}

// TestConfigFilePrecedence checks upstream v1.36's rules: with --config the
// file wins over every flag except the logging flags, --hostname-override
// and the command flags; each ignored flag gets a warning.
func TestConfigFilePrecedence(t *testing.T) {
	path := writeFile(t, "c.yaml", header+`mode: nftables
hostnameOverride: from-file
metricsBindAddress: 198.18.0.1
logging:
  verbosity: 2
  vmodule:
  - {filePattern: file, verbosity: 1}
featureGates:
  ContextualLogging: false
nftables:
  syncPeriod: 20s
`)
	o := mustLoad(t, "--config="+path, "--proxy-mode=iptables", "--iptables-sync-period=5s", "--metrics-port=1",
		"--feature-gates=ContextualLogging=true", "-v=5", "--vmodule=flag=3", "--master=https://198.18.0.1", "--source-file=/s",
		// kproxy's own flags count (the file has no field for them), unwarned.
		"--debug-bind-address=127.0.0.1:10259", "--load-balancing=round-robin", "--service-traffic-metrics", "--iptables-netlink-writer=false")
	c := o.Config
	got := []any{string(c.Mode), c.NFTables.SyncPeriod.Duration, c.MetricsBindAddress, c.FeatureGates["ContextualLogging"],
		uint32(c.Logging.Verbosity), len(c.Logging.VModule), c.Logging.VModule[0].FilePattern, c.HostnameOverride, o.NodeName,
		o.Master, o.SourceFile, c.NodePortAddresses, o.DebugBindAddress, o.LoadBalancing, o.ServiceTrafficMetrics, o.NoIPTablesNetlink}
	want := []any{"nftables", 20 * time.Second, "198.18.0.1:10249", false,
		uint32(5), 2, "flag", "from-file", "from-file",
		"https://198.18.0.1", "/s", []string{"primary"}, "127.0.0.1:10259", "round-robin", true, true}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got)\n%s", diff)
	}
	var ignored []string
	for _, w := range o.Warnings {
		if strings.Contains(w, "is ignored because --config is given") {
			ignored = append(ignored, strings.Fields(w)[1])
		}
	}
	wantIgnored := []string{"--feature-gates", "--iptables-sync-period", "--metrics-port", "--proxy-mode"}
	if diff := cmp.Diff(wantIgnored, ignored); diff != "" {
		t.Errorf("ignored-flag warnings (-want +got)\n%s\nall: %q", diff, o.Warnings)
	}

	o = mustLoad(t, "--config="+path, "--hostname-override=From-Flag")
	if o.Config.HostnameOverride != "from-flag" || o.NodeName != "from-flag" {
		t.Errorf("hostname override = %q/%q, want the flag to win", o.Config.HostnameOverride, o.NodeName)
	}
}

func TestConfigFileErrors(t *testing.T) {
	bad := writeFile(t, "bad.yaml", "apiVersion: v1\nkind: ConfigMap\n")
	if _, err := load(t, "--config="+bad); err == nil || !strings.Contains(err.Error(), "bad.yaml") {
		t.Errorf("wrong kind: err = %v, want one naming the file", err)
	}
	typo := writeFile(t, "typo.yaml", header+"iptables:\n  masqueradeBitt: 3\n")
	o := mustLoad(t, "--config="+typo)
	if len(o.Warnings) != 1 || !strings.Contains(o.Warnings[0], `unknown field "iptables.masqueradeBitt"`) {
		t.Errorf("warnings = %q, want one naming iptables.masqueradeBitt", o.Warnings)
	}
}
