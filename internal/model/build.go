package model

import "github.com/kproxy/kproxy/internal/objects"

// Input is everything the model reads: the current Services, the EndpointSlices
// grouped by the Service they belong to, and this node's Node object.
// Build does not modify it.
type Input struct {
	// NodeName is this node's name (hostname-override or the host name).
	NodeName string
	// Node is this node's Node object; nil when not (yet) known.
	Node *objects.Node
	// Services holds the Services to proxy, keyed by namespace/name. Sources
	// already dropped headless Services and those with a service-proxy-name label.
	Services map[objects.Key]*objects.Service
	// Slices holds EndpointSlices keyed by the namespace/name of their Service.
	Slices map[objects.Key][]*objects.EndpointSlice
}

// Build makes a Snapshot of the whole input.
// TODO(model): implemented by the model package owner.
func Build(in Input) (*Snapshot, []Problem) {
	return Update(nil, in, nil)
}

// Update makes a Snapshot that shares every unchanged ServicePort with prev and
// rebuilds only the Services named in changed (those added, updated or deleted,
// or whose slices changed). A nil prev, or a change of the node's name, zone or
// existence, rebuilds everything. The result equals Build(in).
func Update(prev *Snapshot, in Input, changed map[objects.Key]struct{}) (*Snapshot, []Problem) {
	return &Snapshot{V4: &FamilySnapshot{Family: IPv4, ByID: map[PortID]*ServicePort{}}, V6: &FamilySnapshot{Family: IPv6, ByID: map[PortID]*ServicePort{}}}, nil
}
