package config

import (
	"strings"
	"time"

	"github.com/spf13/pflag"
	cliflag "k8s.io/component-base/cli/flag"
	logsapi "k8s.io/component-base/logs/api/v1"
	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"

	"github.com/kproxy/kproxy/internal/model"
)

// ignoredWithConfig is appended to the help of flags that, as in upstream,
// are ignored when --config is given.
const ignoredWithConfig = " This parameter is ignored if a config file is specified by --config."

// Loader binds kube-proxy's command line flags and turns them, together
// with the --config file, into Options. Create it with NewLoader, register
// its flags with AddFlags, parse, then call Load.
type Loader struct {
	// cfg starts with upstream's API defaults; flags write into it.
	cfg  *kpv1alpha1.KubeProxyConfiguration
	opts Options
	fs   *pflag.FlagSet

	// Flags that do not map one to one onto the v1alpha1 file.
	hostnameOverride      string
	healthzPort           int32
	metricsPort           int32
	iptablesSyncPeriod    time.Duration
	iptablesMinSyncPeriod time.Duration
	ipvsSyncPeriod        time.Duration
	ipvsMinSyncPeriod     time.Duration
	clusterCIDRs          string
	masqueradeAll         bool
	iptablesNetlink       bool // --iptables-netlink-writer (kproxy)
	bootIDFile            string
	machineIDFile         string

	// hostname returns the host name (os.Hostname outside tests).
	hostname func() (string, error)
}

// NewLoader returns a Loader holding upstream's defaults. It has no side
// effects.
func NewLoader() *Loader {
	cfg := &kpv1alpha1.KubeProxyConfiguration{}
	setAPIDefaults(cfg)
	return &Loader{
		cfg:                   cfg,
		healthzPort:           DefaultHealthzPort,
		metricsPort:           DefaultMetricsPort,
		iptablesSyncPeriod:    DefaultSyncPeriod,
		iptablesMinSyncPeriod: DefaultMinSyncPeriod,
		ipvsSyncPeriod:        DefaultSyncPeriod,
		ipvsMinSyncPeriod:     DefaultMinSyncPeriod,
		hostname:              osHostname,
	}
}

// NewFlagSet returns a flag set named name with every kproxy flag bound to
// a new Loader, normalised as Kubernetes components do (`_` reads as `-`).
func NewFlagSet(name string) (*pflag.FlagSet, *Loader) {
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	fs.SetNormalizeFunc(cliflag.WordSepNormalizeFunc)
	l := NewLoader()
	l.AddFlags(fs)
	return fs, l
}

// AddFlags registers every Linux flag of upstream kube-proxy v1.36 (same
// names, types and defaults), the logging flags, and kproxy's extensions on
// fs, bound to l. Load later asks fs which flags were set.
func (l *Loader) AddFlags(fs *pflag.FlagSet) {
	l.fs = fs
	l.addCommandFlags(fs)
	l.addClientFlags(fs)
	l.addServerFlags(fs)
	l.addModeFlags(fs)
	l.addLocalFlags(fs)
	l.addConntrackFlags(fs)
	l.addDeprecatedFlags(fs)
	logsapi.AddFlags(&l.cfg.Logging, fs)
	l.addInheritedFlags(fs)
	l.addExtensionFlags(fs)
}

// addCommandFlags registers the flags that choose what the process does.
func (l *Loader) addCommandFlags(fs *pflag.FlagSet) {
	fs.StringVar(&l.opts.ConfigFile, "config", "", "The path to the configuration file.")
	fs.StringVar(&l.opts.WriteConfigTo, "write-config-to", "", "If set, write the default configuration values to this file and exit.")
	fs.BoolVar(&l.opts.CleanupAndExit, "cleanup", false, "If true cleanup iptables and ipvs rules and exit.")
	fs.BoolVar(&l.opts.InitOnly, "init-only", false, "If true, perform any initialization steps that must be done with full root privileges, and then exit. After doing this, you can run kube-proxy again with only the CAP_NET_ADMIN capability.")
	fs.Var(cliflag.NewMapStringBool(&l.cfg.FeatureGates), "feature-gates", "A set of key=value pairs that describe feature gates for alpha/experimental features. Options are:\n"+
		strings.Join(newFeatureGate().KnownFeatures(), "\n")+"\n"+
		"This parameter is ignored if a config file is specified by --config.")
	fs.StringVar(&l.hostnameOverride, "hostname-override", "", "If non-empty, will be used as the name of the Node that kube-proxy is running on. If unset, the node name is assumed to be the same as the node's hostname.")
}

// addClientFlags registers the API server connection flags.
func (l *Loader) addClientFlags(fs *pflag.FlagSet) {
	cc := &l.cfg.ClientConnection
	fs.StringVar(&cc.Kubeconfig, "kubeconfig", cc.Kubeconfig, "Path to kubeconfig file with authorization information (the master location can be overridden by the master flag).")
	fs.StringVar(&l.opts.Master, "master", "", "The address of the Kubernetes API server (overrides any value in kubeconfig)")
	fs.StringVar(&cc.ContentType, "kube-api-content-type", cc.ContentType, "Content type of requests sent to apiserver.")
	fs.Int32Var(&cc.Burst, "kube-api-burst", cc.Burst, "Burst to use while talking with kubernetes apiserver")
	fs.Float32Var(&cc.QPS, "kube-api-qps", cc.QPS, "QPS to use while talking with kubernetes apiserver")
	fs.DurationVar(&l.cfg.ConfigSyncPeriod.Duration, "config-sync-period", l.cfg.ConfigSyncPeriod.Duration, "How often configuration from the apiserver is refreshed.  Must be greater than 0.")
}

// addServerFlags registers the node address, healthz, metrics and process flags.
func (l *Loader) addServerFlags(fs *pflag.FlagSet) {
	c := l.cfg
	fs.Var(&ipValue{&c.BindAddress}, "bind-address", "Overrides kube-proxy's idea of what its node's primary IP is. Note that the name is a historical artifact, and kube-proxy does not actually bind any sockets to this IP."+ignoredWithConfig)
	fs.Var(&ipPortValue{&c.HealthzBindAddress}, "healthz-bind-address", "The IP address and port for the health check server to serve on, defaulting to \"0.0.0.0:10256\"."+ignoredWithConfig)
	fs.Var(&ipPortValue{&c.MetricsBindAddress}, "metrics-bind-address", "The IP address and port for the metrics server to serve on, defaulting to \"127.0.0.1:10249\". (Set to \"0.0.0.0:10249\" / \"[::]:10249\" to bind on all interfaces.) Set empty to disable."+ignoredWithConfig)
	fs.BoolVar(&c.BindAddressHardFail, "bind-address-hard-fail", c.BindAddressHardFail, "If true kube-proxy will treat failure to bind to a port as fatal and exit")
	fs.BoolVar(&c.EnableProfiling, "profiling", c.EnableProfiling, "If true enables profiling via web interface on /debug/pprof handler."+ignoredWithConfig)
	fs.StringVar(&c.ShowHiddenMetricsForVersion, "show-hidden-metrics-for-version", c.ShowHiddenMetricsForVersion,
		"The previous version for which you want to show hidden metrics. Only the previous minor version is meaningful, other values will not be allowed. "+
			"The format is <major>.<minor>, e.g.: '1.16'. The purpose of this format is make sure you have the opportunity to notice if the next release hides additional metrics, "+
			"rather than being surprised when they are permanently removed in the release after that."+ignoredWithConfig)
	fs.Int32Var(c.OOMScoreAdj, "oom-score-adj", *c.OOMScoreAdj, "The oom-score-adj value for kube-proxy process. Values must be within the range [-1000, 1000]."+ignoredWithConfig)
}

// addModeFlags registers --proxy-mode and the per-backend flags.
func (l *Loader) addModeFlags(fs *pflag.FlagSet) {
	c := l.cfg
	fs.Var(&stringValue{typeName: "ProxyMode", get: func() string { return string(c.Mode) }, set: func(s string) { c.Mode = kpv1alpha1.ProxyMode(s) }},
		"proxy-mode", "Which proxy mode to use: on Linux this can be 'iptables' (default), 'ipvs', or 'nftables'. On Windows the only supported value is 'kernelspace'."+ignoredWithConfig)
	fs.Int32Var(c.IPTables.MasqueradeBit, "iptables-masquerade-bit", *c.IPTables.MasqueradeBit, "If using the iptables or ipvs proxy mode, the bit of the fwmark space to mark packets requiring SNAT with.  Must be within the range [0, 31].")
	fs.BoolVar(&l.masqueradeAll, "masquerade-all", false, "SNAT all traffic sent via Service cluster IPs. This may be required with some CNI plugins. Only supported on Linux.")
	fs.BoolVar(c.IPTables.LocalhostNodePorts, "iptables-localhost-nodeports", *c.IPTables.LocalhostNodePorts, "If false, kube-proxy will disable the legacy behavior of allowing NodePort services to be accessed via localhost. (Applies only to iptables mode and IPv4; localhost NodePorts are never allowed with other proxy modes or with IPv6.)")
	fs.DurationVar(&l.iptablesSyncPeriod, "iptables-sync-period", l.iptablesSyncPeriod, "An interval (e.g. '5s', '1m', '2h22m') indicating how frequently various re-synchronizing and cleanup operations are performed. Must be greater than 0.")
	fs.DurationVar(&l.iptablesMinSyncPeriod, "iptables-min-sync-period", l.iptablesMinSyncPeriod, "The minimum period between iptables rule resyncs (e.g. '5s', '1m', '2h22m'). A value of 0 means every Service or EndpointSlice change will result in an immediate iptables resync.")
	fs.DurationVar(&l.ipvsSyncPeriod, "ipvs-sync-period", l.ipvsSyncPeriod, "An interval (e.g. '5s', '1m', '2h22m') indicating how frequently various re-synchronizing and cleanup operations are performed. Must be greater than 0.")
	fs.DurationVar(&l.ipvsMinSyncPeriod, "ipvs-min-sync-period", l.ipvsMinSyncPeriod, "The minimum period between IPVS rule resyncs (e.g. '5s', '1m', '2h22m'). A value of 0 means every Service or EndpointSlice change will result in an immediate IPVS resync.")
	ipvs := &c.IPVS
	fs.StringVar(&ipvs.Scheduler, "ipvs-scheduler", ipvs.Scheduler, "The ipvs scheduler type when proxy mode is ipvs")
	fs.StringSliceVar(&ipvs.ExcludeCIDRs, "ipvs-exclude-cidrs", ipvs.ExcludeCIDRs, "A comma-separated list of CIDRs which the ipvs proxier should not touch when cleaning up IPVS rules.")
	fs.BoolVar(&ipvs.StrictARP, "ipvs-strict-arp", ipvs.StrictARP, "Enable strict ARP by setting arp_ignore to 1 and arp_announce to 2")
	fs.DurationVar(&ipvs.TCPTimeout.Duration, "ipvs-tcp-timeout", ipvs.TCPTimeout.Duration, "The timeout for idle IPVS TCP connections, 0 to leave as-is. (e.g. '5s', '1m', '2h22m').")
	fs.DurationVar(&ipvs.TCPFinTimeout.Duration, "ipvs-tcpfin-timeout", ipvs.TCPFinTimeout.Duration, "The timeout for IPVS TCP connections after receiving a FIN packet, 0 to leave as-is. (e.g. '5s', '1m', '2h22m').")
	fs.DurationVar(&ipvs.UDPTimeout.Duration, "ipvs-udp-timeout", ipvs.UDPTimeout.Duration, "The timeout for IPVS UDP packets, 0 to leave as-is. (e.g. '5s', '1m', '2h22m').")
}

// addLocalFlags registers the local-traffic detection and NodePort flags.
func (l *Loader) addLocalFlags(fs *pflag.FlagSet) {
	c := l.cfg
	fs.Var(&stringValue{typeName: "LocalMode", get: func() string { return string(c.DetectLocalMode) }, set: func(s string) { c.DetectLocalMode = kpv1alpha1.LocalMode(s) }},
		"detect-local-mode", "Mode to use to detect local traffic."+ignoredWithConfig)
	fs.StringVar(&c.DetectLocal.BridgeInterface, "pod-bridge-interface", c.DetectLocal.BridgeInterface, "A bridge interface name. When --detect-local-mode is set to BridgeInterface, kube-proxy will consider traffic to be local if it originates from this bridge.")
	fs.StringVar(&c.DetectLocal.InterfaceNamePrefix, "pod-interface-name-prefix", c.DetectLocal.InterfaceNamePrefix, "An interface name prefix. When --detect-local-mode is set to InterfaceNamePrefix, kube-proxy will consider traffic to be local if it originates from any interface whose name begins with this prefix.")
	fs.StringVar(&l.clusterCIDRs, "cluster-cidr", c.ClusterCIDR, "The CIDR range of the pods in the cluster. (For dual-stack clusters, this can be a comma-separated dual-stack pair of CIDR ranges.). When --detect-local-mode is set to ClusterCIDR, kube-proxy will consider traffic to be local if its source IP is in this range. (Otherwise it is not used.)"+ignoredWithConfig)
	fs.StringSliceVar(&c.NodePortAddresses, "nodeport-addresses", c.NodePortAddresses,
		"A list of CIDR ranges that contain valid node IPs, or alternatively, the single string 'primary'. If set to a list of CIDRs, connections to NodePort services will only be accepted on node IPs in one of the indicated ranges. If set to 'primary', NodePort services will only be accepted on the node's primary IP(s) according to the Node object. If unset, NodePort connections will be accepted on all local IPs."+ignoredWithConfig)
}

// addConntrackFlags registers the conntrack sysctl flags.
func (l *Loader) addConntrackFlags(fs *pflag.FlagSet) {
	ct := &l.cfg.Conntrack
	fs.Int32Var(ct.MaxPerCore, "conntrack-max-per-core", *ct.MaxPerCore, "Maximum number of NAT connections to track per CPU core (0 to leave the limit as-is and ignore conntrack-min).")
	fs.Int32Var(ct.Min, "conntrack-min", *ct.Min, "Minimum number of conntrack entries to allocate, regardless of conntrack-max-per-core (set conntrack-max-per-core=0 to leave the limit as-is).")
	fs.DurationVar(&ct.TCPEstablishedTimeout.Duration, "conntrack-tcp-timeout-established", ct.TCPEstablishedTimeout.Duration, "Idle timeout for established TCP connections (0 to leave as-is)")
	fs.DurationVar(&ct.TCPCloseWaitTimeout.Duration, "conntrack-tcp-timeout-close-wait", ct.TCPCloseWaitTimeout.Duration, "NAT timeout for TCP connections in the CLOSE_WAIT state")
	fs.BoolVar(&ct.TCPBeLiberal, "conntrack-tcp-be-liberal", ct.TCPBeLiberal, "Enable liberal mode for tracking TCP packets by setting nf_conntrack_tcp_be_liberal to 1")
	fs.DurationVar(&ct.UDPTimeout.Duration, "conntrack-udp-timeout", ct.UDPTimeout.Duration, "Idle timeout for UNREPLIED UDP connections (0 to leave as-is)")
	fs.DurationVar(&ct.UDPStreamTimeout.Duration, "conntrack-udp-timeout-stream", ct.UDPStreamTimeout.Duration, "Idle timeout for ASSURED UDP connections (0 to leave as-is)")
}

// addDeprecatedFlags registers --healthz-port and --metrics-port, hidden
// from --help as upstream's are.
func (l *Loader) addDeprecatedFlags(fs *pflag.FlagSet) {
	fs.Int32Var(&l.healthzPort, "healthz-port", l.healthzPort, "The port to bind the health check server. Use 0 to disable.")
	_ = fs.MarkDeprecated("healthz-port", "This flag is deprecated and will be removed in a future release. Please use --healthz-bind-address instead.")
	fs.Int32Var(&l.metricsPort, "metrics-port", l.metricsPort, "The port to bind the metrics server. Use 0 to disable.")
	_ = fs.MarkDeprecated("metrics-port", "This flag is deprecated and will be removed in a future release. Please use --metrics-bind-address instead.")
}

// addInheritedFlags registers flags the upstream binary inherits from
// libraries it links (machine and boot id lookup). kube-proxy never uses
// them; kproxy accepts them so that existing command lines keep working.
func (l *Loader) addInheritedFlags(fs *pflag.FlagSet) {
	fs.StringVar(&l.bootIDFile, "boot-id-file", "/proc/sys/kernel/random/boot_id", "Comma-separated list of files to check for boot-id. Use the first one that exists.")
	fs.StringVar(&l.machineIDFile, "machine-id-file", "/etc/machine-id,/var/lib/dbus/machine-id", "Comma-separated list of files to check for machine-id. Use the first one that exists.")
}

// addExtensionFlags registers kproxy's own flags (not in upstream).
func (l *Loader) addExtensionFlags(fs *pflag.FlagSet) {
	ext := pflag.NewFlagSet("kproxy", pflag.ContinueOnError)
	ext.StringVar(&l.opts.SourceFile, "source-file", "", "[kproxy] Read Services, EndpointSlices and Nodes from this multi-document YAML file instead of the Kubernetes API; the file is re-read when it changes.")
	ext.BoolVar(&l.opts.DryRun, "dry-run", false, "[kproxy] Print what the proxy mode would program after the first complete sync instead of changing the kernel, then exit.")
	ext.StringVar(&l.opts.DebugBindAddress, "debug-bind-address", "", "[kproxy] Serve the debug endpoint (kproxy inspect, kproxy explain --debug-address) on this loopback IP:port, e.g. 127.0.0.1:10259; off when empty.")
	ext.BoolVar(&l.iptablesNetlink, "iptables-netlink-writer", true, "[kproxy] In iptables mode on the nf_tables backend, write rules straight over netlink in iptables-nft's encoding when the installed iptables-nft is a version that writer was proven against and the kernel has every xtables module it uses; false: always iptables-restore.")
	ext.StringVar(&l.opts.LoadBalancing, "load-balancing", "random", "[kproxy] How Services without the kproxy.io/load-balancing annotation pick an endpoint: "+strings.Join(model.BalancingNames(), ", ")+". Each proxy mode supports some (see the README); random is upstream's behaviour.")
	ext.BoolVar(&l.opts.ServiceTrafficMetrics, "service-traffic-metrics", false, "[kproxy] Count new connections, packets and bytes per Service port (nftables and iptables modes) and export them on the metrics address as kproxy_service_* metrics.")
	ext.VisitAll(func(f *pflag.Flag) { f.Annotations = map[string][]string{extensionAnnotation: {"true"}} })
	fs.AddFlagSet(ext)
}

// extensionAnnotation marks kproxy's own flags: the configuration file has
// no field for them, so they count with --config too.
const extensionAnnotation = "kproxy.io/extension"
