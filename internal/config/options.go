// Package config loads kproxy's configuration exactly as upstream kube-proxy
// v1.36 does: a kubeproxy.config.k8s.io/v1alpha1 KubeProxyConfiguration file
// (--config), upstream's flags with the same names, types and defaults, and
// upstream's precedence between the two. Validate reports every problem at once.
package config

import (
	"k8s.io/component-base/featuregate"
	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
)

// Options is the fully loaded, defaulted and validated configuration of one
// kproxy process.
type Options struct {
	// Config is the effective KubeProxyConfiguration (file, then flags, then
	// defaults), as upstream would compute it.
	Config *kpv1alpha1.KubeProxyConfiguration

	// ConfigFile is --config, "" when unset.
	ConfigFile string
	// Master is --master (overrides the kubeconfig's server).
	Master string
	// WriteConfigTo is --write-config-to: write the effective config and exit.
	WriteConfigTo string
	// CleanupAndExit is --cleanup.
	CleanupAndExit bool
	// InitOnly is --init-only: do privileged node setup and exit.
	InitOnly bool

	// SourceFile is --source-file (kproxy extension): read Services,
	// EndpointSlices and Nodes from this multi-document YAML file instead of
	// the API server. Re-read when it changes.
	SourceFile string
	// DryRun is --dry-run (kproxy extension): print what the dataplane would
	// program after the first sync instead of touching the kernel, then exit.
	DryRun bool
	// DebugBindAddress is --debug-bind-address (kproxy extension): where
	// the debug endpoint that kproxy inspect and explain read serves; ""
	// (the default) turns it off. A loopback address only.
	DebugBindAddress string
	// ServiceTrafficMetrics is --service-traffic-metrics (kproxy
	// extension): count every Service port's new connections, packets and
	// bytes in a table of their own and export them as kproxy_service_*
	// metrics. Off by default; off removes the table at start.
	ServiceTrafficMetrics bool
	// NoIPTablesNetlink is --iptables-netlink-writer=false (kproxy
	// extension): iptables mode writes through iptables-restore only, even
	// where its netlink writer would be used.
	NoIPTablesNetlink bool
	// LoadBalancing is --load-balancing (kproxy extension): how Services
	// without the kproxy.io/load-balancing annotation pick an endpoint
	// (model.BalancingNames); "random", upstream's behaviour, by default.
	LoadBalancing string

	// NodeName is this node's name as upstream computes it: the
	// hostnameOverride, else the host name, trimmed and lower-cased.
	NodeName string
	// Flagz returns every command-line flag's value, as /flagz shows
	// them (a flag annotated "classified" as CLASSIFIED).
	Flagz func() map[string]string
	// FeatureGate holds the effective feature gates: upstream v1.36's known
	// gates at their defaults, overridden by the config's featureGates.
	FeatureGate featuregate.FeatureGate

	// Warnings are non-fatal problems found while loading (unknown fields in
	// the config file, deprecated flags); the caller logs them.
	Warnings []string
}
