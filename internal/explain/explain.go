// Package explain answers "a new connection from this address to that
// Service address and port, on this node: where does it go, and why?" from
// the same model.Snapshot and dataplane.Config the dataplanes render. The
// endpoint sets, topology choice and policies are the model's own results
// (ServicePort.ClusterEndpoints, LocalEndpoints, TopologyMode, …); this
// package only picks which of them applies to the packet and says why the
// others were left out. It is pure: no I/O.
package explain

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/model"
)

// Request is the packet to explain: the first packet of a new connection.
type Request struct {
	From     netip.Addr
	To       netip.AddrPort
	Protocol model.Protocol
}

// ParseTo parses IP:PORT[/tcp|udp|sctp] (IPv6 as [IP]:PORT); TCP when the
// protocol is left out.
func ParseTo(s string) (netip.AddrPort, model.Protocol, error) {
	addr, proto, _ := strings.Cut(s, "/")
	p := model.TCP
	switch strings.ToLower(proto) {
	case "", "tcp":
	case "udp":
		p = model.UDP
	case "sctp":
		p = model.SCTP
	default:
		return netip.AddrPort{}, "", fmt.Errorf("protocol %q: want tcp, udp or sctp", proto)
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return netip.AddrPort{}, "", fmt.Errorf("%q: want IP:PORT ([IP]:PORT for IPv6): %v", addr, err)
	}
	if ap.Port() == 0 {
		return netip.AddrPort{}, "", fmt.Errorf("%q: port 0 is no Service port", addr)
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), p, nil
}

// Verdict is what happens to the packet.
type Verdict string

const (
	// Forward: DNAT to one of Endpoints.
	Forward Verdict = "forward"
	// Reject: answered with an ICMP unreachable (TCP: connection refused).
	Reject Verdict = "reject"
	// Drop: silently dropped.
	Drop Verdict = "drop"
	// NotProxied: no Service frontend matches; the node routes the packet
	// as any other.
	NotProxied Verdict = "not-proxied"
)

// Frontend kinds.
const (
	FrontendClusterIP    = "ClusterIP"
	FrontendNodePort     = "NodePort"
	FrontendLoadBalancer = "LoadBalancer"
	FrontendExternalIP   = "ExternalIP"
)

// Source kinds: where the packet comes from, as the proxy tells it.
const (
	SourceNode     = "node"      // this node itself
	SourceLocalPod = "local-pod" // a pod on this node
	SourceCluster  = "cluster"   // local traffic by the detect-local mode, not of this node
	SourceExternal = "external"  // outside the cluster
)

// Answer is the path of one new connection.
type Answer struct {
	From     netip.Addr     `json:"from"`
	To       netip.AddrPort `json:"to"`
	Protocol model.Protocol `json:"protocol"`
	Node     string         `json:"node"`
	Mode     string         `json:"mode"`

	Source       string `json:"source"`
	SourceReason string `json:"sourceReason"`

	// Service and Frontend are empty when no frontend matches.
	Service  string `json:"service,omitempty"`
	Frontend string `json:"frontend,omitempty"`
	// Steps are the policies applied, in order.
	Steps []Step `json:"steps"`

	Verdict Verdict `json:"verdict"`
	Reason  string  `json:"reason"`

	// Endpoints are the endpoints a new connection may go to, each with
	// its probability; Excluded the Service port's other endpoints, with
	// why.
	Endpoints []Choice   `json:"endpoints,omitempty"`
	Excluded  []Excluded `json:"excluded,omitempty"`
	// Affinity is the ClientIP session affinity timeout in seconds (0: none).
	Affinity int32 `json:"affinitySeconds,omitempty"`
	// Balancing is the Service port's load-balancing algorithm (random,
	// round-robin, least-connections, source-hash).
	Balancing string `json:"balancing,omitempty"`
	// Scheduler is IPVS mode's scheduler for the virtual server.
	Scheduler string `json:"scheduler,omitempty"`

	Masquerade       bool   `json:"masquerade"`
	MasqueradeReason string `json:"masqueradeReason,omitempty"`
}

// Step is one policy applied to the packet.
type Step struct {
	Policy string `json:"policy"`
	Result string `json:"result"`
}

// Choice is an endpoint a new connection may be DNATed to.
type Choice struct {
	Endpoint    netip.AddrPort `json:"endpoint"`
	Probability float64        `json:"probability"`
	Local       bool           `json:"local"`
	State       string         `json:"state"`
}

// Excluded is an endpoint left out, with the reason.
type Excluded struct {
	Endpoint netip.AddrPort `json:"endpoint"`
	Reason   string         `json:"reason"`
}

// Input is what the answer is computed from.
type Input struct {
	Snapshot *model.Snapshot
	Config   dataplane.Config
	// Mode is the proxy mode: nftables, iptables, ipvs or userspace.
	Mode string
	// NodeAddrs are the node's own addresses (the Node object's and
	// Config.NodeIPs when empty).
	NodeAddrs []netip.Addr
}

// ErrBadRequest is returned for a request that cannot be answered (a
// family mismatch, an unknown node).
var ErrBadRequest = errors.New("explain")

// Explain returns the path of req on the snapshot's node.
func Explain(in Input, req Request) (*Answer, error) {
	snap := in.Snapshot
	from, to := req.From.Unmap(), netip.AddrPortFrom(req.To.Addr().Unmap(), req.To.Port())
	if !from.IsValid() || !to.Addr().IsValid() {
		return nil, fmt.Errorf("%w: --from and --to need an address", ErrBadRequest)
	}
	if model.FamilyOf(from) != model.FamilyOf(to.Addr()) {
		return nil, fmt.Errorf("%w: %s and %s are of different IP families", ErrBadRequest, from, to.Addr())
	}
	if !snap.Node.Known {
		return nil, fmt.Errorf("%w: node %q is not known (no such Node object)", ErrBadRequest, snap.Node.Name)
	}
	fam := model.FamilyOf(to.Addr())
	a := &Answer{From: from, To: to, Protocol: req.Protocol, Node: snap.Node.Name, Mode: in.Mode}
	e := &explainer{in: in, a: a, nodeAddrs: nodeAddrs(in)}
	a.Source, a.SourceReason = e.source(from)
	if !slices.Contains(in.Config.Families, fam) && len(in.Config.Families) > 0 {
		a.Verdict, a.Reason = NotProxied, fmt.Sprintf("kproxy does not proxy %s on this node", fam)
		return a, nil
	}
	port, frontend := e.match(snap.Family(fam), req.Protocol, to)
	if port == nil {
		e.unmatched(snap, fam, to)
		return a, nil
	}
	a.Service, a.Frontend = port.ID.String(), frontend
	e.service(port, frontend)
	return a, nil
}

// modeUserspace is the mode in which kproxy relays connections itself: no
// DNAT, and what upstream rejects or drops is a socket that is not there
// (refused) or one that turns the client away.
const modeUserspace = "userspace"

type explainer struct {
	in        Input
	a         *Answer
	nodeAddrs []netip.Addr
}

func nodeAddrs(in Input) []netip.Addr {
	if len(in.NodeAddrs) > 0 {
		return in.NodeAddrs
	}
	var out []netip.Addr
	out = append(out, in.Snapshot.Node.InternalIPs...)
	out = append(out, in.Snapshot.Node.ExternalIPs...)
	for _, ip := range in.Config.NodeIPs {
		if ip.IsValid() && !ip.IsUnspecified() && !slices.Contains(out, ip) {
			out = append(out, ip)
		}
	}
	return out
}

func (e *explainer) step(policy, format string, args ...any) {
	e.a.Steps = append(e.a.Steps, Step{Policy: policy, Result: fmt.Sprintf(format, args...)})
}

// source classifies the client as the detect-local mode does.
func (e *explainer) source(from netip.Addr) (string, string) {
	node := e.in.Snapshot.Node
	if slices.Contains(e.nodeAddrs, from) || from.IsLoopback() {
		return SourceNode, "an address of node " + node.Name
	}
	onNode := containedIn(node.PodCIDRs, from)
	cfg := e.in.Config
	switch e.localMode() {
	case dataplane.LocalClusterCIDR:
		if p, ok := containing(cfg.ClusterCIDRs, from); ok {
			if onNode {
				return SourceLocalPod, fmt.Sprintf("in this node's pod CIDR, and in the cluster CIDR %s (detect-local ClusterCIDR)", p)
			}
			return SourceCluster, fmt.Sprintf("in the cluster CIDR %s (detect-local ClusterCIDR), not in this node's pod CIDRs", p)
		}
		return SourceExternal, "not in the cluster CIDRs (detect-local ClusterCIDR)"
	case dataplane.LocalNodeCIDR:
		if onNode {
			return SourceLocalPod, "in this node's pod CIDR (detect-local NodeCIDR)"
		}
		return SourceExternal, "not in this node's pod CIDRs (detect-local NodeCIDR)"
	case dataplane.LocalBridgeInterface, dataplane.LocalInterfacePrefix:
		// The mode looks at the input interface, which an address does
		// not tell: pods are assumed to be in the node's pod CIDRs.
		if onNode {
			return SourceLocalPod, fmt.Sprintf("in this node's pod CIDR, so assumed to arrive from a pod interface (detect-local %s)", cfg.LocalMode)
		}
		return SourceExternal, fmt.Sprintf("not in this node's pod CIDRs, so assumed not to arrive from a pod interface (detect-local %s)", cfg.LocalMode)
	}
	if onNode {
		return SourceLocalPod, "in this node's pod CIDR (no detect-local mode: the proxy does not tell pods from outside)"
	}
	return SourceExternal, "not an address of this node or its pods (no detect-local mode)"
}

// localMode is the detect-local mode in effect for the packet's family:
// none when the mode has nothing to compare with (ClusterCIDR without a
// cluster CIDR of the family, NodeCIDR without a pod CIDR), as upstream.
func (e *explainer) localMode() dataplane.LocalMode {
	cfg := e.in.Config
	fam := model.FamilyOf(e.a.From)
	ofFamily := func(ps []netip.Prefix) bool {
		return slices.ContainsFunc(ps, func(p netip.Prefix) bool { return model.FamilyOf(p.Addr()) == fam })
	}
	switch cfg.LocalMode {
	case dataplane.LocalClusterCIDR:
		if !ofFamily(cfg.ClusterCIDRs) {
			return dataplane.LocalNone
		}
	case dataplane.LocalNodeCIDR:
		if !ofFamily(e.in.Snapshot.Node.PodCIDRs) {
			return dataplane.LocalNone
		}
	}
	return cfg.LocalMode
}

// isLocal is the detect-local decision the masquerade rules take.
func (e *explainer) isLocal() bool {
	if e.localMode() == dataplane.LocalNone {
		return false
	}
	return e.a.Source == SourceLocalPod || e.a.Source == SourceCluster
}

// match finds the service port and frontend for to: Service IPs first,
// then NodePorts on the node's addresses.
func (e *explainer) match(fs *model.FamilySnapshot, proto model.Protocol, to netip.AddrPort) (*model.ServicePort, string) {
	var byNode *model.ServicePort
	nodePort := e.isNodePortAddr(to.Addr())
	for _, p := range fs.Ports {
		if p.Protocol != proto {
			continue
		}
		if p.Port == to.Port() {
			switch {
			case p.ClusterIP == to.Addr():
				return p, FrontendClusterIP
			case slices.Contains(p.ExternalIPs, to.Addr()):
				return p, FrontendExternalIP
			case slices.Contains(p.LoadBalancerIPs, to.Addr()):
				return p, FrontendLoadBalancer
			}
		}
		if nodePort && p.NodePort == to.Port() && byNode == nil {
			byNode = p
		}
	}
	if byNode != nil {
		return byNode, FrontendNodePort
	}
	return nil, ""
}

// isNodePortAddr reports whether NodePorts are served on addr here.
func (e *explainer) isNodePortAddr(addr netip.Addr) bool {
	cfg := e.in.Config
	if addr.IsLoopback() {
		// Upstream: only iptables mode, IPv4, unless turned off.
		return e.in.Mode == "iptables" && addr.Is4() && !cfg.NoLocalhostNodePorts
	}
	if !slices.Contains(e.nodeAddrs, addr) {
		return false
	}
	if len(cfg.NodePortAddresses) == 0 {
		return true
	}
	for _, s := range cfg.NodePortAddresses {
		if s == "primary" && slices.Contains(cfg.NodeIPs, addr) {
			return true
		}
		if p, err := netip.ParsePrefix(strings.TrimSpace(s)); err == nil && p.Contains(addr) {
			return true
		}
	}
	return false
}

// unmatched explains a packet no frontend takes.
func (e *explainer) unmatched(snap *model.Snapshot, fam model.Family, to netip.AddrPort) {
	a := e.a
	var ports []string
	for _, p := range snap.Family(fam).Ports {
		if p.ClusterIP == to.Addr() || slices.Contains(p.ExternalIPs, to.Addr()) || slices.Contains(p.LoadBalancerIPs, to.Addr()) {
			ports = append(ports, fmt.Sprintf("%d/%s (%s)", p.Port, strings.ToLower(string(p.Protocol)), p.ID))
		}
	}
	if len(ports) > 0 {
		what := fmt.Sprintf("%s is a Service IP, but no Service port is %d/%s (it has %s)", to.Addr(), to.Port(), strings.ToLower(string(a.Protocol)), strings.Join(ports, ", "))
		switch {
		case e.in.Mode == "ipvs":
			a.Verdict, a.Reason = Reject, what+": rejected (IPVS mode rejects new connections to a Service IP on a port no Service has)"
		case e.in.Mode == modeUserspace:
			a.Verdict, a.Reason = Reject, what+": refused (the address is the node's, on kproxy0, and no socket listens on the port)"
		case e.in.Mode == "nftables" && e.isClusterIP(snap, fam, to.Addr()):
			a.Verdict, a.Reason = Reject, what+": rejected (nftables mode rejects a ClusterIP's unknown ports, as upstream)"
		default:
			a.Verdict, a.Reason = NotProxied, what+": not proxied (the node routes it as any packet)"
		}
		return
	}
	if p, ok := containing(model.ServiceCIDRsOf(snap.ServiceCIDRs, fam), to.Addr()); ok && e.in.Mode == "nftables" {
		a.Verdict, a.Reason = Drop, fmt.Sprintf("%s is in the service range %s but no Service has it: dropped (as upstream's nftables mode)", to.Addr(), p)
		return
	}
	if e.isNodePortAddr(to.Addr()) {
		a.Verdict, a.Reason = NotProxied, fmt.Sprintf("no Service has NodePort %d/%s: the node itself receives it", to.Port(), strings.ToLower(string(a.Protocol)))
		return
	}
	a.Verdict, a.Reason = NotProxied, fmt.Sprintf("no Service has %s/%s on node %s", to, strings.ToLower(string(a.Protocol)), snap.Node.Name)
}

func (e *explainer) isClusterIP(snap *model.Snapshot, fam model.Family, addr netip.Addr) bool {
	for _, p := range snap.Family(fam).Ports {
		if p.ClusterIP == addr {
			return true
		}
	}
	return false
}

// service explains a matched frontend.
func (e *explainer) service(p *model.ServicePort, frontend string) {
	a := e.a
	e.step("frontend", "%s %s of %s", frontend, frontendAddr(p, frontend, a.To), p.ID)
	if frontend == FrontendLoadBalancer && len(p.SourceRanges) > 0 {
		if r, ok := containing(p.SourceRanges, a.From); ok {
			e.step("loadBalancerSourceRanges", "%s is in %s: allowed", a.From, r)
		} else {
			e.step("loadBalancerSourceRanges", "%s is in none of %s", a.From, prefixes(p.SourceRanges))
			a.Verdict, a.Reason = Drop, "the client is outside the Service's loadBalancerSourceRanges: dropped"
			e.turnedAway()
			return
		}
	}
	eps, local := e.policy(p, frontend)
	if p.TopologyMode != "" && !local {
		e.step("topology", "%s: only the endpoints hinted for this node's zone (%q) or node", p.TopologyMode, e.in.Snapshot.Node.Zone)
	}
	e.exclusions(p, eps, local)
	if len(eps) == 0 {
		e.noEndpoints(p, local)
		return
	}
	a.Verdict = Forward
	to := "DNAT to"
	if e.in.Mode == modeUserspace {
		to = "kproxy relays each connection to"
	}
	for _, ep := range eps {
		a.Endpoints = append(a.Endpoints, Choice{Endpoint: ep.AddrPort(), Probability: 1 / float64(len(eps)), Local: ep.IsLocal, State: state(ep)})
	}
	a.Balancing = p.Balancing.String()
	switch {
	case e.in.Mode == "ipvs":
		a.Scheduler = scheduler(e.in, p)
		a.Reason = fmt.Sprintf("DNAT to one of %d endpoint(s), chosen by IPVS's %s scheduler", len(eps), a.Scheduler)
	case p.Balancing == model.BalanceRoundRobin:
		a.Reason = fmt.Sprintf("%s one of %d endpoint(s) in turn (round-robin): each new connection takes the next", to, len(eps))
	case p.Balancing == model.BalanceSourceHash:
		ep := p.SourceHashPick(eps, a.From)
		a.Endpoints = []Choice{{Endpoint: ep.AddrPort(), Probability: 1, Local: ep.IsLocal, State: state(ep)}}
		a.Reason = fmt.Sprintf("%s %s: source-hash sends every new connection from %s there (its bucket of the Service's %d-bucket table over %d endpoint(s))",
			to, ep.AddrPort(), a.From, model.SourceHashSize(len(eps)), len(eps))
	default:
		a.Reason = fmt.Sprintf("%s one of %d endpoint(s) at random, each with probability 1/%d", to, len(eps), len(eps))
	}
	if e.in.Mode == modeUserspace && p.Balancing == model.BalanceLeastConnections {
		a.Reason = fmt.Sprintf("%s the one of %d endpoint(s) with the fewest open relays (least-connections)", to, len(eps))
	}
	if p.AffinityTimeout > 0 {
		a.Affinity = p.AffinityTimeout
		e.step("sessionAffinity", "ClientIP, %ds: a client seen within that time goes to the endpoint it had", p.AffinityTimeout)
	}
	e.masquerade(p, frontend, local)
}

func frontendAddr(p *model.ServicePort, frontend string, to netip.AddrPort) string {
	if frontend == FrontendNodePort {
		return fmt.Sprintf("%s (NodePort %d, service port %d)", to, p.NodePort, p.Port)
	}
	return to.String()
}

// policy picks the model's endpoint set that applies to this packet.
func (e *explainer) policy(p *model.ServicePort, frontend string) (eps []*model.Endpoint, local bool) {
	a := e.a
	if frontend == FrontendClusterIP {
		if p.InternalPolicyLocal {
			if e.ipvsClusterFallback(p) {
				e.step("internalTrafficPolicy", "Local, but no endpoint is on this node: IPVS mode uses every usable endpoint, as upstream's does")
				return p.ClusterEndpoints, false
			}
			e.step("internalTrafficPolicy", "Local: only endpoints on this node")
			return p.LocalEndpoints, true
		}
		e.step("internalTrafficPolicy", "Cluster: every usable endpoint")
		return p.ClusterEndpoints, false
	}
	if !p.ExternalPolicyLocal {
		e.step("externalTrafficPolicy", "Cluster: every usable endpoint")
		return p.ClusterEndpoints, false
	}
	if e.shortCircuits() {
		e.step("externalTrafficPolicy", "Local, but the client is %s: short-circuited to every usable endpoint, as upstream does", sourceWords(a.Source))
		return p.ClusterEndpoints, false
	}
	if e.ipvsClusterFallback(p) {
		e.step("externalTrafficPolicy", "Local, but no endpoint is on this node: IPVS mode uses every usable endpoint, as upstream's does (the client's address is kept, so an external client's reply does not come back through this node)")
		return p.ClusterEndpoints, true
	}
	e.step("externalTrafficPolicy", "Local: only endpoints on this node (the client's address is kept)")
	return p.LocalEndpoints, true
}

// ipvsClusterFallback reports whether IPVS mode gives a Local policy's
// virtual server the cluster's endpoints: when none is on this node, as
// upstream's IPVS mode does (kubernetes PR 97081).
func (e *explainer) ipvsClusterFallback(p *model.ServicePort) bool {
	return e.in.Mode == "ipvs" && len(p.LocalEndpoints) == 0 && len(p.ClusterEndpoints) > 0
}

// shortCircuits reports whether externalTrafficPolicy Local gives this
// client every endpoint: the node itself, and the pods detect-local tells
// (in the userspace mode only by address: a socket does not see the input
// interface). IPVS mode has no short-circuit.
func (e *explainer) shortCircuits() bool {
	a := e.a
	pod := (a.Source == SourceLocalPod || a.Source == SourceCluster) && e.isLocal()
	switch e.in.Mode {
	case "ipvs":
		return false
	case modeUserspace:
		m := e.localMode()
		pod = pod && (m == dataplane.LocalClusterCIDR || m == dataplane.LocalNodeCIDR)
	}
	return a.Source == SourceNode || pod
}

// turnedAway rewords a drop for the userspace mode, where a socket takes
// the traffic: a UDP datagram is dropped, a TCP (or SCTP) client reset.
func (e *explainer) turnedAway() {
	a := e.a
	if e.in.Mode == modeUserspace && a.Protocol != model.UDP {
		a.Verdict = Reject
		before, _, _ := strings.Cut(a.Reason, ": dropped")
		a.Reason = before + ": kproxy accepts the connection and resets it (a socket cannot drop a SYN)"
	}
}

func sourceWords(s string) string {
	switch s {
	case SourceNode:
		return "this node"
	case SourceLocalPod:
		return "a pod on this node"
	case SourceCluster:
		return "in the cluster"
	}
	return "outside the cluster"
}

// noEndpoints sets the verdict for an empty endpoint set.
func (e *explainer) noEndpoints(p *model.ServicePort, local bool) {
	a := e.a
	switch {
	case !p.HasEndpoints:
		a.Verdict, a.Reason = Reject, "the Service port has no endpoints that can serve (ready, or serving and terminating): rejected"
	case e.in.Mode == modeUserspace && !local:
		a.Verdict, a.Reason = Reject, "the Service port has endpoints but none is usable (none ready or serving): no socket listens, so the kernel refuses it (upstream drops it)"
	case e.in.Mode == "ipvs":
		a.Verdict, a.Reason = Reject, "no usable endpoint for this traffic: the virtual server has no real server, which IPVS rejects"
	case local:
		a.Verdict, a.Reason = Drop, "the policy is Local and no usable endpoint is on this node: dropped (as upstream)"
		e.turnedAway()
	default:
		a.Verdict, a.Reason = Drop, "the Service port has endpoints but none is usable (none ready or serving): dropped (as upstream)"
	}
}

// exclusions lists the port's endpoints not in eps, with why.
func (e *explainer) exclusions(p *model.ServicePort, eps []*model.Endpoint, local bool) {
	node := e.in.Snapshot.Node
	anyReady := slices.ContainsFunc(p.Endpoints, func(ep *model.Endpoint) bool {
		return ep.Ready && (!local || ep.IsLocal)
	})
	for _, ep := range p.Endpoints {
		if slices.Contains(eps, ep) {
			continue
		}
		var why string
		switch {
		case local && !ep.IsLocal:
			why = "on another node (policy Local)"
		case !ep.Ready && !ep.Serving:
			why = "not ready and not serving"
		case !ep.Ready && ep.Serving && anyReady:
			why = "terminating: serving endpoints that are terminating are used only when no endpoint is ready"
		case !ep.Ready:
			why = "not ready"
		case p.TopologyMode == "PreferSameNode":
			why = fmt.Sprintf("topology hints for other nodes (%s), not %s", strings.Join(ep.NodeHints(), ","), node.Name)
		case p.TopologyMode != "":
			why = fmt.Sprintf("topology hints for other zones (%s), not %q", strings.Join(ep.ZoneHints(), ","), node.Zone)
		default:
			why = "not selected by the model"
		}
		e.a.Excluded = append(e.a.Excluded, Excluded{Endpoint: ep.AddrPort(), Reason: why})
	}
}

func state(ep *model.Endpoint) string {
	switch {
	case ep.Ready:
		return "ready"
	case ep.Serving && ep.Terminating:
		return "serving, terminating"
	case ep.Serving:
		return "serving"
	}
	return "not ready"
}

// masquerade says whether the DNATed packet also gets the node's address
// as its source, with upstream's reasons.
func (e *explainer) masquerade(p *model.ServicePort, frontend string, local bool) {
	a := e.a
	cfg := e.in.Config
	hairpin := slices.ContainsFunc(a.Endpoints, func(c Choice) bool { return c.Endpoint.Addr() == a.From })
	switch {
	case e.in.Mode == modeUserspace:
		a.Masquerade, a.MasqueradeReason = true, "the userspace mode connects to the endpoint from the node: the endpoint sees the node's address, never the client's"
		return
	case cfg.MasqueradeAll:
		a.Masquerade, a.MasqueradeReason = true, "masqueradeAll is set"
	case frontend == FrontendClusterIP && e.localMode() == dataplane.LocalNone:
		a.MasqueradeReason = "no detect-local mode: ClusterIP traffic keeps its source"
	case frontend == FrontendClusterIP && !e.isLocal():
		a.Masquerade, a.MasqueradeReason = true, "ClusterIP traffic from outside the cluster (detect-local) is masqueraded, so replies come back through this node"
	case frontend == FrontendClusterIP:
		a.MasqueradeReason = "ClusterIP traffic from a pod keeps its source"
	case !local && a.Source == SourceNode:
		a.Masquerade, a.MasqueradeReason = true, "traffic from the node to an external frontend is masqueraded"
	case !local && p.ExternalPolicyLocal:
		a.MasqueradeReason = "short-circuited pod traffic keeps its source"
	case !local:
		a.Masquerade, a.MasqueradeReason = true, "externalTrafficPolicy Cluster: masqueraded, so replies come back through this node"
	default:
		a.MasqueradeReason = "externalTrafficPolicy Local: the client's address is kept"
	}
	if hairpin && !a.Masquerade {
		a.MasqueradeReason += "; but if the client itself is chosen, masqueraded (hairpin)"
	}
}

func scheduler(in Input, p *model.ServicePort) string {
	switch {
	case p.Scheduler != "":
		return p.Scheduler
	case p.Balancing.IPVSScheduler() != "":
		return p.Balancing.IPVSScheduler()
	case in.Config.IPVS.Scheduler != "":
		return in.Config.IPVS.Scheduler
	}
	return "rr"
}

func containedIn(ps []netip.Prefix, a netip.Addr) bool {
	_, ok := containing(ps, a)
	return ok
}

func containing(ps []netip.Prefix, a netip.Addr) (netip.Prefix, bool) {
	for _, p := range ps {
		if p.Contains(a) {
			return p, true
		}
	}
	return netip.Prefix{}, false
}

func prefixes(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ", ")
}
