package config

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sort"
	"strings"

	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	logsapi "k8s.io/component-base/logs/api/v1"
	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"

	"github.com/kproxy/kproxy/internal/model"
)

// Load parses args (without the program name) with every kproxy flag and
// returns the loaded Options, as Loader.Load does.
func Load(args []string) (*Options, error) {
	fs, l := NewFlagSet("kproxy")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("kproxy takes no arguments, got %q", fs.Args())
	}
	return l.Load()
}

// commandFlags are the flags upstream honours even when --config is given;
// every other flag is then ignored (the logging flags are merged into the
// file's logging section).
var commandFlags = map[string]bool{
	"config": true, "write-config-to": true, "cleanup": true, "init-only": true,
	"master": true, "hostname-override": true,
	"version": true, "help": true, "boot-id-file": true, "machine-id-file": true,
}

// Load computes the effective configuration the way upstream kube-proxy
// v1.36 does, once the flags bound by AddFlags are parsed:
//   - with --config, the file (decoded and defaulted) is the configuration;
//     the other flags are ignored, except the logging flags (which win over
//     the file), --hostname-override, the command flags and kproxy's own
//     flags (the file has no field for them). A Warning lists each ignored
//     flag that was set.
//   - without --config, the flags over upstream's defaults; the deprecated
//     --healthz-port/--metrics-port are folded into the bind addresses, and
//     the --iptables-*/--ipvs-* sync periods and --masquerade-all go to the
//     section of the selected mode.
//
// Then the Linux platform defaults apply (mode iptables, ...), the node name
// is resolved, and the result is validated. A *ValidationError lists every
// problem; other errors are fatal loading errors.
func (l *Loader) Load() (*Options, error) {
	if l.fs == nil {
		return nil, errors.New("config: Loader.Load called before AddFlags")
	}
	o := l.opts
	o.NoIPTablesNetlink = !l.iptablesNetlink
	fs := l.fs
	o.Flagz = func() map[string]string { return flagValues(fs) }
	if o.ConfigFile != "" {
		cfg, warnings, err := l.loadFile()
		if err != nil {
			return nil, err
		}
		l.cfg, o.Warnings = cfg, warnings
	} else {
		l.applyFlags(o.WriteConfigTo == "")
	}
	setPlatformDefaults(l.cfg)
	if err := l.applyHostnameOverride(); err != nil {
		return nil, err
	}
	o.Warnings = append(o.Warnings, configWarnings(l.cfg)...)
	o.Config = l.cfg
	if errs := append(Validate(l.cfg), l.flagErrors()...); len(errs) > 0 {
		return &o, &ValidationError{Errors: errs}
	}
	gate, err := FeatureGateFor(l.cfg)
	if err != nil {
		return &o, err
	}
	o.FeatureGate = gate
	name, err := NodeName(l.cfg.HostnameOverride, l.hostname)
	if err != nil {
		return &o, err
	}
	o.NodeName = name
	return &o, nil
}

// loadFile reads --config and merges the logging flags into it.
func (l *Loader) loadFile() (*kpv1alpha1.KubeProxyConfiguration, []string, error) {
	cfg, warnings, err := LoadFile(l.opts.ConfigFile)
	if err != nil {
		return nil, nil, err
	}
	ignored, err := copyLoggingFlags(l.fs, &cfg.Logging)
	if err != nil {
		return nil, nil, err
	}
	l.fs.Visit(func(f *pflag.Flag) {
		if _, ext := f.Annotations[extensionAnnotation]; !commandFlags[f.Name] && !ignored[f.Name] && !ext {
			warnings = append(warnings, fmt.Sprintf("flag --%s is ignored because --config is given (as in upstream kube-proxy); set it in the config file", f.Name))
		}
	})
	return cfg, warnings, nil
}

// copyLoggingFlags copies the logging flags that were set on fs into to,
// so that they win over the file; --vmodule entries from the flags come
// before the file's. It returns the names of the logging flags.
func copyLoggingFlags(fs *pflag.FlagSet, to *logsapi.LoggingConfiguration) (map[string]bool, error) {
	var clone pflag.FlagSet
	logsapi.AddFlags(to, &clone)
	fileVModule := to.VModule
	to.VModule = nil
	names := map[string]bool{}
	var errs []error
	clone.VisitAll(func(f *pflag.Flag) {
		names[f.Name] = true
		set := fs.Lookup(f.Name)
		if set == nil || !set.Changed {
			return
		}
		if err := f.Value.Set(set.Value.String()); err != nil {
			errs = append(errs, fmt.Errorf("copying flag --%s: %w", f.Name, err))
		}
	})
	to.VModule = append(to.VModule, fileVModule...)
	return names, errors.Join(errs...)
}

// applyFlags finishes the flags-only configuration. Upstream keeps one
// sync period pair and one masqueradeAll; they start from the iptables
// defaults and land in the section of the selected mode.
func (l *Loader) applyFlags(deprecatedPorts bool) {
	c := l.cfg
	if deprecatedPorts {
		c.HealthzBindAddress = addressFromPort(c.HealthzBindAddress, l.healthzPort)
		c.MetricsBindAddress = addressFromPort(c.MetricsBindAddress, l.metricsPort)
	}
	sync, minSync := c.IPTables.SyncPeriod.Duration, c.IPTables.MinSyncPeriod.Duration
	ipvs := c.Mode == ModeIPVS
	if l.fs.Changed("iptables-sync-period") && !ipvs {
		sync = l.iptablesSyncPeriod
	}
	if l.fs.Changed("iptables-min-sync-period") && !ipvs {
		minSync = l.iptablesMinSyncPeriod
	}
	if l.fs.Changed("ipvs-sync-period") && ipvs {
		sync = l.ipvsSyncPeriod
	}
	if l.fs.Changed("ipvs-min-sync-period") && ipvs {
		minSync = l.ipvsMinSyncPeriod
	}
	p := modePeriods(c)
	p.sync.Duration, p.minSync.Duration = sync, minSync
	*p.masqueradeAll = l.masqueradeAll
	if l.fs.Changed("cluster-cidr") {
		c.ClusterCIDR = l.clusterCIDRs
	}
}

// flagErrors reports what upstream rejects but the v1alpha1 file cannot
// express: an explicitly empty --cluster-cidr (upstream keeps one empty
// CIDR and fails validation; the file reads "" as unset).
func (l *Loader) flagErrors() field.ErrorList {
	var errs field.ErrorList
	if a := l.opts.DebugBindAddress; a != "" {
		if ap, err := netip.ParseAddrPort(a); err != nil || !ap.Addr().IsLoopback() || ap.Port() == 0 {
			errs = append(errs, field.Invalid(field.NewPath("debugBindAddress"), a, "must be a loopback IP:port, e.g. 127.0.0.1:10259 (the debug endpoint is never exposed off the node)"))
		}
	}
	if _, ok := model.ParseBalancing(l.opts.LoadBalancing); !ok {
		errs = append(errs, field.NotSupported(field.NewPath("loadBalancing"), l.opts.LoadBalancing, model.BalancingNames()))
	}
	if l.opts.ConfigFile == "" && l.fs.Changed("cluster-cidr") && l.clusterCIDRs == "" &&
		string(l.cfg.DetectLocalMode) == LocalModeClusterCIDR {
		errs = append(errs, field.Invalid(field.NewPath("clusterCIDR").Index(0), "", "must be a valid CIDR block (e.g. 10.100.0.0/16 or fde4:8dba:82e1::/48)"))
	}
	return errs
}

// modeSection points at the per-mode fields upstream folds into one.
type modeSection struct {
	sync, minSync *metav1.Duration
	masqueradeAll *bool
}

// modePeriods returns the section of c's mode: ipvs, nftables, or iptables
// for anything else (as upstream's conversion does). IPVS has no
// masqueradeAll of its own: it uses the iptables one.
func modePeriods(c *kpv1alpha1.KubeProxyConfiguration) modeSection {
	switch c.Mode {
	case ModeIPVS:
		return modeSection{&c.IPVS.SyncPeriod, &c.IPVS.MinSyncPeriod, &c.IPTables.MasqueradeAll}
	case ModeNFTables:
		return modeSection{&c.NFTables.SyncPeriod, &c.NFTables.MinSyncPeriod, &c.NFTables.MasqueradeAll}
	default:
		return modeSection{&c.IPTables.SyncPeriod, &c.IPTables.MinSyncPeriod, &c.IPTables.MasqueradeAll}
	}
}

// addressFromPort applies a deprecated port flag: 0 disables the server
// (empty address), otherwise the port is added to a bare IP.
func addressFromPort(addr string, port int32) string {
	if port == 0 {
		return ""
	}
	return appendPortIfNeeded(addr, port)
}

// applyHostnameOverride makes --hostname-override win over the file, trimmed
// and lower-cased; a blank value is an error, as upstream.
func (l *Loader) applyHostnameOverride() error {
	if l.hostnameOverride == "" {
		return nil
	}
	name := strings.TrimSpace(l.hostnameOverride)
	if name == "" {
		return errors.New("empty hostname-override is invalid")
	}
	l.cfg.HostnameOverride = strings.ToLower(name)
	return nil
}

// NodeName returns the name of this node as upstream computes it: the
// override, else the host name, trimmed and lower-cased. An empty result is
// an error.
func NodeName(override string, hostname func() (string, error)) (string, error) {
	name := override
	if name == "" {
		h, err := hostname()
		if err != nil {
			return "", fmt.Errorf("couldn't determine hostname: %w", err)
		}
		name = h
	}
	name = strings.ToLower(strings.TrimSpace(name))
	if name == "" {
		return "", errors.New("empty hostname is invalid")
	}
	return name, nil
}

func osHostname() (string, error) { return os.Hostname() }

// knownContentTypes are the API content types client-go can speak.
var knownContentTypes = map[string]bool{
	"application/vnd.kubernetes.protobuf": true,
	"application/json":                    true,
	"application/yaml":                    true,
	"application/cbor":                    true,
}

// configWarnings reports settings upstream accepts but that are probably
// mistakes or have no effect.
func configWarnings(c *kpv1alpha1.KubeProxyConfiguration) []string {
	var out []string
	if ct := c.ClientConnection.ContentType; !knownContentTypes[ct] {
		out = append(out, fmt.Sprintf("clientConnection.contentType %q is not a content type the API server speaks (want one of %s)", ct, strings.Join(sortedKeys(knownContentTypes), ", ")))
	}
	if c.PortRange != "" {
		out = append(out, fmt.Sprintf("portRange %q is ignored (it was used by the removed userspace proxy)", c.PortRange))
	}
	if c.Winkernel != (kpv1alpha1.KubeProxyWinkernelConfiguration{}) || c.WindowsRunAsService {
		out = append(out, "winkernel and windowsRunAsService settings are ignored on Linux")
	}
	return out
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// flagValues is every flag of fs with its value; a flag annotated
// "classified" shows CLASSIFIED instead, as upstream's /flagz.
func flagValues(fs *pflag.FlagSet) map[string]string {
	out := map[string]string{}
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Value == nil {
			return
		}
		v := f.Value.String()
		if len(f.Annotations["classified"]) > 0 {
			v = "CLASSIFIED"
		}
		out[f.Name] = v
	})
	return out
}
