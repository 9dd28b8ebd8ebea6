package config

import (
	"net"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	logsapi "k8s.io/component-base/logs/api/v1"
	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
	netutils "k8s.io/utils/net"
	"k8s.io/utils/ptr"
)

// Upstream kube-proxy v1.36 default values (pkg/proxy/apis/config/v1alpha1
// defaulting, pkg/cluster/ports, pkg/kubelet/qos).
const (
	DefaultBindAddress      = "0.0.0.0"
	DefaultHealthzPort      = 10256
	DefaultMetricsPort      = 10249
	DefaultOOMScoreAdj      = -999
	DefaultMasqueradeBit    = 14
	DefaultSyncPeriod       = 30 * time.Second
	DefaultMinSyncPeriod    = 1 * time.Second
	DefaultConntrackPerCore = 32 * 1024
	DefaultConntrackMin     = 128 * 1024
	DefaultTCPEstablished   = 24 * time.Hour
	DefaultTCPCloseWait     = 1 * time.Hour
	DefaultConfigSyncPeriod = 15 * time.Minute
	DefaultContentType      = "application/vnd.kubernetes.protobuf"
	DefaultQPS              = 5.0
	DefaultBurst            = 10
	DefaultProxyMode        = ModeIPTables
	DefaultDetectLocalMode  = LocalModeClusterCIDR
	// NodePortAddressesPrimary is the nodePortAddresses keyword for "the
	// node's primary IPs" (the nftables default).
	NodePortAddressesPrimary = "primary"
	// ConfigKind is the kind of the --config file.
	ConfigKind = "KubeProxyConfiguration"
)

// Default server hosts, by family of bindAddress.
const (
	defaultHealthzHostV4 = "0.0.0.0"
	defaultMetricsHostV4 = "127.0.0.1"
	defaultHealthzHostV6 = "::"
	defaultMetricsHostV6 = "::1"
)

// Proxy modes valid on Linux ("" means the default, iptables).
const (
	ModeIPTables = "iptables"
	ModeIPVS     = "ipvs"
	ModeNFTables = "nftables"
	// ModeUserspace is kproxy's extension: the proxy relays connections.
	ModeUserspace = "userspace"
)

// Local traffic detection modes.
const (
	LocalModeClusterCIDR         = "ClusterCIDR"
	LocalModeNodeCIDR            = "NodeCIDR"
	LocalModeBridgeInterface     = "BridgeInterface"
	LocalModeInterfaceNamePrefix = "InterfaceNamePrefix"
)

// NewDefault returns a KubeProxyConfiguration holding only upstream's
// defaults, with apiVersion and kind set.
func NewDefault() *kpv1alpha1.KubeProxyConfiguration {
	cfg := &kpv1alpha1.KubeProxyConfiguration{}
	Default(cfg)
	return cfg
}

// Default fills every unset field of cfg with upstream kube-proxy's value:
// first the v1alpha1 API defaults, then the Linux platform defaults (mode ""
// becomes iptables, nftables listens for NodePorts on the primary IPs only,
// detectLocalMode "" becomes ClusterCIDR). Set fields are left alone, so
// Default is idempotent.
func Default(cfg *kpv1alpha1.KubeProxyConfiguration) {
	setAPIDefaults(cfg)
	setPlatformDefaults(cfg)
}

// setAPIDefaults mirrors upstream's v1alpha1 defaulting: what a decoded
// file, or the starting point of the flags, gets.
func setAPIDefaults(cfg *kpv1alpha1.KubeProxyConfiguration) {
	cfg.APIVersion = kpv1alpha1.SchemeGroupVersion.String()
	cfg.Kind = ConfigKind
	if cfg.BindAddress == "" {
		cfg.BindAddress = DefaultBindAddress
	}
	healthzHost, metricsHost := defaultServerHosts(cfg.BindAddress)
	cfg.HealthzBindAddress = defaultHostPort(cfg.HealthzBindAddress, healthzHost, DefaultHealthzPort)
	cfg.MetricsBindAddress = defaultHostPort(cfg.MetricsBindAddress, metricsHost, DefaultMetricsPort)
	if cfg.OOMScoreAdj == nil {
		cfg.OOMScoreAdj = ptr.To[int32](DefaultOOMScoreAdj)
	}
	setModeDefaults(cfg)
	setConntrackDefaults(&cfg.Conntrack)
	defaultDuration(&cfg.ConfigSyncPeriod, DefaultConfigSyncPeriod)
	setClientDefaults(cfg)
	if cfg.FeatureGates == nil {
		cfg.FeatureGates = map[string]bool{}
	}
	logsapi.SetRecommendedLoggingConfiguration(&cfg.Logging)
}

// setModeDefaults defaults the per-mode sections. Note that upstream gives
// ipvs.minSyncPeriod no default (0).
func setModeDefaults(cfg *kpv1alpha1.KubeProxyConfiguration) {
	defaultDuration(&cfg.IPTables.SyncPeriod, DefaultSyncPeriod)
	defaultDuration(&cfg.IPTables.MinSyncPeriod, DefaultMinSyncPeriod)
	if cfg.IPTables.LocalhostNodePorts == nil {
		cfg.IPTables.LocalhostNodePorts = ptr.To(true)
	}
	if cfg.IPTables.MasqueradeBit == nil {
		cfg.IPTables.MasqueradeBit = ptr.To[int32](DefaultMasqueradeBit)
	}
	defaultDuration(&cfg.IPVS.SyncPeriod, DefaultSyncPeriod)
	defaultDuration(&cfg.NFTables.SyncPeriod, DefaultSyncPeriod)
	defaultDuration(&cfg.NFTables.MinSyncPeriod, DefaultMinSyncPeriod)
	if cfg.NFTables.MasqueradeBit == nil {
		cfg.NFTables.MasqueradeBit = ptr.To[int32](DefaultMasqueradeBit)
	}
}

func setConntrackDefaults(c *kpv1alpha1.KubeProxyConntrackConfiguration) {
	if c.MaxPerCore == nil {
		c.MaxPerCore = ptr.To[int32](DefaultConntrackPerCore)
	}
	if c.Min == nil {
		c.Min = ptr.To[int32](DefaultConntrackMin)
	}
	if c.TCPEstablishedTimeout == nil {
		c.TCPEstablishedTimeout = &metav1.Duration{Duration: DefaultTCPEstablished}
	}
	if c.TCPCloseWaitTimeout == nil {
		c.TCPCloseWaitTimeout = &metav1.Duration{Duration: DefaultTCPCloseWait}
	}
}

func setClientDefaults(cfg *kpv1alpha1.KubeProxyConfiguration) {
	cc := &cfg.ClientConnection
	if cc.ContentType == "" {
		cc.ContentType = DefaultContentType
	}
	if cc.QPS == 0 {
		cc.QPS = DefaultQPS
	}
	if cc.Burst == 0 {
		cc.Burst = DefaultBurst
	}
}

// setPlatformDefaults mirrors what upstream decides on Linux once the file
// or the flags are read.
func setPlatformDefaults(cfg *kpv1alpha1.KubeProxyConfiguration) {
	if cfg.Mode == "" {
		cfg.Mode = DefaultProxyMode
	}
	if cfg.Mode == ModeNFTables && len(cfg.NodePortAddresses) == 0 {
		cfg.NodePortAddresses = []string{NodePortAddressesPrimary}
	}
	if cfg.DetectLocalMode == "" {
		cfg.DetectLocalMode = DefaultDetectLocalMode
	}
}

func defaultDuration(d *metav1.Duration, def time.Duration) {
	if d.Duration == 0 {
		d.Duration = def
	}
}

// defaultServerHosts returns the default healthz and metrics hosts for a
// bind address: IPv4 gives 0.0.0.0 and 127.0.0.1, anything else (IPv6, or
// unparsable) gives :: and ::1, as upstream.
func defaultServerHosts(bindAddress string) (healthz, metrics string) {
	if netutils.ParseIPSloppy(bindAddress).To4() != nil {
		return defaultHealthzHostV4, defaultMetricsHostV4
	}
	return defaultHealthzHostV6, defaultMetricsHostV6
}

// defaultHostPort returns addr with a port: host:port when addr is empty,
// addr:port when addr is a bare IP, addr unchanged otherwise (an invalid
// addr is left for validation).
func defaultHostPort(addr, host string, port int32) string {
	if addr == "" {
		return net.JoinHostPort(host, strconv.Itoa(int(port)))
	}
	return appendPortIfNeeded(addr, port)
}

// appendPortIfNeeded adds port to a bare IP; host:port and invalid
// addresses are returned unchanged.
func appendPortIfNeeded(addr string, port int32) string {
	if _, _, err := net.SplitHostPort(addr); err == nil {
		return addr
	}
	if netutils.ParseIPSloppy(addr) == nil {
		return addr
	}
	return net.JoinHostPort(addr, strconv.Itoa(int(port)))
}
