package model

import "slices"

// categorize fills the endpoint sets of p from p.Endpoints, with upstream's
// rules (pkg/proxy/topology.go):
//   - cluster endpoints (only when the port uses the Cluster policy): the
//     ready endpoints allowed by the topology hints; if none, the serving and
//     terminating ones;
//   - local endpoints (only when the port uses the Local policy): the ready
//     endpoints on this node; if none, the serving and terminating ones on
//     this node (decided independently of the cluster set);
//   - HasEndpoints: any usable (ready, or serving and terminating) endpoint
//     exists anywhere;
//   - AllReachable: the union of both sets.
func categorize(p *ServicePort, nodeName, zone string) {
	eps := p.Endpoints
	if len(eps) == 0 {
		return
	}
	usesCluster, usesLocal := p.UsesClusterEndpoints(), p.UsesLocalEndpoints()
	if usesCluster {
		p.TopologyMode = topologyMode(eps, nodeName, zone)
		p.ClusterEndpoints = clusterEndpoints(eps, p.TopologyMode, nodeName, zone)
		p.HasEndpoints = len(p.ClusterEndpoints) > 0
	}
	if !usesLocal {
		p.AllReachable = p.ClusterEndpoints
		return
	}
	var fallback bool
	p.LocalEndpoints, fallback = localEndpoints(eps)
	p.HasEndpoints = p.HasEndpoints || anyUsable(eps)
	switch {
	case !usesCluster:
		p.AllReachable = p.LocalEndpoints
	case p.TopologyMode == "" && !fallback:
		// Every ready endpoint is a cluster endpoint, and the local ones are
		// ready: the cluster set holds the local one.
		p.AllReachable = p.ClusterEndpoints
	default:
		p.AllReachable = union(eps, p.ClusterEndpoints, p.LocalEndpoints)
	}
}

// clusterEndpoints returns the ready endpoints allowed by the topology mode,
// or, when there are none, the serving and terminating ones.
func clusterEndpoints(eps []*Endpoint, mode, nodeName, zone string) []*Endpoint {
	out := filter(eps, func(ep *Endpoint) bool {
		return ep.Ready && availableForTopology(ep, mode, nodeName, zone)
	})
	if out == nil {
		out = filter(eps, servingTerminating)
	}
	return out
}

// localEndpoints returns the ready endpoints on this node or, when there are
// none, the serving and terminating ones on this node (fallback true).
func localEndpoints(eps []*Endpoint) (out []*Endpoint, fallback bool) {
	if out = filter(eps, func(ep *Endpoint) bool { return ep.IsLocal && ep.Ready }); out != nil {
		return out, false
	}
	out = filter(eps, func(ep *Endpoint) bool { return ep.IsLocal && servingTerminating(ep) })
	return out, out != nil
}

func servingTerminating(ep *Endpoint) bool { return ep.Serving && ep.Terminating }

// anyUsable reports whether any endpoint is ready, or serving and terminating.
func anyUsable(eps []*Endpoint) bool {
	return slices.ContainsFunc(eps, func(ep *Endpoint) bool { return ep.Ready || servingTerminating(ep) })
}

// topologyMode decides from the hints of the ready endpoints, as upstream:
// PreferSameNode when every ready endpoint has a node hint and one names
// this node; else PreferSameZone when every ready endpoint has a zone hint
// and one names this node's zone; else "" (hints ignored).
func topologyMode(eps []*Endpoint, nodeName, zone string) string {
	anyReady := false
	allNode, forNode := true, false
	allZone, forZone := true, false
	for _, ep := range eps {
		if !ep.Ready {
			continue
		}
		anyReady = true
		if len(ep.NodeHints()) == 0 {
			allNode = false
		} else if slices.Contains(ep.NodeHints(), nodeName) {
			forNode = true
		}
		if len(ep.ZoneHints()) == 0 {
			allZone = false
		} else if slices.Contains(ep.ZoneHints(), zone) {
			forZone = true
		}
	}
	switch {
	case !anyReady:
		return ""
	case allNode && forNode:
		return TopologyPreferSameNode
	case allZone && forZone:
		return TopologyPreferSameZone
	}
	return ""
}

// availableForTopology reports whether ep may take this node's cluster
// traffic under the topology mode.
func availableForTopology(ep *Endpoint, mode, nodeName, zone string) bool {
	switch mode {
	case "":
		return true
	case TopologyPreferSameNode:
		return slices.Contains(ep.NodeHints(), nodeName)
	case TopologyPreferSameZone:
		return slices.Contains(ep.ZoneHints(), zone)
	}
	return false
}

// filter returns the endpoints that keep accepts, in order: eps itself when
// it accepts them all, nil when none.
func filter(eps []*Endpoint, keep func(*Endpoint) bool) []*Endpoint {
	n := 0
	for _, ep := range eps {
		if keep(ep) {
			n++
		}
	}
	switch n {
	case 0:
		return nil
	case len(eps):
		return eps
	}
	out := make([]*Endpoint, 0, n)
	for _, ep := range eps {
		if keep(ep) {
			out = append(out, ep)
		}
	}
	return out
}

// union returns the endpoints of all that are in a or b, in the order of
// all; a and b are subsequences of all.
func union(all, a, b []*Endpoint) []*Endpoint {
	out := make([]*Endpoint, 0, len(a)+len(b))
	i, j := 0, 0
	for _, ep := range all {
		inA := i < len(a) && a[i] == ep
		inB := j < len(b) && b[j] == ep
		if inA {
			i++
		}
		if inB {
			j++
		}
		if inA || inB {
			out = append(out, ep)
		}
	}
	switch len(out) {
	case 0:
		return nil
	case len(all):
		return all
	}
	return out
}
