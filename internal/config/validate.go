package config

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/blang/semver/v4"
	"k8s.io/apimachinery/pkg/util/validation/field"
	logsapi "k8s.io/component-base/logs/api/v1"
	metricsapi "k8s.io/component-base/metrics/api/v1"
	"k8s.io/klog/v2"
	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
	netutils "k8s.io/utils/net"
)

// UpstreamVersion is the kube-proxy release whose behaviour kproxy copies.
const UpstreamVersion = "v1.36.3"

// ValidationError lists every problem Validate found.
type ValidationError struct {
	Errors field.ErrorList
}

func (e *ValidationError) Error() string {
	lines := make([]string, len(e.Errors))
	for i, err := range e.Errors {
		lines[i] = err.Error()
	}
	return "invalid configuration:\n" + strings.Join(lines, "\n")
}

// ipvsSchedulers are the IPVS schedulers of the Linux kernel ("" means rr).
var ipvsSchedulers = []string{"", "dh", "fo", "lblc", "lblcr", "lc", "mh", "nq", "ovf", "rr", "sed", "sh", "twos", "wlc", "wrr"}

// Validate checks an effective (defaulted) configuration the way upstream
// kube-proxy v1.36 does on Linux and returns every problem at once, with
// the file's field paths. The sync periods and masqueradeAll checked are
// those of the selected mode. Beyond upstream it checks ipvs.scheduler
// (upstream fails at start-up on an unknown scheduler instead).
func Validate(cfg *kpv1alpha1.KubeProxyConfiguration) field.ErrorList {
	var errs field.ErrorList
	gate := newFeatureGate()
	// Quiet: FeatureGateFor logs the GA/deprecated warnings once.
	if err := gate.SetFromMapWithLogger(klog.Logger{}, cfg.FeatureGates); err != nil {
		errs = append(errs, field.Invalid(field.NewPath("featureGates"), cfg.FeatureGates, err.Error()))
	}
	errs = append(errs, validateMasqueradeBit(cfg.IPTables.MasqueradeBit, field.NewPath("iptables", "masqueradeBit"))...)
	switch cfg.Mode {
	case ModeIPVS:
		errs = append(errs, validateIPVS(&cfg.IPVS, field.NewPath("ipvs"))...)
	case ModeNFTables:
		errs = append(errs, validateMasqueradeBit(cfg.NFTables.MasqueradeBit, field.NewPath("nftables", "masqueradeBit"))...)
	}
	errs = append(errs, validateConntrack(&cfg.Conntrack, field.NewPath("conntrack"))...)
	errs = append(errs, validateRange(cfg.OOMScoreAdj, -1000, 1000, field.NewPath("oomScoreAdj"))...)
	errs = append(errs, validateProxyMode(string(cfg.Mode), field.NewPath("mode"))...)
	if cfg.ClientConnection.Burst < 0 {
		errs = append(errs, field.Invalid(field.NewPath("clientConnection", "burst"), cfg.ClientConnection.Burst, "must be greater than or equal to 0"))
	}
	errs = append(errs, validatePeriods(cfg)...)
	errs = append(errs, validateAddresses(cfg)...)
	errs = append(errs, validateShowHiddenMetrics(cfg.ShowHiddenMetricsForVersion, field.NewPath("showHiddenMetricsForVersion"))...)
	errs = append(errs, validateDetectLocal(cfg)...)
	errs = append(errs, logsapi.Validate(&cfg.Logging, gate, field.NewPath("logging"))...)
	return errs
}

func validateMasqueradeBit(bit *int32, path *field.Path) field.ErrorList {
	return validateRange(bit, 0, 31, path)
}

// validateRange checks an optional value against [lo, hi].
func validateRange(v *int32, lo, hi int32, path *field.Path) field.ErrorList {
	if v == nil || (*v >= lo && *v <= hi) {
		return nil
	}
	return field.ErrorList{field.Invalid(path, *v, fmt.Sprintf("must be within the range [%d, %d]", lo, hi))}
}

func validateIPVS(c *kpv1alpha1.KubeProxyIPVSConfiguration, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	errs = append(errs, nonNegative(c.TCPTimeout.Duration, path.Child("tcpTimeout"))...)
	errs = append(errs, nonNegative(c.TCPFinTimeout.Duration, path.Child("tcpFinTimeout"))...)
	errs = append(errs, nonNegative(c.UDPTimeout.Duration, path.Child("udpTimeout"))...)
	for i, cidr := range c.ExcludeCIDRs {
		if _, _, err := netutils.ParseCIDRSloppy(cidr); err != nil {
			errs = append(errs, field.Invalid(path.Child("excludeCIDRs").Index(i), cidr, "must be a valid CIDR"))
		}
	}
	if !slices.Contains(ipvsSchedulers, c.Scheduler) {
		errs = append(errs, field.NotSupported(path.Child("scheduler"), c.Scheduler, ipvsSchedulers[1:]))
	}
	return errs
}

func validateConntrack(c *kpv1alpha1.KubeProxyConntrackConfiguration, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, v := range []struct {
		name string
		val  *int32
	}{{"maxPerCore", c.MaxPerCore}, {"min", c.Min}} {
		if v.val != nil && *v.val < 0 {
			errs = append(errs, field.Invalid(path.Child(v.name), *v.val, "must be greater than or equal to 0"))
		}
	}
	if c.TCPEstablishedTimeout != nil {
		errs = append(errs, nonNegative(c.TCPEstablishedTimeout.Duration, path.Child("tcpEstablishedTimeout"))...)
	}
	if c.TCPCloseWaitTimeout != nil {
		errs = append(errs, nonNegative(c.TCPCloseWaitTimeout.Duration, path.Child("tcpCloseWaitTimeout"))...)
	}
	errs = append(errs, nonNegative(c.UDPTimeout.Duration, path.Child("udpTimeout"))...)
	errs = append(errs, nonNegative(c.UDPStreamTimeout.Duration, path.Child("udpStreamTimeout"))...)
	return errs
}

func validateProxyMode(mode string, path *field.Path) field.ErrorList {
	valid := []string{ModeIPTables, ModeIPVS, ModeNFTables, ModeUserspace}
	if mode == "" || slices.Contains(valid, mode) {
		return nil
	}
	return field.ErrorList{field.Invalid(path, mode, "must be iptables, ipvs, nftables, userspace (kproxy's) or blank (blank means the best-available proxy [currently iptables])")}
}

// validatePeriods checks configSyncPeriod and the selected mode's sync periods.
func validatePeriods(cfg *kpv1alpha1.KubeProxyConfiguration) field.ErrorList {
	var errs field.ErrorList
	if cfg.ConfigSyncPeriod.Duration <= 0 {
		errs = append(errs, field.Invalid(field.NewPath("configSyncPeriod"), cfg.ConfigSyncPeriod.Duration.String(), "must be greater than 0"))
	}
	section := modeName(cfg.Mode)
	p := modePeriods(cfg)
	syncPath, minPath := field.NewPath(section, "syncPeriod"), field.NewPath(section, "minSyncPeriod")
	if p.sync.Duration <= 0 {
		errs = append(errs, field.Invalid(syncPath, p.sync.Duration.String(), "must be greater than 0"))
	}
	errs = append(errs, nonNegative(p.minSync.Duration, minPath)...)
	if p.minSync.Duration > p.sync.Duration {
		errs = append(errs, field.Invalid(syncPath, p.sync.Duration.String(), fmt.Sprintf("must be greater than or equal to %s (%s)", minPath, p.minSync.Duration)))
	}
	return errs
}

// modeName is the config section that holds mode's settings.
func modeName(mode kpv1alpha1.ProxyMode) string {
	switch mode {
	case ModeIPVS, ModeNFTables:
		return string(mode)
	}
	return ModeIPTables
}

// validateAddresses checks bindAddress, the server addresses and nodePortAddresses.
func validateAddresses(cfg *kpv1alpha1.KubeProxyConfiguration) field.ErrorList {
	var errs field.ErrorList
	if netutils.ParseIPSloppy(cfg.BindAddress) == nil {
		errs = append(errs, field.Invalid(field.NewPath("bindAddress"), cfg.BindAddress, "not a valid textual representation of an IP address"))
	}
	if cfg.HealthzBindAddress != "" {
		errs = append(errs, validateHostPort(cfg.HealthzBindAddress, field.NewPath("healthzBindAddress"))...)
	}
	errs = append(errs, validateHostPort(cfg.MetricsBindAddress, field.NewPath("metricsBindAddress"))...)
	path := field.NewPath("nodePortAddresses")
	for i, addr := range cfg.NodePortAddresses {
		if addr == NodePortAddressesPrimary {
			if i != 0 || len(cfg.NodePortAddresses) != 1 {
				errs = append(errs, field.Invalid(path.Index(i), addr, "can't use both 'primary' and CIDRs"))
			}
			break
		}
		if _, _, err := netutils.ParseCIDRSloppy(addr); err != nil {
			errs = append(errs, field.Invalid(path.Index(i), addr, "must be a valid CIDR"))
		}
	}
	return errs
}

// validateHostPort checks an IP:port server address.
func validateHostPort(input string, path *field.Path) field.ErrorList {
	host, port, err := net.SplitHostPort(input)
	if err != nil {
		return field.ErrorList{field.Invalid(path, input, "must be IP:port")}
	}
	var errs field.ErrorList
	if netutils.ParseIPSloppy(host) == nil {
		errs = append(errs, field.Invalid(path, host, "must be a valid IP"))
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		errs = append(errs, field.Invalid(path, port, "must be a valid port"))
	}
	return errs
}

// validateShowHiddenMetrics accepts "" or the previous minor release.
func validateShowHiddenMetrics(v string, path *field.Path) field.ErrorList {
	current := semver.MustParse(strings.TrimPrefix(UpstreamVersion, "v"))
	if err := metricsapi.ValidateShowHiddenMetricsVersionForKubeletBackwardCompatOnly(current, v); err != nil {
		return field.ErrorList{field.Invalid(path, v, err.Error())}
	}
	return nil
}

// validateDetectLocal checks detectLocalMode and the setting that mode needs.
func validateDetectLocal(cfg *kpv1alpha1.KubeProxyConfiguration) field.ErrorList {
	modes := []string{LocalModeClusterCIDR, LocalModeNodeCIDR, LocalModeBridgeInterface, LocalModeInterfaceNamePrefix, ""}
	mode := string(cfg.DetectLocalMode)
	if !slices.Contains(modes, mode) {
		return field.ErrorList{field.NotSupported(field.NewPath("detectLocalMode"), mode, modes)}
	}
	switch mode {
	case LocalModeBridgeInterface:
		return notEmpty(cfg.DetectLocal.BridgeInterface, field.NewPath("detectLocal", "bridgeInterface"))
	case LocalModeInterfaceNamePrefix:
		return notEmpty(cfg.DetectLocal.InterfaceNamePrefix, field.NewPath("detectLocal", "interfaceNamePrefix"))
	case LocalModeClusterCIDR:
		if cfg.ClusterCIDR != "" {
			return validateClusterCIDRs(strings.Split(cfg.ClusterCIDR, ","), field.NewPath("clusterCIDR"))
		}
	}
	return nil
}

// validateClusterCIDRs accepts one CIDR or a dual-stack pair.
func validateClusterCIDRs(cidrs []string, path *field.Path) field.ErrorList {
	const pairMsg = "must be a either a single CIDR or dual-stack pair of CIDRs (e.g. [10.100.0.0/16, fde4:8dba:82e1::/48]"
	if len(cidrs) > 2 {
		return field.ErrorList{field.Invalid(path, cidrs, pairMsg)}
	}
	var errs field.ErrorList
	for i, c := range cidrs {
		if _, _, err := netutils.ParseCIDRSloppy(c); err != nil {
			errs = append(errs, field.Invalid(path.Index(i), c, "must be a valid CIDR block (e.g. 10.100.0.0/16 or fde4:8dba:82e1::/48)"))
		}
	}
	if len(cidrs) == 2 {
		if dual, err := netutils.IsDualStackCIDRStrings(cidrs); err == nil && !dual {
			errs = append(errs, field.Invalid(path, cidrs, pairMsg))
		}
	}
	return errs
}

func notEmpty(v string, path *field.Path) field.ErrorList {
	if v == "" {
		return field.ErrorList{field.Invalid(path, v, "must not be empty")}
	}
	return nil
}

func nonNegative(d time.Duration, path *field.Path) field.ErrorList {
	if d < 0 {
		return field.ErrorList{field.Invalid(path, d.String(), "must be greater than or equal to 0")}
	}
	return nil
}
