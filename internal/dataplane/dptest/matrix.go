package dptest

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/kproxy/kproxy/internal/model"
)

// The matrix traces every source kind to every frontend of a Service under
// every traffic policy and endpoint situation, and compares with an oracle
// that states upstream kube-proxy's semantics plainly. The table of cases
// and the oracle are shared; each dataplane runs them against its own
// tracer, and states where its upstream mode differs.

// Source is where a matrix packet comes from.
type Source struct {
	Name     string
	IP       string
	Iif      string
	FromHost bool
}

// Sources are the matrix's source kinds.
var Sources = []Source{
	{"pod-local", "198.18.64.50", "veth1", false},
	{"pod-remote", "198.18.65.50", "eth0", false},
	{"node", "198.18.0.2", "", true},
	{"external", "198.18.200.5", "eth0", false},
	{"external-outside-ranges", "198.18.201.5", "eth0", false},
}

// Frontend is the address kind of a Service a matrix packet goes to.
type Frontend string

// The matrix's frontends.
const (
	FEClusterIP  Frontend = "ClusterIP"
	FENodePort   Frontend = "NodePort"
	FELB         Frontend = "LoadBalancer"
	FEExternalIP Frontend = "externalIP"
)

// EPKind is the endpoint situation of a matrix Service.
type EPKind string

// The matrix's endpoint situations.
const (
	EPsBoth        EPKind = "endpoints"
	EPsNone        EPKind = "none"
	EPsTerminating EPKind = "only-terminating"
	EPsRemoteOnly  EPKind = "remote-only"
)

// The matrix's endpoints: one on this node, one on another.
const (
	LocalEP  = "198.18.64.10:8080"
	RemoteEP = "198.18.65.10:8080"
)

// The matrix's axes, in the order RunMatrix runs them (with Sources).
var (
	Policies  = []string{"Cluster", "ETP=Local", "ITP=Local"}
	EPKinds   = []EPKind{EPsBoth, EPsNone, EPsTerminating, EPsRemoteOnly}
	Frontends = []Frontend{FEClusterIP, FENodePort, FELB, FEExternalIP}
)

// MatrixCase is one cell of the matrix.
type MatrixCase struct {
	Policy   string
	EPs      EPKind
	Source   Source
	Frontend Frontend
}

// Name is the case's subtest name: policy/endpoints/source/frontend.
func (c MatrixCase) Name() string {
	return fmt.Sprintf("%s/%s/%s/%s", c.Policy, c.EPs, c.Source.Name, c.Frontend)
}

// MatrixEndpoints returns the endpoints of situation k.
func MatrixEndpoints(k EPKind) []*model.Endpoint {
	switch k {
	case EPsBoth:
		return []*model.Endpoint{EP("198.18.64.10", 8080, true), EP("198.18.65.10", 8080, false)}
	case EPsTerminating:
		return []*model.Endpoint{Terminating(EP("198.18.64.10", 8080, true)), Terminating(EP("198.18.65.10", 8080, false))}
	case EPsRemoteOnly:
		return []*model.Endpoint{EP("198.18.65.10", 8080, false)}
	}
	return nil
}

// MatrixService is the matrix's Service ns/m: ClusterIP 198.19.0.1:80,
// node port 30080, LB 198.19.100.1 open to 198.18.200.0/24, external IP
// 198.19.100.2, with the given policy and endpoints.
func MatrixService(policy string, k EPKind) *model.ServicePort {
	opts := []SvcOpt{
		WithNodePort(30080), WithLB("198.19.100.1"), WithExternalIPs("198.19.100.2"),
		WithSourceRanges("198.18.200.0/24"), WithEPs(MatrixEndpoints(k)...),
	}
	switch policy {
	case "ETP=Local":
		opts = append(opts, WithETPLocal)
	case "ITP=Local":
		opts = append(opts, WithITPLocal)
	}
	return Svc("ns", "m", "198.19.0.1", 80, opts...)
}

// Packet is the case's TCP packet to port 80 of its frontend (the node
// port on the node IP).
func (c MatrixCase) Packet() Packet {
	s := c.Source
	p := Packet{Src: netip.MustParseAddr(s.IP), Proto: "tcp", DPort: 80, Iif: s.Iif, FromHost: s.FromHost}
	switch c.Frontend {
	case FEClusterIP:
		p.Dst = netip.MustParseAddr("198.19.0.1")
	case FENodePort:
		p.Dst, p.DPort = NodeIP, 30080
	case FELB:
		p.Dst = netip.MustParseAddr("198.19.100.1")
	case FEExternalIP:
		p.Dst = netip.MustParseAddr("198.19.100.2")
	}
	return p
}

// Want is upstream's behaviour for the case, written out plainly: LB
// source ranges first, then a Service without endpoints rejects, then the
// policies choose the endpoints and whether to masquerade.
func (c MatrixCase) Want() Result {
	if c.Frontend == FELB && !netip.MustParsePrefix("198.18.200.0/24").Contains(netip.MustParseAddr(c.Source.IP)) {
		return Result{Verdict: "drop"} // loadBalancerSourceRanges
	}
	var all, local []string
	switch c.EPs {
	case EPsNone:
		return Result{Verdict: "reject"}
	case EPsRemoteOnly:
		all = []string{RemoteEP}
	default:
		all, local = []string{LocalEP, RemoteEP}, []string{LocalEP}
	}
	targets, masq := c.targets(all, local)
	if len(targets) == 0 {
		return Result{Verdict: "drop"}
	}
	slices.Sort(targets)
	return Result{Verdict: "accept", DNAT: targets, Masq: masq}
}

// targets picks the endpoints the policy allows (all: cluster-wide, local:
// this node's) and whether the packet is masqueraded.
func (c MatrixCase) targets(all, local []string) ([]string, bool) {
	fromPod := ClusterNet.Contains(netip.MustParseAddr(c.Source.IP))
	switch {
	case c.Frontend == FEClusterIP && c.Policy == "ITP=Local":
		return local, !fromPod
	case c.Frontend == FEClusterIP:
		return all, !fromPod
	case c.Policy == "ETP=Local" && fromPod:
		return all, false // pods short-circuit to cluster endpoints
	case c.Policy == "ETP=Local" && c.Source.FromHost:
		return all, true
	case c.Policy == "ETP=Local":
		return local, false
	}
	return all, true
}

// RunMatrix runs every case of the matrix as a subtest of t. newTrace
// returns the tracer of an IPv4 snapshot (it is called once per policy and
// endpoint situation); expect gives a case's expected result (MatrixCase.Want,
// or a dataplane's own where its upstream mode differs). A case fails when
// the traced result differs from expect's.
func RunMatrix(t *testing.T, newTrace func(*model.Snapshot) func(Packet) Result, expect func(MatrixCase) Result) {
	for _, policy := range Policies {
		for _, k := range EPKinds {
			trace := newTrace(Snapshot(MatrixService(policy, k)))
			for _, s := range Sources {
				for _, fe := range Frontends {
					c := MatrixCase{Policy: policy, EPs: k, Source: s, Frontend: fe}
					t.Run(c.Name(), func(t *testing.T) {
						if got, want := trace(c.Packet()), expect(c); got.String() != want.String() {
							t.Errorf("got %v, want %v", got, want)
						}
					})
				}
			}
		}
	}
}
