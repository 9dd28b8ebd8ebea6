// Package dataplane defines the contract between the runner and the kernel
// backends (nftables, iptables, ipvs). A backend renders a model.Snapshot
// into kernel state with a pure function and applies only the difference.
package dataplane

import (
	"context"
	"io"
	"net/netip"
	"time"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/objects"
)

// Dataplane makes the kernel match a Snapshot.
type Dataplane interface {
	// Name is the proxy mode: "nftables", "iptables", ...
	Name() string
	// Sync makes the kernel match snap. It must be atomic per family: either
	// the whole change lands or none of it. When req.Full is false the backend
	// may rewrite only what req.Changed names (it still must end up matching
	// snap). An error leaves the kernel in its previous state; the runner retries.
	Sync(ctx context.Context, snap *model.Snapshot, req SyncRequest) error
	// Drifted reports, cheaply, whether kproxy's kernel state was changed
	// behind its back (a table or canary chain deleted or flushed). The runner
	// polls it every second and forces a full sync when it returns true.
	Drifted(ctx context.Context) (bool, error)
	// Cleanup removes every kernel object this backend, or upstream
	// kube-proxy in the same mode, created. Removing what is absent is no error.
	Cleanup(ctx context.Context) error
}

// SyncRequest says what changed since the last successful Sync.
type SyncRequest struct {
	// Full asks to rewrite everything and re-read what is in the kernel.
	Full bool
	// Changed names the Services added, updated or removed since the last
	// successful Sync. Ignored when Full is set.
	Changed map[objects.Key]struct{}
	// NodeChanged is true when this node's Node object changed.
	NodeChanged bool
}

// DryRunner is implemented by backends that can print what Sync would program
// instead of applying it (kproxy --dry-run).
type DryRunner interface {
	// Render writes the complete desired kernel state for snap in the
	// backend's native text form (nft -f, iptables-restore).
	Render(w io.Writer, snap *model.Snapshot) error
}

// Drainer is a dataplane that holds traffic in the process itself (the
// userspace mode's relays). Drain runs once the proxy stops syncing, as
// kproxy exits: it lets go of the traffic's entry points, so that another
// kproxy on the node takes new connections, and returns when what is in
// flight is done or ctx ends.
type Drainer interface {
	Drain(ctx context.Context)
}

// RuleCounter is implemented by backends that report how many rules they
// own (the kubeproxy_sync_proxy_rules_iptables_total and _last gauges).
type RuleCounter interface {
	RuleCounts() []RuleCount
}

// ObjectCounter is a dataplane that can say how many kernel objects it
// writes for each Service port of a family (kproxy inspect shows them):
// rules and set or map elements in nftables mode, rules in iptables mode,
// virtual and real servers in IPVS mode. It renders; it does not read the
// kernel.
type ObjectCounter interface {
	PortObjects(fs *model.FamilySnapshot, node model.NodeInfo) map[model.PortID]int
}

// OpCounter is a dataplane that can say how many kernel operations its
// last successful sync wrote (rules, chains, sets and elements added,
// flushed or deleted; rules in iptables mode). A restart that finds its
// rules in the kernel writes only what changed meanwhile; kproxy inspect
// shows the count.
type OpCounter interface {
	LastSyncOps() int
}

// Initializer is a dataplane with node settings to make once before its
// first sync, whose failure must stop the proxy (upstream fails to create
// its proxier): iptables mode's route_localnet for NodePorts on localhost.
type Initializer interface {
	Init(ctx context.Context) error
}

// FullReporter is a dataplane whose sync may be full when the request did
// not ask for it (a Node change, a failed sync before): LastSyncFull says
// whether the last sync, successful or not, rewrote everything, so that
// it is recorded among the full syncs, as upstream records its own.
type FullReporter interface {
	LastSyncFull() bool
}

// CleanupReporter is implemented by a Dataplane that deletes stale
// objects apart from its sync's main transaction (nftables, as upstream's
// deletes stale chains): the families whose deletion failed in the last
// Sync, counted as upstream counts its cleanup failures.
type CleanupReporter interface {
	LastSyncCleanupFailed() []model.Family
}

// RuleCount is one table's rules in one family: owned, and written by the
// last sync.
type RuleCount struct {
	Family          model.Family
	Table           string
	Total, LastSync int
}

// LocalMode is how traffic from local pods is told apart (detectLocalMode).
type LocalMode string

const (
	LocalNone            LocalMode = ""
	LocalClusterCIDR     LocalMode = "ClusterCIDR"
	LocalNodeCIDR        LocalMode = "NodeCIDR"
	LocalBridgeInterface LocalMode = "BridgeInterface"
	LocalInterfacePrefix LocalMode = "InterfaceNamePrefix"
)

// Config is what every backend needs from the KubeProxyConfiguration.
type Config struct {
	// Families are the IP families to program (from the node's addresses and
	// the kernel's support), IPv4 first.
	Families []model.Family
	// MasqueradeBit is the fwmark bit (0-31) that marks packets to masquerade.
	MasqueradeBit int
	// MasqueradeAll masquerades all traffic to service IPs.
	MasqueradeAll bool
	// LocalMode and its parameters decide which traffic comes from local pods.
	LocalMode LocalMode
	// ClusterCIDRs are used by LocalClusterCIDR (both families mixed).
	ClusterCIDRs []netip.Prefix
	// BridgeInterface is used by LocalBridgeInterface.
	BridgeInterface string
	// InterfacePrefix is used by LocalInterfacePrefix.
	InterfacePrefix string
	// NodePortAddresses is nodePortAddresses as configured: CIDRs and/or the
	// word "primary". Empty means the mode's default.
	NodePortAddresses []string
	// NodeIPs are the node's primary IPs (from --bind-address or the Node object).
	NodeIPs []netip.Addr
	// TableName overrides the kernel table (nftables) name; empty means
	// upstream's "kube-proxy", which kproxy shares so that a rollback to
	// kube-proxy takes the table over (nftables.DefaultTableName).
	TableName string
	// NoLocalhostNodePorts is iptables.localhostNodePorts=false: NodePorts are
	// not answered on 127.0.0.0/8 (iptables mode, IPv4 only). The zero value
	// keeps upstream's default (answered).
	NoLocalhostNodePorts bool
	// NoIPTablesNetlink turns iptables mode's netlink writer off: rules
	// always go through iptables-restore (--iptables-netlink-writer=false).
	NoIPTablesNetlink bool
	// ServiceCIDRs are the cluster's service IP ranges (from ServiceCIDR
	// objects), both families mixed. Traffic to an address in them that is
	// not an allocated ClusterIP is dropped, as upstream does. Empty: no rule.
	ServiceCIDRs []netip.Prefix
	// IPVS holds IPVS mode's settings (the configuration's ipvs section).
	IPVS IPVSConfig
}

// IPVSConfig is IPVS mode's part of Config.
type IPVSConfig struct {
	// Scheduler is the default IPVS scheduler ("" means rr).
	Scheduler string
	// StrictARP makes the node answer ARP only for addresses of the
	// interface asked on (arp_ignore=1, arp_announce=2), so the Service IPs
	// bound to kube-ipvs0 are not announced on the node's links.
	StrictARP bool
	// ExcludeCIDRs are ranges whose IPVS virtual servers kproxy leaves
	// alone (another component's).
	ExcludeCIDRs []netip.Prefix
	// TCPTimeout, TCPFinTimeout and UDPTimeout are IPVS's connection
	// timeouts; zero leaves the kernel's.
	TCPTimeout, TCPFinTimeout, UDPTimeout time.Duration
}
