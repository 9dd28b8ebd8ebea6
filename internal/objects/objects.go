// Package objects holds the slim forms of the Kubernetes objects kproxy watches.
//
// Sources (the API informers and the file source) convert Services, EndpointSlices,
// Nodes and ServiceCIDRs into these structs before caching them, so that only the fields the
// proxy needs stay in memory. The model package reads nothing else. Addresses are
// kept as the API wrote them (strings); the model parses and validates them, so a
// malformed object is reported once, in one place.
package objects

import (
	"cmp"
	"net/netip"
	"unique"
)

// Well-known labels, annotations and taints kproxy reads.
const (
	LabelServiceName       = "kubernetes.io/service-name"
	LabelServiceProxyName  = "service.kubernetes.io/service-proxy-name"
	LabelHeadless          = "service.kubernetes.io/headless"
	LabelTopologyZone      = "topology.kubernetes.io/zone"
	AnnotationTriggerTime  = "endpoints.kubernetes.io/last-change-trigger-time"
	TaintToBeDeletedByCA   = "ToBeDeletedByClusterAutoscaler"
	ClusterIPNone          = "None"
	ServiceTypeClusterIP   = "ClusterIP"
	ServiceTypeNodePort    = "NodePort"
	ServiceTypeLB          = "LoadBalancer"
	ServiceTypeExternal    = "ExternalName"
	PolicyLocal            = "Local"
	PolicyCluster          = "Cluster"
	AffinityClientIP       = "ClientIP"
	LoadBalancerIPModeVIP  = "VIP"
	LoadBalancerIPModeProx = "Proxy"
	AddressTypeIPv4        = "IPv4"
	AddressTypeIPv6        = "IPv6"
)

// Key names an object: namespace and name (Nodes have an empty namespace).
type Key struct {
	Namespace string
	Name      string
}

// Compare orders keys by namespace, then name (-1, 0 or +1, as cmp.Compare).
func (k Key) Compare(o Key) int {
	return cmp.Or(cmp.Compare(k.Namespace, o.Namespace), cmp.Compare(k.Name, o.Name))
}

func (k Key) String() string {
	if k.Namespace == "" {
		return k.Name
	}
	return k.Namespace + "/" + k.Name
}

// Service is the slim form of a core/v1 Service.
type Service struct {
	Namespace string
	Name      string
	// UID is metadata.uid: Events about the Service name it.
	UID string
	// ResourceVersion lets the change tracker drop no-op updates cheaply.
	ResourceVersion string

	Type       string   // ClusterIP, NodePort, LoadBalancer, ExternalName
	ClusterIPs []string // primary first, as in spec.clusterIPs; "None" for headless
	Ports      []ServicePort

	ExternalIPs              []string
	LoadBalancerIngress      []LoadBalancerIngress
	LoadBalancerSourceRanges []string

	SessionAffinity        string // "" or None, or ClientIP
	SessionAffinityTimeout int32  // seconds; 0 means the API default (10800)

	ExternalTrafficPolicy string // "" (Cluster), Cluster, Local
	InternalTrafficPolicy string // "" (Cluster), Cluster, Local
	HealthCheckNodePort   int32

	TrafficDistribution string // spec.trafficDistribution, "" when unset

	// IPVSScheduler is the AnnotationIPVSScheduler annotation: kproxy's
	// per-Service IPVS scheduler, "" when unset.
	IPVSScheduler string
	// LoadBalancing is the AnnotationLoadBalancing annotation, "" when
	// unset.
	LoadBalancing string
}

// AnnotationIPVSScheduler names the IPVS scheduler (rr, wrr, lc, wlc,
// lblc, lblcr, dh, sh, sed, nq, fo, ovf, mh, twos) of a Service's virtual
// servers in IPVS mode, overriding --ipvs-scheduler. kproxy's extension:
// upstream kube-proxy has one scheduler for every Service.
const AnnotationIPVSScheduler = "ipvs.kproxy.io/scheduler"

// AnnotationLoadBalancing chooses how a Service's endpoints are picked:
// random (upstream's behaviour and the default), round-robin,
// least-connections or source-hash. kproxy's extension; each proxy mode
// supports some of them (see the README).
const AnnotationLoadBalancing = "kproxy.io/load-balancing"

// Key returns the Service's namespace and name.
func (s *Service) Key() Key { return Key{s.Namespace, s.Name} }

// ServicePort is one entry of spec.ports.
type ServicePort struct {
	Name     string
	Protocol string // TCP, UDP, SCTP; "" means TCP
	Port     int32
	NodePort int32
}

// LoadBalancerIngress is one entry of status.loadBalancer.ingress that has an IP.
type LoadBalancerIngress struct {
	IP     string
	IPMode string // "" (VIP), VIP or Proxy
}

// EndpointSlice is the slim form of a discovery/v1 EndpointSlice.
type EndpointSlice struct {
	Namespace       string
	Name            string
	ResourceVersion string

	ServiceName string // the kubernetes.io/service-name label
	AddressType string // IPv4, IPv6, FQDN
	Ports       []EndpointPort
	Endpoints   []Endpoint
	// BadAddresses are the addresses, by endpoint index, that do not
	// parse as IP addresses (nil when every one does).
	BadAddresses map[int]string

	// TriggerTime is the endpoints.kubernetes.io/last-change-trigger-time
	// annotation, RFC 3339, or "" when absent.
	TriggerTime string
}

// Key returns the slice's namespace and name.
func (s *EndpointSlice) Key() Key { return Key{s.Namespace, s.Name} }

// ServiceKey returns the namespace and name of the Service the slice belongs to.
func (s *EndpointSlice) ServiceKey() Key { return Key{s.Namespace, s.ServiceName} }

// EndpointPort is one entry of an EndpointSlice's ports. Name "" is an
// unnamed port (the API server defaults a missing name to "").
type EndpointPort struct {
	Name     string
	Protocol string // "" means TCP
	Port     int32  // 0 means "all ports" in the API; the model skips it
}

// Endpoint is one entry of an EndpointSlice's endpoints. It is kept small
// (48 bytes, nothing of its own on the heap): at 10k Services × 100
// endpoints there are a million of them, and an address kept as text was
// a 16-byte allocation each (16 MB). The endpoint's zone is not kept:
// upstream's topology reads the hints, never the zone.
type Endpoint struct {
	// Addr is the first of the endpoint's addresses, the only one used,
	// as upstream does, parsed as ParseAddr does. It is invalid when the
	// endpoint has none (HasAddress false) or when that address does not
	// parse (the slice's BadAddresses keeps its text).
	Addr netip.Addr
	// Node is the endpoint's nodeName, one copy per name (OnNode).
	Node unique.Handle[string]
	// Hints are the topology hints; nil when the endpoint has none.
	Hints *Hints
	// Conditions as the slice states them (CondUnset when absent).
	Ready, Serving, Terminating Cond
	HasAddress                  bool
}

// OnNode returns the Node handle of a node name ("" gives the handle of
// no node).
func OnNode(name string) unique.Handle[string] {
	if name == "" {
		return unique.Handle[string]{}
	}
	return unique.Make(name)
}

// Cond is an endpoint condition: unset, true or false.
type Cond uint8

const (
	CondUnset Cond = iota
	CondTrue
	CondFalse
)

// CondOf returns the condition a *bool states (nil: unset).
func CondOf(b *bool) Cond {
	switch {
	case b == nil:
		return CondUnset
	case *b:
		return CondTrue
	}
	return CondFalse
}

// Or returns the condition, or def when it is unset.
func (c Cond) Or(def bool) bool {
	if c == CondUnset {
		return def
	}
	return c == CondTrue
}

// Hints are an endpoint's topology hints: hints.forZones and
// hints.forNodes names.
type Hints struct {
	Zones []string
	Nodes []string
}

// Node is the slim form of this node's core/v1 Node object.
type Node struct {
	Name            string
	ResourceVersion string
	Labels          map[string]string // only the labels kproxy reads (zone)
	PodCIDRs        []string
	InternalIPs     []string
	ExternalIPs     []string
	// Deleting is true once metadata.deletionTimestamp is set.
	Deleting bool
	// ToBeDeleted is true when the node carries the cluster autoscaler's
	// ToBeDeletedByClusterAutoscaler taint.
	ToBeDeleted bool
}

// Zone returns the topology.kubernetes.io/zone label, or "".
func (n *Node) Zone() string {
	if n == nil {
		return ""
	}
	return n.Labels[LabelTopologyZone]
}
