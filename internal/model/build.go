package model

import (
	"maps"
	"runtime"
	"slices"
	"sync"

	"github.com/kproxy/kproxy/internal/objects"
)

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
	// ServiceCIDRs holds the cluster's ServiceCIDR objects, sorted by name.
	// An object is replaced, never changed, when it changes: Update compares
	// them by pointer.
	ServiceCIDRs []*objects.ServiceCIDR
	// Balancing is the proxy mode's load-balancing default and support.
	// A change rebuilds every port.
	Balancing BalancingOptions
	// IgnoreExternalIPs is upstream's AllowServiceExternalIPs=false: no
	// port gets spec.externalIPs as frontends. A port they would make
	// externally accessible stays so (ServicePort.ExternallyAccessible), as
	// upstream reads the field itself there. A change rebuilds every port.
	IgnoreExternalIPs bool
	// Partial means Services and Slices hold only the Services an Update
	// names as changed (all others are unchanged since the previous
	// snapshot). Build cannot use such an input; Update can, as long as the
	// node's name and zone stay the same.
	Partial bool
}

// Build makes a Snapshot of the whole input. It also returns every problem
// found in the input (the same list Snapshot.Problems returns); the objects
// or parts with problems are skipped, nothing else is affected.
func Build(in Input) (*Snapshot, []Problem) {
	node, nodeProbs := makeNodeInfo(in.NodeName, in.Node)
	keys := slices.SortedFunc(maps.Keys(in.Services), objects.Key.Compare)
	v4, v6, svcProbs := buildParts(node, in, keys, builders(len(keys)))
	cidrs := parseServiceCIDRs(in.ServiceCIDRs)
	s := &Snapshot{
		Node:         node,
		V4:           NewFamilySnapshot(IPv4, v4),
		V6:           NewFamilySnapshot(IPv6, v6),
		ServiceCIDRs: cidrs.prefixes,
		node:         in.Node,
		nodeProblems: nodeProbs,
		svcProblems:  svcProbs,
		cidrs:        cidrs,
		balancing:    in.Balancing,
		noExtIPs:     in.IgnoreExternalIPs,
		gen:          snapshotGen.Add(1),
	}
	return s, s.Problems()
}

// parallelBuildMin is the Service count from which Build splits the
// Services between builders on several cores. Services are independent, so
// the parts are the same ports in the same order as one builder's. With two
// cores two builders take BenchmarkBuild10k from ~29 to ~23 ms (`go test
// -run '^$' -bench Build10k -cpu 2 ./internal/model/`; the allocator and
// the collector are what they share); the daemon's first sync at 10k × 100
// spends ~0.4 s in the model.
const parallelBuildMin = 2000

// builders is how many builders Build runs for services Services: up to
// GOMAXPROCS (at most 4) from parallelBuildMin on, else one.
func builders(services int) int {
	if services < parallelBuildMin {
		return 1
	}
	return min(runtime.GOMAXPROCS(0), 4)
}

// buildParts builds the ports of the Services keys (sorted), in order, and
// their problems, on n builders at once, each over a contiguous run of keys.
func buildParts(node NodeInfo, in Input, keys []objects.Key, n int) (v4, v6 []*ServicePort, probs map[objects.Key][]Problem) {
	type part struct {
		v4, v6 []*ServicePort
		probs  map[objects.Key][]Problem
	}
	parts := make([]part, n)
	var wg sync.WaitGroup
	for i := range parts {
		run := keys[i*len(keys)/n : (i+1)*len(keys)/n]
		wg.Go(func() {
			b := newBuilder(node, in)
			p := part{v4: make([]*ServicePort, 0, len(run))}
			for _, k := range run {
				b.service(k, in.Services[k], in.Slices[k], &p.v4, &p.v6)
			}
			p.probs = b.svcProblems
			parts[i] = p
		})
	}
	wg.Wait()
	if n == 1 {
		return parts[0].v4, parts[0].v6, parts[0].probs
	}
	var n4, n6 int
	for _, p := range parts {
		n4, n6 = n4+len(p.v4), n6+len(p.v6)
	}
	v4, v6 = make([]*ServicePort, 0, n4), make([]*ServicePort, 0, n6)
	for _, p := range parts {
		v4, v6 = append(v4, p.v4...), append(v6, p.v6...)
		for k, list := range p.probs {
			if probs == nil {
				probs = map[objects.Key][]Problem{}
			}
			probs[k] = list
		}
	}
	return v4, v6, probs
}

// Update makes a Snapshot that shares every unchanged ServicePort with prev and
// rebuilds only the Services named in changed (those added, updated or deleted,
// or whose slices changed). A nil prev, or a change of the node's name or
// zone (the only node facts ports depend on), rebuilds everything. The result
// equals Build(in). The problems returned are those of the rebuilt Services,
// of the Node when in.Node is another object than prev's, and of the
// ServiceCIDRs when in.ServiceCIDRs holds other objects than prev's.
func Update(prev *Snapshot, in Input, changed map[objects.Key]struct{}) (*Snapshot, []Problem) {
	if prev == nil || prev.V4 == nil || prev.V6 == nil {
		return Build(in)
	}
	node, nodeProbs := prev.Node, prev.nodeProblems
	var probs []Problem
	if in.Node != prev.node || in.NodeName != prev.Node.Name {
		node, nodeProbs = makeNodeInfo(in.NodeName, in.Node)
		probs = append(probs, nodeProbs...)
	}
	if node.Name != prev.Node.Name || node.Zone != prev.Node.Zone || !in.Balancing.equal(prev.balancing) ||
		in.IgnoreExternalIPs != prev.noExtIPs {
		return Build(in)
	}
	b := newBuilder(node, in)
	b.svcProblems = prev.svcProblems
	cidrs, parsed := updateServiceCIDRs(prev.cidrs, in.ServiceCIDRs)
	if parsed {
		probs = append(probs, cidrs.problems...)
	}
	keys := slices.SortedFunc(maps.Keys(changed), objects.Key.Compare)
	var v4, v6 []*ServicePort
	for _, k := range keys {
		probs = append(probs, b.service(k, in.Services[k], in.Slices[k], &v4, &v6)...)
	}
	return &Snapshot{
		Node:         node,
		V4:           prev.V4.replace(keys, v4),
		V6:           prev.V6.replace(keys, v6),
		ServiceCIDRs: cidrs.prefixes,
		node:         in.Node,
		nodeProblems: nodeProbs,
		svcProblems:  b.svcProblems,
		cidrs:        cidrs,
		balancing:    in.Balancing,
		noExtIPs:     in.IgnoreExternalIPs,
		gen:          snapshotGen.Add(1),
		parent:       prev.gen,
		changed:      keys,
	}, probs
}

// Problems returns every problem of the input the snapshot was built from:
// the Node's first, then the ServiceCIDRs' (by name), then each Service's
// (with its slices'), by Service key.
func (s *Snapshot) Problems() []Problem {
	out := slices.Clone(s.nodeProblems)
	out = append(out, s.cidrs.problems...)
	for _, k := range slices.SortedFunc(maps.Keys(s.svcProblems), objects.Key.Compare) {
		out = append(out, s.svcProblems[k]...)
	}
	return out
}

// builder makes the ports of one Service after another.
type builder struct {
	node      NodeInfo
	balancing BalancingOptions
	noExtIPs  bool // Input.IgnoreExternalIPs
	reader    endpointReader
	// svcProblems is copied before its first change (it may be prev's).
	svcProblems map[objects.Key][]Problem
	copied      bool
}

func newBuilder(node NodeInfo, in Input) *builder {
	return &builder{node: node, balancing: in.Balancing, noExtIPs: in.IgnoreExternalIPs, reader: endpointReader{node: objects.OnNode(node.Name)}}
}

// service appends the ports of the Service key, in each family, sorted by
// ID, to v4 and v6, records its problems and returns them.
func (b *builder) service(key objects.Key, svc *objects.Service, sl []*objects.EndpointSlice, v4, v6 *[]*ServicePort) []Problem {
	var list []Problem
	b.addPorts(key, svc, sl, [2]*[]*ServicePort{v4, v6}, &list)
	b.setProblems(key, list)
	return list
}

func (b *builder) addPorts(key objects.Key, svc *objects.Service, sl []*objects.EndpointSlice, dst [2]*[]*ServicePort, list *[]Problem) {
	probs := &problemList{kind: "Service", key: key, list: list}
	if svc != nil {
		probs.uid = svc.UID
	}
	if svc != nil && svc.Key() != key {
		probs.add("metadata", "filed under "+key.String()+" but named "+svc.Key().String())
		return
	}
	info := parseService(svc, b.balancing, probs)
	if info != nil && b.noExtIPs {
		info.ignoreExternalIPs()
	}
	if info == nil || len(info.ports) == 0 {
		return
	}
	b.reader.split(key, sl, list)
	for i, f := range families {
		if !info.clusterIP[i].IsValid() {
			continue
		}
		groups, localReady := b.reader.read(f, list)
		ports := make([]ServicePort, len(info.ports))
		for j, ps := range info.ports {
			p := &ports[j]
			*p = info.servicePort(key, f, ps)
			p.Endpoints = endpointsFor(groups, ps.key)
			p.LocalReadyEndpoints = localReady
			categorize(p, b.node.Name, b.node.Zone)
			*dst[i] = append(*dst[i], p)
		}
	}
}

// setProblems records the problems of the Service key (none removes it).
func (b *builder) setProblems(key objects.Key, list []Problem) {
	if _, had := b.svcProblems[key]; !had && len(list) == 0 {
		return
	}
	if !b.copied {
		b.svcProblems = maps.Clone(b.svcProblems)
		b.copied = true
	}
	if len(list) == 0 {
		delete(b.svcProblems, key)
		if len(b.svcProblems) == 0 {
			b.svcProblems = nil
			b.copied = false
		}
		return
	}
	if b.svcProblems == nil {
		b.svcProblems = map[objects.Key][]Problem{}
	}
	b.svcProblems[key] = list
}
