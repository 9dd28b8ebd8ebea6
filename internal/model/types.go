// Package model turns the slim Service, EndpointSlice and Node objects into an
// immutable Snapshot: for every service port and IP family, its frontends and the
// endpoints that serve cluster and local traffic. It is pure: no I/O, no clock,
// no goroutines. Every dataplane renders the same Snapshot.
package model

import (
	"fmt"
	"net/netip"
	"sort"
	"sync/atomic"

	"github.com/kproxy/kproxy/internal/objects"
)

// Family is an IP family.
type Family uint8

const (
	IPv4 Family = 4
	IPv6 Family = 6
)

func (f Family) String() string {
	if f == IPv6 {
		return "IPv6"
	}
	return "IPv4"
}

// FamilyOf returns the family of a valid address (IPv4-mapped IPv6 counts as IPv4).
func FamilyOf(a netip.Addr) Family {
	if a.Unmap().Is4() {
		return IPv4
	}
	return IPv6
}

// Protocol is a transport protocol a Service port can use.
type Protocol string

const (
	TCP  Protocol = "TCP"
	UDP  Protocol = "UDP"
	SCTP Protocol = "SCTP"
)

// PortID names a service port: namespace, Service name, port name and protocol.
// It is unique within a family.
type PortID struct {
	Namespace string
	Name      string
	Port      string // the port's name; "" for an unnamed port
	Protocol  Protocol
}

// Service returns the namespace/name of the Service the port belongs to.
func (id PortID) Service() objects.Key { return objects.Key{Namespace: id.Namespace, Name: id.Name} }

func (id PortID) String() string {
	s := id.Namespace + "/" + id.Name
	if id.Port != "" {
		s += ":" + id.Port
	}
	return s
}

// Less orders PortIDs by namespace, name, port name and protocol.
func (id PortID) Less(o PortID) bool {
	if id.Namespace != o.Namespace {
		return id.Namespace < o.Namespace
	}
	if id.Name != o.Name {
		return id.Name < o.Name
	}
	if id.Port != o.Port {
		return id.Port < o.Port
	}
	return id.Protocol < o.Protocol
}

// Snapshot is the whole desired proxy state at one moment. It is immutable once
// built: dataplanes and tools may share it freely. Update shares unchanged
// FamilySnapshots and ServicePorts between snapshots, so nothing reachable from
// a Snapshot may be modified.
type Snapshot struct {
	Node NodeInfo
	// V4 and V6 hold the service ports of each family. A dual-stack Service
	// appears in both; a single-stack one in one. Never nil.
	V4 *FamilySnapshot
	V6 *FamilySnapshot
	// ServiceCIDRs are the cluster's Service IP ranges: the valid entries of
	// every ServiceCIDR object's spec.cidrs, masked, each once, IPv4 first
	// (see ServiceCIDRsOf). Dataplanes that drop traffic to unallocated
	// addresses of these ranges read them; nil when no ServiceCIDR is known.
	ServiceCIDRs []netip.Prefix

	// node is the object Node was made from; Update reuses Node while the
	// pointer stays the same.
	node *objects.Node
	// nodeProblems and svcProblems keep the problems of the current input, so
	// that Problems can list them all (svcProblems is nil when empty).
	nodeProblems []Problem
	svcProblems  map[objects.Key][]Problem
	// cidrs is what ServiceCIDRs was parsed from, with its problems.
	cidrs serviceCIDRs
	// balancing is the Input.Balancing the ports were made with.
	balancing BalancingOptions
	// noExtIPs is the Input.IgnoreExternalIPs the ports were made with.
	noExtIPs bool
	// gen numbers the snapshot; parent is the gen of the snapshot Update
	// derived it from (0: built whole) and changed the Services it rebuilt
	// (sorted). Numbers, not a pointer: a chain of snapshots would keep
	// every earlier one alive.
	gen, parent uint64
	changed     []objects.Key
}

// snapshotGen hands out Snapshot.gen.
var snapshotGen atomic.Uint64

// ChangedSince returns the Services whose ports may differ between prev
// and s, sorted, when Update derived s from prev: every port of another
// Service is then the same *ServicePort in both. False when s was built
// whole (or from another snapshot), and the ports must be compared one by
// one.
func (s *Snapshot) ChangedSince(prev *Snapshot) ([]objects.Key, bool) {
	if s == nil || prev == nil || s.parent == 0 || s.parent != prev.gen {
		return nil, false
	}
	return s.changed, true
}

// ServicePorts returns the ports of the Service key (sorted by ID), by
// binary search.
func (fs *FamilySnapshot) ServicePorts(key objects.Key) []*ServicePort {
	sp := fs.span(key)
	return fs.Ports[sp[0]:sp[1]]
}

// Family returns the per-family part of the snapshot.
func (s *Snapshot) Family(f Family) *FamilySnapshot {
	if f == IPv6 {
		return s.V6
	}
	return s.V4
}

// FamilySnapshot is the part of a Snapshot for one IP family.
type FamilySnapshot struct {
	Family Family
	// Ports is sorted by ID (PortID.Less); Port finds one.
	Ports []*ServicePort

	// tally is what the metrics and the health server read after every
	// sync, kept up to date by Update so that they do not walk Ports.
	tally portTally
}

// portTally sums, over a set of ports, what is read after every sync.
type portTally struct {
	// noLocalInternal and noLocalExternal count the ports with endpoints
	// whose Local internal (external) traffic policy finds none on this
	// node, and their Services.
	noLocalInternal, noLocalExternal noLocalCount
	// healthChecked are the ports with a health-check node port, in Ports
	// order.
	healthChecked []*ServicePort
}

// noLocalCount counts ports whose Local policy finds no local endpoint,
// and the Services they belong to.
type noLocalCount struct{ ports, services int }

// add counts p; last is the port counted before it (nil: none), whose
// Service, when it is p's, is not counted again.
func (c *noLocalCount) add(p *ServicePort, last **ServicePort) {
	c.ports++
	if *last == nil || (*last).ID.Service() != p.ID.Service() {
		c.services++
	}
	*last = p
}

// replace returns c with gone taken out and added counted.
func (c noLocalCount) replace(gone, added noLocalCount) noLocalCount {
	return noLocalCount{c.ports - gone.ports + added.ports, c.services - gone.services + added.services}
}

// tallyOf returns the tally of ports, which hold each Service's ports one
// after another (as sorted by ID), so that a Service is counted once.
func tallyOf(ports ...[]*ServicePort) portTally {
	var t portTally
	var lastInternal, lastExternal *ServicePort
	for _, list := range ports {
		for _, p := range list {
			if p.HasEndpoints && len(p.LocalEndpoints) == 0 {
				if p.InternalPolicyLocal {
					t.noLocalInternal.add(p, &lastInternal)
				}
				if p.ExternalPolicyLocal {
					t.noLocalExternal.add(p, &lastExternal)
				}
			}
			if p.HealthCheckNodePort != 0 {
				t.healthChecked = append(t.healthChecked, p)
			}
		}
	}
	return t
}

// NoLocalEndpoints counts, as upstream's rule sync does, the ports that
// have endpoints but whose Local internal (respectively external) traffic
// policy finds none on this node. Ports without any endpoint are rejected
// outright and not counted. It does not walk the ports.
func (fs *FamilySnapshot) NoLocalEndpoints() (internal, external int) {
	return fs.tally.noLocalInternal.ports, fs.tally.noLocalExternal.ports
}

// NoLocalEndpointServices is NoLocalEndpoints by Service instead of by
// port, as upstream's IPVS mode counts: a Service with two such ports
// counts once.
func (fs *FamilySnapshot) NoLocalEndpointServices() (internal, external int) {
	return fs.tally.noLocalInternal.services, fs.tally.noLocalExternal.services
}

// HealthChecked returns the ports with a health-check node port, sorted by
// ID, without walking the others. The slice is shared: do not modify it.
func (fs *FamilySnapshot) HealthChecked() []*ServicePort {
	return fs.tally.healthChecked
}

// Port returns the port with id, or nil, by binary search. (No index map:
// an update would have to copy a 10k-entry map on every change, a
// millisecond and a fresh megabyte each time at 10k Services.)
func (fs *FamilySnapshot) Port(id PortID) *ServicePort {
	i := sort.Search(len(fs.Ports), func(i int) bool { return !fs.Ports[i].ID.Less(id) })
	if i < len(fs.Ports) && fs.Ports[i].ID == id {
		return fs.Ports[i]
	}
	return nil
}

// NodeInfo is what the proxy knows about the node it runs on.
type NodeInfo struct {
	Name string
	// Known is false until the Node object has been seen (or when it is gone).
	Known       bool
	Zone        string
	PodCIDRs    []netip.Prefix
	InternalIPs []netip.Addr
	ExternalIPs []netip.Addr
	Deleting    bool
	ToBeDeleted bool
}

// ServicePort is one port of one Service in one IP family, with its frontends
// and endpoints categorised exactly as upstream kube-proxy does.
type ServicePort struct {
	ID       PortID
	Family   Family
	Protocol Protocol
	Port     uint16
	// NodePort is 0 when the port has none.
	NodePort uint16

	// ClusterIP is this family's cluster IP.
	ClusterIP netip.Addr
	// ExternalIPs are spec.externalIPs of this family.
	ExternalIPs []netip.Addr
	// LoadBalancerIPs are the status ingress IPs of this family with ipMode VIP
	// (or unset); ingress IPs with ipMode Proxy are left out, as upstream does.
	LoadBalancerIPs []netip.Addr
	// SourceRanges are the valid spec.loadBalancerSourceRanges of this family,
	// masked to their network. As upstream: invalid entries are ignored, and
	// the list is empty (no restriction for this family) when it would hold a
	// zero-length prefix, or when every range is of the other family.
	SourceRanges []netip.Prefix

	// AffinityTimeout is the ClientIP session affinity timeout in seconds;
	// 0 means no session affinity.
	AffinityTimeout int32

	// ExternalPolicyLocal is true when externalTrafficPolicy is Local and the
	// Service is externally accessible by its spec, as upstream decides: type
	// NodePort or LoadBalancer, or type ClusterIP with spec.externalIPs. It is
	// a Service-level fact: the port itself may still lack any external
	// frontend (see ExternallyAccessible).
	ExternalPolicyLocal bool
	// InternalPolicyLocal is true when internalTrafficPolicy is Local.
	InternalPolicyLocal bool
	// HealthCheckNodePort serves /healthz for a LoadBalancer Service with
	// ExternalPolicyLocal; 0 if none.
	HealthCheckNodePort uint16
	// Scheduler is the Service's IPVS scheduler from its
	// objects.AnnotationIPVSScheduler annotation; "" means the configured
	// one. Only IPVS mode reads it.
	Scheduler string
	// Balancing is the algorithm picking an endpoint: the Service's
	// objects.AnnotationLoadBalancing when the mode supports it, else
	// Input.Balancing.Default. ClientIP affinity takes precedence over it.
	Balancing Balancing
	// TopologyMode is the topology the cluster endpoints were chosen with:
	// "" (none), "PreferSameZone" or "PreferSameNode" (from the hints).
	TopologyMode string

	// Endpoints are all endpoints of this family for this port (slice port
	// of the same name and protocol), deduplicated across slices, sorted by
	// address and port. Empty lists below are nil.
	Endpoints []*Endpoint
	// ClusterEndpoints serve traffic subject to the Cluster policy (nil when
	// the port uses none); LocalEndpoints serve traffic subject to the Local
	// policy (nil when the port uses none). AllReachable is the union that any
	// traffic may reach, used for stale-conntrack cleanup.
	ClusterEndpoints []*Endpoint
	LocalEndpoints   []*Endpoint
	AllReachable     []*Endpoint
	// HasEndpoints is true when the Service has a usable endpoint anywhere
	// (ready, or serving and terminating), local or not: it decides between
	// reject and drop, as upstream's.
	HasEndpoints bool
	// LocalReadyEndpoints is upstream's health-check count, the same on every
	// port of a Service in one family: the number of distinct IPs of ready
	// endpoints on this node over all ports of the Service's slices.
	LocalReadyEndpoints int
	// extIPsIgnored is true when spec.externalIPs of this family were left
	// out (Input.IgnoreExternalIPs): the port is still externally
	// accessible by them.
	extIPsIgnored bool
}

// ExternallyAccessible reports whether the port has a NodePort, external IPs or
// load-balancer IPs.
func (p *ServicePort) ExternallyAccessible() bool {
	return p.NodePort != 0 || len(p.ExternalIPs) > 0 || p.extIPsIgnored || len(p.LoadBalancerIPs) > 0
}

// UsesClusterEndpoints reports whether any traffic to the port is subject to
// the Cluster policy: internal traffic with internalTrafficPolicy Cluster, or
// any externally accessible port (even with externalTrafficPolicy Local,
// traffic from pods and the node to external frontends is short-circuited to
// the cluster endpoints, as upstream does).
func (p *ServicePort) UsesClusterEndpoints() bool {
	return !p.InternalPolicyLocal || p.ExternallyAccessible()
}

// UsesLocalEndpoints reports whether any traffic to the port is subject to
// the Local policy: internalTrafficPolicy Local, or externalTrafficPolicy
// Local on an externally accessible port.
func (p *ServicePort) UsesLocalEndpoints() bool {
	return p.InternalPolicyLocal || (p.ExternalPolicyLocal && p.ExternallyAccessible())
}

// Endpoint is one backend of a service port.
type Endpoint struct {
	IP   netip.Addr
	Port uint16
	// Ready, Serving and Terminating are the slice conditions with upstream's
	// defaults applied: a missing ready or serving counts as true, a missing
	// terminating as false.
	Ready       bool
	Serving     bool
	Terminating bool
	// IsLocal is true when the endpoint runs on this node. The endpoint's
	// node name and zone are not kept: nothing after the model reads them
	// (topology reads the hints), and without them an Endpoint is 40 bytes
	// instead of 80 (110k endpoints at 10k Services: 4.4 MB less).
	IsLocal bool
	// Hints are the slice's topology hints (shared with the slim slice,
	// never changed); nil when absent.
	Hints *objects.Hints
}

// ZoneHints returns the endpoint's hints.forZones names (nil: none).
func (e *Endpoint) ZoneHints() []string {
	if e.Hints == nil {
		return nil
	}
	return e.Hints.Zones
}

// NodeHints returns the endpoint's hints.forNodes names (nil: none).
func (e *Endpoint) NodeHints() []string {
	if e.Hints == nil {
		return nil
	}
	return e.Hints.Nodes
}

// AddrPort returns the endpoint as address and port.
func (e *Endpoint) AddrPort() netip.AddrPort { return netip.AddrPortFrom(e.IP, e.Port) }

func (e *Endpoint) String() string { return e.AddrPort().String() }

// Problem is a reason an object, or part of one, was skipped while building a
// Snapshot. Problems are reported (logged, evented) by the caller; the rest of
// the snapshot is unaffected.
type Problem struct {
	Kind   string // Service, EndpointSlice or Node
	Object objects.Key
	// UID is the object's metadata.uid, where the model has it (Services).
	UID    string
	Field  string
	Reason string
	// Event is the reason of the Event recorded on the object
	// (CamelCase); "" means the reporter's generic one.
	Event string
}

func (p Problem) String() string {
	return fmt.Sprintf("%s %s: %s: %s", p.Kind, p.Object, p.Field, p.Reason)
}
