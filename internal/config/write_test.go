package config

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/equality"
	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// TestWriteConfigGolden writes the effective configuration of a few command
// lines, compares it with testdata, and checks that upstream's types decode
// the file back to the same configuration.
func TestWriteConfigGolden(t *testing.T) {
	tests := []struct {
		golden string
		args   []string
	}{
		{"write-config-default.yaml", nil},
		{"write-config-nftables.yaml", []string{"--proxy-mode=nftables", "--masquerade-all", "--iptables-sync-period=10s",
			"--cluster-cidr=198.18.0.0/16,fd00::/64", "--hostname-override=Node-1", "--conntrack-max-per-core=0",
			"--feature-gates=LoggingBetaOptions=true", "-v=3", "--metrics-bind-address=0.0.0.0:10249"}},
		{"write-config-ipvs.yaml", []string{"--proxy-mode=ipvs", "--ipvs-scheduler=wrr", "--ipvs-exclude-cidrs=198.18.0.0/24",
			"--ipvs-strict-arp", "--bind-address=fd00::1", "--detect-local-mode=BridgeInterface", "--pod-bridge-interface=cbr0"}},
	}
	for _, tc := range tests {
		t.Run(tc.golden, func(t *testing.T) {
			o := mustLoad(t, append(tc.args, "--write-config-to=unused")...)
			path := filepath.Join(t.TempDir(), "out.yaml")
			if err := WriteConfig(path, o.Config); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			compareGolden(t, filepath.Join("testdata", tc.golden), got)
			checkRoundTrip(t, got, o.Config)
		})
	}
}

func compareGolden(t *testing.T, golden string, got []byte) {
	t.Helper()
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs (run go test -update after checking):\n--- got\n%s", golden, got)
	}
}

// checkRoundTrip decodes data two ways, through this package's strict
// decoder and through plain strict YAML into the upstream type, and wants
// the effective configuration back once defaulted (the file leaves the
// sync periods of the modes not selected unset, as upstream writes it).
func checkRoundTrip(t *testing.T, data []byte, want *kpv1alpha1.KubeProxyConfiguration) {
	t.Helper()
	decoded, warnings, err := Decode(data)
	if err != nil || len(warnings) != 0 {
		t.Fatalf("Decode: %v %q", err, warnings)
	}
	var plain kpv1alpha1.KubeProxyConfiguration
	if err := yaml.UnmarshalStrict(data, &plain); err != nil {
		t.Fatalf("strict YAML into the upstream type: %v", err)
	}
	for name, got := range map[string]*kpv1alpha1.KubeProxyConfiguration{"Decode": decoded, "yaml": &plain} {
		Default(got)
		if !equality.Semantic.DeepEqual(want, got) {
			t.Errorf("%s round trip differs:\nwant %+v\ngot  %+v", name, want, got)
		}
	}
}

func TestEncodeDoesNotModify(t *testing.T) {
	cfg := &kpv1alpha1.KubeProxyConfiguration{Mode: "nftables"}
	if _, err := Encode(cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.APIVersion != "" || cfg.Kind != "" {
		t.Errorf("Encode changed its input: %+v", cfg.TypeMeta)
	}
	if err := WriteConfig(filepath.Join(t.TempDir(), "missing", "x.yaml"), cfg); err == nil {
		t.Error("write into a missing directory succeeded")
	}
}

// TestKubeadmConfig loads the config file kubeadm deploys (every field
// present, mostly zero, mode "") and wants upstream's effective
// configuration: testdata/write-config-kubeadm.yaml is what upstream
// kube-proxy v1.36.3 writes for it, regenerated with
//
//	kube-proxy --config=testdata/kubeadm-config.yaml --hostname-override=node-1 \
//	  --write-config-to=testdata/write-config-kubeadm.yaml
func TestKubeadmConfig(t *testing.T) {
	o := mustLoad(t, "--config=testdata/kubeadm-config.yaml", "--hostname-override=node-1", "--write-config-to=unused")
	if len(o.Warnings) != 0 {
		t.Errorf("warnings: %q", o.Warnings)
	}
	c := o.Config
	got := []any{string(c.Mode), c.ClientConnection.Kubeconfig, string(c.DetectLocalMode), c.NodePortAddresses,
		c.IPTables.SyncPeriod.Duration, *c.IPTables.MasqueradeBit, o.NodeName}
	want := []any{"iptables", "/var/lib/kube-proxy/kubeconfig.conf", "ClusterCIDR", []string(nil),
		30 * time.Second, int32(14), "node-1"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got)\n%s", diff)
	}
	data, err := Encode(c)
	if err != nil {
		t.Fatal(err)
	}
	compareGolden(t, filepath.Join("testdata", "write-config-kubeadm.yaml"), data)
	checkRoundTrip(t, data, c)
}

// TestCanonical checks what /configz and --write-config-to show: upstream
// v1.36.3's /configz for --proxy-mode=nftables has the iptables and ipvs
// sync periods at 0s.
func TestCanonical(t *testing.T) {
	o := mustLoad(t, "--proxy-mode=nftables")
	c := Canonical(o.Config)
	got := []any{c.APIVersion, c.Kind, c.IPTables.SyncPeriod.Duration, c.IPTables.MinSyncPeriod.Duration, c.IPVS.SyncPeriod.Duration,
		c.NFTables.SyncPeriod.Duration, c.NFTables.MinSyncPeriod.Duration, o.Config.IPTables.SyncPeriod.Duration}
	want := []any{"kubeproxy.config.k8s.io/v1alpha1", "KubeProxyConfiguration", time.Duration(0), time.Duration(0), time.Duration(0),
		30 * time.Second, time.Second, 30 * time.Second}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got)\n%s", diff)
	}
}

// TestCanonicalDropsPortRange: upstream's internal configuration has no
// portRange, so its --write-config-to writes it empty.
func TestCanonicalDropsPortRange(t *testing.T) {
	o := mustLoad(t)
	o.Config.PortRange = "30000-32767"
	if got := Canonical(o.Config).PortRange; got != "" {
		t.Errorf("portRange = %q, want empty", got)
	}
	if o.Config.PortRange == "" {
		t.Errorf("Canonical changed its argument")
	}
}
