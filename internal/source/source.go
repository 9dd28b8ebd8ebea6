// Package source defines what kproxy's input sources (the Kubernetes API in
// source/api, a watched YAML file in source/file) deliver: slim objects and
// deletions, one event at a time, to a Handler (the change tracker).
package source

import "github.com/kproxy/kproxy/internal/objects"

// Kind names one kind of object a source lists.
type Kind int

const (
	Services Kind = iota
	EndpointSlices
	Nodes
	// ServiceCIDRs are the cluster's networking.k8s.io/v1 ServiceCIDR
	// objects. Unlike the other kinds they may never be listed (an API
	// server without the resource, RBAC that forbids it): nothing waits
	// for them, as upstream kube-proxy does not.
	ServiceCIDRs
)

func (k Kind) String() string {
	switch k {
	case Services:
		return "Services"
	case EndpointSlices:
		return "EndpointSlices"
	case Nodes:
		return "Node"
	case ServiceCIDRs:
		return "ServiceCIDRs"
	}
	return "unknown"
}

// Handler receives a source's events. Sources call it from their own
// goroutines; implementations must be safe for that. Objects passed in are
// never changed afterwards by the source, and the handler must not change
// them either.
//
// A source sends only objects kproxy proxies: a Service that becomes headless
// or gains the service-proxy-name label is reported as deleted. Deleting an
// object the handler does not know is not an error.
type Handler interface {
	// OnService reports a Service that was added or updated.
	OnService(svc *objects.Service)
	// OnServiceDeleted reports that the Service key is gone.
	OnServiceDeleted(key objects.Key)
	// OnSlice reports an EndpointSlice that was added or updated.
	OnSlice(slice *objects.EndpointSlice)
	// OnSliceDeleted reports that the EndpointSlice key is gone.
	OnSliceDeleted(key objects.Key)
	// OnNode reports this node's Node object (added or updated).
	OnNode(node *objects.Node)
	// OnNodeDeleted reports that this node's Node object is gone (the
	// tracker keeps its last state, as upstream does).
	OnNodeDeleted()
	// OnServiceCIDR reports a ServiceCIDR that was added or updated.
	OnServiceCIDR(c *objects.ServiceCIDR)
	// OnServiceCIDRDeleted reports that the ServiceCIDR called name is gone.
	OnServiceCIDRDeleted(name string)
	// OnSynced reports that kind has been listed completely once. It is
	// called once per kind, after the events of the initial list.
	OnSynced(kind Kind)
}
