package config

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
)

// load parses args like main does, with a fixed host name.
func load(t *testing.T, args ...string) (*Options, error) {
	t.Helper()
	fs, l := NewFlagSet("kproxy")
	l.hostname = func() (string, error) { return "Test-Host ", nil }
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	return l.Load()
}

func mustLoad(t *testing.T, args ...string) *Options {
	t.Helper()
	o, err := load(t, args...)
	if err != nil {
		t.Fatalf("Load(%q): %v", args, err)
	}
	return o
}

// TestFlagDefaults compares the configuration with no flags to upstream
// kube-proxy v1.36.3's values, written out here on purpose (not taken from
// the constants under test).
func TestFlagDefaults(t *testing.T) {
	o := mustLoad(t)
	c := o.Config
	checks := []struct {
		name      string
		got, want any
	}{
		{"apiVersion", c.APIVersion, "kubeproxy.config.k8s.io/v1alpha1"},
		{"kind", c.Kind, "KubeProxyConfiguration"},
		{"mode", string(c.Mode), "iptables"},
		{"bindAddress", c.BindAddress, "0.0.0.0"},
		{"healthzBindAddress", c.HealthzBindAddress, "0.0.0.0:10256"},
		{"metricsBindAddress", c.MetricsBindAddress, "127.0.0.1:10249"},
		{"bindAddressHardFail", c.BindAddressHardFail, false},
		{"enableProfiling", c.EnableProfiling, false},
		{"hostnameOverride", c.HostnameOverride, ""},
		{"oomScoreAdj", *c.OOMScoreAdj, int32(-999)},
		{"iptables.masqueradeBit", *c.IPTables.MasqueradeBit, int32(14)},
		{"iptables.masqueradeAll", c.IPTables.MasqueradeAll, false},
		{"iptables.localhostNodePorts", *c.IPTables.LocalhostNodePorts, true},
		{"iptables.syncPeriod", c.IPTables.SyncPeriod.Duration, 30 * time.Second},
		{"iptables.minSyncPeriod", c.IPTables.MinSyncPeriod.Duration, time.Second},
		{"ipvs.scheduler", c.IPVS.Scheduler, ""},
		{"ipvs.tcpTimeout", c.IPVS.TCPTimeout.Duration, time.Duration(0)},
		{"nftables.masqueradeBit", *c.NFTables.MasqueradeBit, int32(14)},
		{"nftables.syncPeriod", c.NFTables.SyncPeriod.Duration, 30 * time.Second},
		{"nftables.minSyncPeriod", c.NFTables.MinSyncPeriod.Duration, time.Second},
		{"conntrack.maxPerCore", *c.Conntrack.MaxPerCore, int32(32768)},
		{"conntrack.min", *c.Conntrack.Min, int32(131072)},
		{"conntrack.tcpEstablishedTimeout", c.Conntrack.TCPEstablishedTimeout.Duration, 24 * time.Hour},
		{"conntrack.tcpCloseWaitTimeout", c.Conntrack.TCPCloseWaitTimeout.Duration, time.Hour},
		{"conntrack.tcpBeLiberal", c.Conntrack.TCPBeLiberal, false},
		{"conntrack.udpTimeout", c.Conntrack.UDPTimeout.Duration, time.Duration(0)},
		{"conntrack.udpStreamTimeout", c.Conntrack.UDPStreamTimeout.Duration, time.Duration(0)},
		{"configSyncPeriod", c.ConfigSyncPeriod.Duration, 15 * time.Minute},
		{"clientConnection.contentType", c.ClientConnection.ContentType, "application/vnd.kubernetes.protobuf"},
		{"clientConnection.qps", c.ClientConnection.QPS, float32(5)},
		{"clientConnection.burst", c.ClientConnection.Burst, int32(10)},
		{"clientConnection.kubeconfig", c.ClientConnection.Kubeconfig, ""},
		{"detectLocalMode", string(c.DetectLocalMode), "ClusterCIDR"},
		{"clusterCIDR", c.ClusterCIDR, ""},
		{"nodePortAddresses", len(c.NodePortAddresses), 0},
		{"featureGates", len(c.FeatureGates), 0},
		{"logging.format", c.Logging.Format, "text"},
		{"logging.flushFrequency", c.Logging.FlushFrequency.Duration.Duration, 5 * time.Second},
		{"logging.verbosity", uint32(c.Logging.Verbosity), uint32(0)},
		{"nodeName", o.NodeName, "test-host"},
	}
	for _, tc := range checks {
		if diff := cmp.Diff(tc.want, tc.got); diff != "" {
			t.Errorf("%s: (-upstream +got)\n%s", tc.name, diff)
		}
	}
	if len(o.Warnings) != 0 {
		t.Errorf("warnings with no flags: %q", o.Warnings)
	}
	if o.FeatureGate == nil {
		t.Error("no feature gate")
	}
}

// TestFlags checks each flag lands where upstream puts it.
func TestFlags(t *testing.T) {
	tests := []struct {
		name  string
		args  []string
		check func(c *kpv1alpha1.KubeProxyConfiguration) any
		want  any
	}{
		{"mode", []string{"--proxy-mode=nftables"}, func(c *kpv1alpha1.KubeProxyConfiguration) any { return c.Mode }, kpv1alpha1.ProxyMode("nftables")},
		{"nftables gets primary nodeport addresses", []string{"--proxy-mode=nftables"}, func(c *kpv1alpha1.KubeProxyConfiguration) any { return c.NodePortAddresses }, []string{"primary"}},
		{"nodeport addresses", []string{"--proxy-mode=nftables", "--nodeport-addresses=198.18.0.0/15,fd00::/8"}, func(c *kpv1alpha1.KubeProxyConfiguration) any { return c.NodePortAddresses }, []string{"198.18.0.0/15", "fd00::/8"}},
		{"iptables sync period", []string{"--iptables-sync-period=10s"}, func(c *kpv1alpha1.KubeProxyConfiguration) any { return c.IPTables.SyncPeriod.Duration }, 10 * time.Second},
		{"iptables flags feed nftables", []string{"--proxy-mode=nftables", "--iptables-sync-period=10s", "--iptables-min-sync-period=2s"},
			func(c *kpv1alpha1.KubeProxyConfiguration) any {
				return []time.Duration{c.NFTables.SyncPeriod.Duration, c.NFTables.MinSyncPeriod.Duration}
			}, []time.Duration{10 * time.Second, 2 * time.Second}},
		{"ipvs flags ignored outside ipvs", []string{"--ipvs-sync-period=10s"}, func(c *kpv1alpha1.KubeProxyConfiguration) any { return c.IPTables.SyncPeriod.Duration }, 30 * time.Second},
		{"ipvs flags in ipvs", []string{"--proxy-mode=ipvs", "--ipvs-sync-period=10s", "--iptables-sync-period=5s"},
			func(c *kpv1alpha1.KubeProxyConfiguration) any {
				return []time.Duration{c.IPVS.SyncPeriod.Duration, c.IPVS.MinSyncPeriod.Duration}
			}, []time.Duration{10 * time.Second, time.Second}},
		{"masquerade-all iptables", []string{"--masquerade-all"}, func(c *kpv1alpha1.KubeProxyConfiguration) any { return c.IPTables.MasqueradeAll }, true},
		{"masquerade-all nftables", []string{"--masquerade-all", "--proxy-mode=nftables"}, func(c *kpv1alpha1.KubeProxyConfiguration) any {
			return []bool{c.NFTables.MasqueradeAll, c.IPTables.MasqueradeAll}
		}, []bool{true, false}},
		{"masquerade bit", []string{"--iptables-masquerade-bit=3"}, func(c *kpv1alpha1.KubeProxyConfiguration) any { return *c.IPTables.MasqueradeBit }, int32(3)},
		{"cluster cidr", []string{"--cluster-cidr=198.18.0.0/16,fd00::/64"}, func(c *kpv1alpha1.KubeProxyConfiguration) any { return c.ClusterCIDR }, "198.18.0.0/16,fd00::/64"},
		{"detect local", []string{"--detect-local-mode=InterfaceNamePrefix", "--pod-interface-name-prefix=veth"},
			func(c *kpv1alpha1.KubeProxyConfiguration) any {
				return string(c.DetectLocalMode) + "/" + c.DetectLocal.InterfaceNamePrefix
			}, "InterfaceNamePrefix/veth"},
		{"bridge", []string{"--detect-local-mode=BridgeInterface", "--pod-bridge-interface=cbr0"}, func(c *kpv1alpha1.KubeProxyConfiguration) any { return c.DetectLocal.BridgeInterface }, "cbr0"},
		{"bind address keeps default server addresses", []string{"--bind-address=fd00::1"}, func(c *kpv1alpha1.KubeProxyConfiguration) any {
			return []string{c.BindAddress, c.HealthzBindAddress, c.MetricsBindAddress}
		}, []string{"fd00::1", "0.0.0.0:10256", "127.0.0.1:10249"}},
		{"healthz ip gets the port", []string{"--healthz-bind-address=198.18.0.1"}, func(c *kpv1alpha1.KubeProxyConfiguration) any { return c.HealthzBindAddress }, "198.18.0.1:10256"},
		{"deprecated healthz port", []string{"--healthz-bind-address=198.18.0.1", "--healthz-port=1234"}, func(c *kpv1alpha1.KubeProxyConfiguration) any { return c.HealthzBindAddress }, "198.18.0.1:1234"},
		{"deprecated healthz port 0 disables", []string{"--healthz-port=0"}, func(c *kpv1alpha1.KubeProxyConfiguration) any { return c.HealthzBindAddress }, ""},
		{"empty metrics address keeps the default", []string{"--metrics-bind-address="}, func(c *kpv1alpha1.KubeProxyConfiguration) any { return c.MetricsBindAddress }, "127.0.0.1:10249"},
		{"metrics ip:port", []string{"--metrics-bind-address=[::]:9999"}, func(c *kpv1alpha1.KubeProxyConfiguration) any { return c.MetricsBindAddress }, "[::]:9999"},
		{"client", []string{"--kube-api-qps=50", "--kube-api-burst=100", "--kube-api-content-type=application/json", "--kubeconfig=/k"},
			func(c *kpv1alpha1.KubeProxyConfiguration) any { return c.ClientConnection }, func() any {
				c := NewDefault().ClientConnection
				c.QPS, c.Burst, c.ContentType, c.Kubeconfig = 50, 100, "application/json", "/k"
				return c
			}()},
		{"conntrack", []string{"--conntrack-max-per-core=0", "--conntrack-min=7", "--conntrack-tcp-timeout-established=1h", "--conntrack-tcp-timeout-close-wait=2m", "--conntrack-tcp-be-liberal", "--conntrack-udp-timeout=30s", "--conntrack-udp-timeout-stream=2m"},
			func(c *kpv1alpha1.KubeProxyConfiguration) any {
				ct := c.Conntrack
				return []any{*ct.MaxPerCore, *ct.Min, ct.TCPEstablishedTimeout.Duration, ct.TCPCloseWaitTimeout.Duration, ct.TCPBeLiberal, ct.UDPTimeout.Duration, ct.UDPStreamTimeout.Duration}
			}, []any{int32(0), int32(7), time.Hour, 2 * time.Minute, true, 30 * time.Second, 2 * time.Minute}},
		{"ipvs", []string{"--proxy-mode=ipvs", "--ipvs-scheduler=wrr", "--ipvs-exclude-cidrs=198.18.0.0/24", "--ipvs-strict-arp", "--ipvs-tcp-timeout=1m", "--ipvs-tcpfin-timeout=2m", "--ipvs-udp-timeout=3m"},
			func(c *kpv1alpha1.KubeProxyConfiguration) any {
				v := c.IPVS
				return []any{v.Scheduler, v.ExcludeCIDRs, v.StrictARP, v.TCPTimeout.Duration, v.TCPFinTimeout.Duration, v.UDPTimeout.Duration}
			}, []any{"wrr", []string{"198.18.0.0/24"}, true, time.Minute, 2 * time.Minute, 3 * time.Minute}},
		{"misc", []string{"--oom-score-adj=-500", "--profiling", "--bind-address-hard-fail", "--config-sync-period=1m", "--iptables-localhost-nodeports=false", "--show-hidden-metrics-for-version=1.35"},
			func(c *kpv1alpha1.KubeProxyConfiguration) any {
				return []any{*c.OOMScoreAdj, c.EnableProfiling, c.BindAddressHardFail, c.ConfigSyncPeriod.Duration, *c.IPTables.LocalhostNodePorts, c.ShowHiddenMetricsForVersion}
			}, []any{int32(-500), true, true, time.Minute, false, "1.35"}},
		{"feature gates", []string{"--feature-gates=ContextualLogging=false"}, func(c *kpv1alpha1.KubeProxyConfiguration) any { return c.FeatureGates }, map[string]bool{"ContextualLogging": false}},
		{"logging", []string{"-v=4", "--vmodule=foo=2", "--log-flush-frequency=1s"}, func(c *kpv1alpha1.KubeProxyConfiguration) any {
			return []any{uint32(c.Logging.Verbosity), fmt.Sprint(c.Logging.VModule), c.Logging.Format}
		}, []any{uint32(4), "[{foo 2}]", "text"}},
		{"json logging", []string{"--logging-format=json"}, func(c *kpv1alpha1.KubeProxyConfiguration) any { return c.Logging.Format }, "json"},
		{"hostname override", []string{"--hostname-override= Node-A "}, func(c *kpv1alpha1.KubeProxyConfiguration) any { return c.HostnameOverride }, "node-a"},
		{"underscores normalised", []string{"--proxy_mode=nftables"}, func(c *kpv1alpha1.KubeProxyConfiguration) any { return c.Mode }, kpv1alpha1.ProxyMode("nftables")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := mustLoad(t, tc.args...)
			if diff := cmp.Diff(tc.want, tc.check(o.Config)); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
		})
	}
}

func TestExtensionAndCommandFlags(t *testing.T) {
	o := mustLoad(t, "--source-file=/s.yaml", "--dry-run", "--cleanup", "--init-only", "--master=https://198.18.0.1:6443", "--write-config-to=/w.yaml", "--hostname-override=N1", "--service-traffic-metrics")
	want := []any{"/s.yaml", true, true, true, "https://198.18.0.1:6443", "/w.yaml", "n1", true}
	got := []any{o.SourceFile, o.DryRun, o.CleanupAndExit, o.InitOnly, o.Master, o.WriteConfigTo, o.NodeName, o.ServiceTrafficMetrics}
	if mustLoad(t).ServiceTrafficMetrics {
		t.Errorf("--service-traffic-metrics is on by default")
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got)\n%s", diff)
	}
}

func TestFlagErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"bad ip", []string{"--bind-address=nope"}, "not a valid IP address"},
		{"bad ipport", []string{"--healthz-bind-address=1.2.3.4:x"}, "not a valid number"},
		{"bad duration", []string{"--iptables-sync-period=soon"}, "invalid argument"},
		{"unknown flag", []string{"--no-such-flag"}, "unknown flag"},
		{"blank hostname override", []string{"--hostname-override=  "}, "empty hostname-override is invalid"},
		{"unknown feature gate", []string{"--feature-gates=NoSuchGate=true"}, "unrecognized feature gate: NoSuchGate"},
		{"bad sync period", []string{"--iptables-sync-period=0"}, "iptables.syncPeriod"},
		{"bad mode", []string{"--proxy-mode=kernelspace"}, "mode: Invalid value: \"kernelspace\""},
		{"bad local mode", []string{"--detect-local-mode=Foo"}, "detectLocalMode: Unsupported value"},
		{"bad scheduler", []string{"--proxy-mode=ipvs", "--ipvs-scheduler=fancy"}, "ipvs.scheduler: Unsupported value"},
		{"bare metrics ip with --write-config-to, as upstream", []string{"--metrics-bind-address=0.0.0.0", "--write-config-to=/x"}, "must be IP:port"},
		{"explicitly empty cluster cidr, as upstream", []string{"--cluster-cidr="}, "clusterCIDR[0]"},
		{"metrics port 0 is invalid, as upstream", []string{"--metrics-port=0"}, "metricsBindAddress"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := load(t, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestLoadArgs(t *testing.T) {
	if _, err := Load([]string{"extra"}); err == nil {
		t.Error("positional argument accepted")
	}
	var verr *ValidationError
	if _, err := Load([]string{"--oom-score-adj=5000"}); !errors.As(err, &verr) {
		t.Errorf("Load(invalid) = %v, want a *ValidationError", err)
	}
}

// writeFile writes content to a temporary file and returns its path.
func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestFlagz: Options.Flagz shows every flag's value as given or defaulted,
// and a flag annotated "classified" as CLASSIFIED.
func TestFlagz(t *testing.T) {
	fs, l := NewFlagSet("kube-proxy")
	fs.String("secret", "", "")
	if err := fs.SetAnnotation("secret", "classified", []string{"true"}); err != nil {
		t.Fatal(err)
	}
	if err := fs.Parse([]string{"--metrics-bind-address=127.0.0.1:10249", "--secret=s3"}); err != nil {
		t.Fatal(err)
	}
	o, err := l.Load()
	if err != nil {
		t.Fatal(err)
	}
	got := o.Flagz()
	for name, want := range map[string]string{"metrics-bind-address": "127.0.0.1:10249", "secret": "CLASSIFIED", "cluster-cidr": ""} {
		if v, ok := got[name]; !ok || v != want {
			t.Errorf("flagz[%s] = %q (present %v), want %q", name, v, ok, want)
		}
	}
}
