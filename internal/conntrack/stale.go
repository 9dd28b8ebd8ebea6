// Package conntrack keeps the kernel's connection-tracking table in step with
// the Services kproxy programs: it deletes UDP and SCTP entries that still send
// a Service's traffic to an endpoint that no longer serves it (or that were
// created while the Service had no endpoint), deletes TCP SYNs that reached a
// frontend before its rules did (so that their retransmits are DNATed), and
// sets the nf_conntrack sysctls from the KubeProxyConfiguration's conntrack
// block.
//
// The decision is pure (NewPlan, Plan.Stale); the kernel is behind the small
// Table interface, with a netlink implementation and a fake for tests.
package conntrack

import (
	"iter"
	"net/netip"
	"slices"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/objects"
)

// Flow is the part of a conntrack entry the cleanup looks at.
type Flow struct {
	Protocol model.Protocol
	// OrigDst is the original destination: a Service frontend (ClusterIP,
	// external or load-balancer IP with the service port, or any address with
	// a NodePort).
	OrigDst netip.AddrPort
	// ReplySrc is where replies come from: the endpoint the flow was DNATed to,
	// or OrigDst when it was not DNATed.
	ReplySrc netip.AddrPort
	// SynSent is true for a TCP flow still waiting for its first answer.
	SynSent bool
}

type frontend struct {
	proto model.Protocol
	addr  netip.AddrPort
}

type nodePort struct {
	proto model.Protocol
	port  uint16
}

// target is one frontend's serving endpoints, and whether they changed in
// this sync (only changed frontends are cleaned in a partial plan).
type target struct {
	serving map[netip.AddrPort]struct{}
	changed bool
	// unnatedOnly restricts a TCP frontend to SYN_SENT flows that were not
	// DNATed.
	unnatedOnly bool
}

// Plan says which flows of one IP family are stale. Build it with NewPlan.
// Stale is not safe for concurrent use: it builds the index on first need.
type Plan struct {
	Family     model.Family
	prev, next *model.FamilySnapshot
	full       bool
	// changed yields each port of next the plan compares with its
	// version in prev (nil: new).
	changed  iter.Seq2[*model.ServicePort, *model.ServicePort]
	compared int // ports changed yielded (tests check a partial plan's)
	nChanged int
	// protos has the protocols of the frontends cleaned.
	protos map[model.Protocol]bool
	// The frontend index, built when the first flow that could be stale is
	// judged (indexed is then true).
	indexed bool
	byAddr  map[frontend]*target
	byNode  map[nodePort]*target
	// local tells the node's own addresses (nil: unknown, every address
	// counts); an unanswered TCP flow is judged by a NodePort only when it
	// went to one of them.
	local func(netip.Addr) bool
	// synsOnly restricts the plan to its TCP part: un-DNATed SYNs to TCP
	// frontends that became reachable (a walk before the commit).
	synsOnly bool
}

// CleansProtocol reports whether stale flows of protocol p are cleaned: UDP as
// upstream kube-proxy does, and SCTP too. TCP flows to a gone endpoint fail
// by themselves (RST), so they are left alone.
func CleansProtocol(p model.Protocol) bool {
	return p == model.UDP || p == model.SCTP
}

// NewPlan computes the stale-flow rules for one family after a sync that
// moved the kernel from prev to next (prev may be nil). As upstream v1.36
// does, every UDP and SCTP frontend with at least one serving endpoint is
// indexed with its serving endpoints; traffic policies, topology and
// terminating state are ignored, so that UDP behaves like TCP for existing
// flows. A frontend with no serving endpoint is left alone.
//
// When full is false only frontends whose serving endpoints or addresses
// changed since prev are cleaned (the others cannot have new stale flows); a
// full plan cleans every frontend.
//
// TCP frontends that just became reachable (new, moved, or their first
// serving endpoint) are indexed too, for one kind of flow only (not done by
// upstream): a SYN that was never DNATed because it arrived before the
// rules. A client whose first SYN was lost retransmits it with the same
// addresses and ports; while that entry lives (SYN_SENT, refreshed by each
// retransmit) the retransmits match it and bypass the DNAT, so the connect
// would hang until it times out.
//
// NewPlan only counts the frontends to clean; the index of frontends is
// built when the first flow that could be stale is judged (a UDP or SCTP
// flow, or an un-DNATed TCP SYN). A table of established TCP flows, the
// usual one at a cold start, is walked without it: at 10k Services the
// index was ~7 MB allocated at the cold start's memory peak.
func NewPlan(prev, next *model.FamilySnapshot, full bool) *Plan {
	return newPlan(prev, next, full, false)
}

// NewSYNPlan is NewPlan restricted to TCP: it judges stale only the
// un-DNATed SYNs to TCP frontends that the sync from prev to next makes
// reachable, and no UDP or SCTP flow. It is for a walk before that sync is
// committed (see Cleaner.CleanSYNs).
func NewSYNPlan(prev, next *model.FamilySnapshot, full bool) *Plan {
	return newPlan(prev, next, full, true)
}

func newPlan(prev, next *model.FamilySnapshot, full, synsOnly bool) *Plan {
	p := &Plan{prev: prev, next: next, full: full, synsOnly: synsOnly}
	p.changed = func(yield func(port, old *model.ServicePort) bool) {
		for port, old := range withPrev(prev, next) {
			if (full || old != port) && !yield(port, old) {
				return
			}
		}
	}
	return p.count()
}

// NewPartialPlan is NewPlan(prev, next, false) when only the ports of the
// Services in changed can differ between prev and next (every other port
// is the same *ServicePort in both: model.Snapshot.ChangedSince). It looks
// at those ports only: the plan of a single change costs nothing
// proportional to the cluster (comparing every port was 1.4 ms per sync at
// 10k Services, half of kproxy's CPU under 100 changes/s).
func NewPartialPlan(prev, next *model.FamilySnapshot, changed []objects.Key) *Plan {
	return newPartialPlan(prev, next, changed, false)
}

// NewPartialSYNPlan is NewPartialPlan restricted to TCP, as NewSYNPlan.
func NewPartialSYNPlan(prev, next *model.FamilySnapshot, changed []objects.Key) *Plan {
	return newPartialPlan(prev, next, changed, true)
}

func newPartialPlan(prev, next *model.FamilySnapshot, changed []objects.Key, synsOnly bool) *Plan {
	p := &Plan{prev: prev, next: next, synsOnly: synsOnly}
	p.changed = func(yield func(port, old *model.ServicePort) bool) {
		if next == nil {
			return
		}
		for _, k := range changed {
			for _, port := range next.ServicePorts(k) {
				var old *model.ServicePort
				if prev != nil {
					old = prev.Port(port.ID)
				}
				if old != port && !yield(port, old) {
					return
				}
			}
		}
	}
	return p.count()
}

// count counts the frontends the plan cleans.
func (p *Plan) count() *Plan {
	if p.next == nil {
		return p
	}
	p.Family = p.next.Family
	for port, old := range p.changed {
		p.compared++
		if p.synsOnly && port.Protocol != model.TCP {
			continue
		}
		if cleans(old, port, p.full) {
			// The common single-endpoint change of a TCP Service has
			// none: no index, no table walk, and no work proportional
			// to the cluster.
			p.nChanged++
			if p.protos == nil {
				p.protos = map[model.Protocol]bool{}
			}
			p.protos[port.Protocol] = true
		}
	}
	return p
}

// index builds the frontend index: every UDP and SCTP port (those unchanged
// too, so that a flow is never judged by another Service's NodePort that
// happens to equal its port), and the TCP ports that became reachable.
func (p *Plan) index() {
	p.indexed = true
	p.byAddr, p.byNode = map[frontend]*target{}, map[nodePort]*target{}
	var olds map[*model.ServicePort]*model.ServicePort // changed UDP/SCTP ports of a partial plan
	for port, old := range p.changed {
		switch {
		case port.Protocol == model.TCP:
			// Only un-DNATed SYNs are judged: no serving set needed.
			if cleans(old, port, p.full) {
				p.add(port, reachableTCP)
			}
		case p.synsOnly:
		case CleansProtocol(port.Protocol) && !p.full:
			if olds == nil {
				olds = map[*model.ServicePort]*model.ServicePort{}
			}
			olds[port] = old
		}
	}
	for _, port := range p.next.Ports {
		if p.synsOnly || !CleansProtocol(port.Protocol) {
			continue
		}
		// Indexed even without serving endpoints (then never cleaned).
		// A full plan cleans every port cleans allows whatever its past.
		changed := p.full && cleans(port, port, true)
		if old, ok := olds[port]; ok {
			changed = cleans(old, port, false)
		}
		p.add(port, &target{serving: servingSet(port), changed: changed})
	}
}

// reachableTCP is the target of every TCP frontend a plan indexes.
var reachableTCP = &target{changed: true, unnatedOnly: true}

// cleans reports whether a plan from old (nil: the port is new) cleans
// port's frontends: a TCP port that became reachable (un-DNATed SYNs only),
// or a UDP or SCTP port whose frontends or serving endpoints changed (every
// one in a full plan); never a port without a serving endpoint.
func cleans(old, port *model.ServicePort, full bool) bool {
	if !hasServing(port) {
		return false
	}
	switch {
	case port.Protocol == model.TCP:
		return becameReachable(old, port, full)
	case CleansProtocol(port.Protocol):
		return full || portChanged(old, port)
	}
	return false
}

// withPrev yields each port of next with its version in prev (nil when
// new). Both lists are sorted by ID and unchanged ports are shared between
// snapshots, so a merge walk finds them without a lookup per port (were the
// order ever different, a port would only look new, which makes the plan be
// built: more work, never a missed flow).
func withPrev(prev, next *model.FamilySnapshot) iter.Seq2[*model.ServicePort, *model.ServicePort] {
	return func(yield func(port, old *model.ServicePort) bool) {
		var before []*model.ServicePort
		if prev != nil {
			before = prev.Ports
		}
		j := 0
		for _, port := range next.Ports {
			for j < len(before) && before[j].ID.Less(port.ID) {
				j++
			}
			var old *model.ServicePort
			if j < len(before) && before[j].ID == port.ID {
				old = before[j]
			}
			if !yield(port, old) {
				return
			}
		}
	}
}

func hasServing(port *model.ServicePort) bool {
	for _, ep := range port.Endpoints {
		if ep.Serving {
			return true
		}
	}
	return false
}

// add indexes every frontend of port.
func (p *Plan) add(port *model.ServicePort, t *target) {
	for _, ip := range frontendIPs(port) {
		p.byAddr[frontend{port.Protocol, netip.AddrPortFrom(ip, port.Port)}] = t
	}
	if port.NodePort != 0 {
		p.byNode[nodePort{port.Protocol, port.NodePort}] = t
	}
}

func frontendIPs(port *model.ServicePort) []netip.Addr {
	ips := make([]netip.Addr, 0, 1+len(port.ExternalIPs)+len(port.LoadBalancerIPs))
	if port.ClusterIP.IsValid() {
		ips = append(ips, port.ClusterIP)
	}
	ips = append(ips, port.ExternalIPs...)
	return append(ips, port.LoadBalancerIPs...)
}

// servingSet returns the addresses of the port's serving endpoints.
func servingSet(port *model.ServicePort) map[netip.AddrPort]struct{} {
	set := map[netip.AddrPort]struct{}{}
	for _, ep := range port.Endpoints {
		if ep.Serving {
			set[ep.AddrPort()] = struct{}{}
		}
	}
	return set
}

// portChanged reports whether stale flows may exist for next that did not
// for old: the port is new, its frontends moved or its serving endpoints
// changed. Snapshots share unchanged ports, so the common case is a pointer
// comparison.
func portChanged(old, next *model.ServicePort) bool {
	if old == next {
		return false
	}
	if old == nil {
		return true
	}
	if frontendsMoved(old, next) {
		return true
	}
	oldSet, nextSet := servingSet(old), servingSet(next)
	if len(oldSet) != len(nextSet) {
		return true
	}
	for a := range nextSet {
		if _, ok := oldSet[a]; !ok {
			return true
		}
	}
	return false
}

// becameReachable reports whether a TCP port's frontends can have flows from
// before they had rules: the port is new, its frontends moved, or it had no
// serving endpoint before. A full sync counts every port.
func becameReachable(old, next *model.ServicePort, full bool) bool {
	if full || old == nil {
		return true
	}
	if old == next {
		return false
	}
	return frontendsMoved(old, next) || !hasServing(old)
}

// frontendsMoved reports whether a port's frontends differ between two
// versions.
func frontendsMoved(old, next *model.ServicePort) bool {
	return old.Port != next.Port || old.NodePort != next.NodePort || old.ClusterIP != next.ClusterIP ||
		!slices.Equal(old.ExternalIPs, next.ExternalIPs) || !slices.Equal(old.LoadBalancerIPs, next.LoadBalancerIPs)
}

// Empty reports whether the plan can match no flow, so the table need not be
// listed at all.
func (p *Plan) Empty() bool { return p == nil || p.nChanged == 0 }

// Scopes returns the parts of the table that can hold stale flows, one walk
// each: the UDP and SCTP entries when frontends of that protocol are
// cleaned, the unanswered TCP entries when TCP frontends became reachable.
// An empty plan has none.
func (p *Plan) Scopes() []Scope {
	var out []Scope
	for _, proto := range []model.Protocol{model.UDP, model.SCTP, model.TCP} {
		if p != nil && p.protos[proto] {
			out = append(out, Scope{Protocol: proto, Unreplied: proto == model.TCP})
		}
	}
	return out
}

// Stale reports whether f should be deleted: its original destination is a
// cleaned frontend and its reply source is not one of that frontend's
// serving endpoints. A flow to a Service IP is judged by that Service only;
// the NodePort index is consulted for other destinations.
func (p *Plan) Stale(f Flow) bool {
	if p.Empty() || !CleansProtocol(f.Protocol) && !unnatedSYN(f) || p.synsOnly && !unnatedSYN(f) {
		return false
	}
	if !p.indexed {
		p.index()
	}
	t, ok := p.byAddr[frontend{f.Protocol, unmap(f.OrigDst)}]
	if !ok {
		t, ok = p.byNode[nodePort{f.Protocol, f.OrigDst.Port()}]
		if ok && f.Protocol == model.TCP && p.local != nil && !p.local(f.OrigDst.Addr().Unmap()) {
			return false
		}
	}
	if !ok || !t.changed {
		return false
	}
	if t.unnatedOnly || f.Protocol == model.TCP {
		return t.unnatedOnly && unnatedSYN(f)
	}
	_, serving := t.serving[unmap(f.ReplySrc)]
	return !serving
}

// unnatedSYN reports whether f is a TCP SYN that was not DNATed.
func unnatedSYN(f Flow) bool {
	return f.Protocol == model.TCP && f.SynSent && unmap(f.ReplySrc) == unmap(f.OrigDst)
}

func unmap(a netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
}
