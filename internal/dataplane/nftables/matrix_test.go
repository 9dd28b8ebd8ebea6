package nftables

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/kproxy/kproxy/internal/dataplane/dptest"
	"github.com/kproxy/kproxy/internal/model"
)

// The matrix traces every source kind to every frontend of Services with
// every traffic policy and endpoint situation, and compares with an oracle
// that states upstream kube-proxy's semantics directly.

type source struct {
	name     string
	ip       string
	iif      string
	fromHost bool
}

var sources = []source{
	{"pod-local", "198.18.64.50", "veth1", false},
	{"pod-remote", "198.18.65.50", "eth0", false},
	{"node", "198.18.0.2", "", true},
	{"external", "198.18.200.5", "eth0", false},
	{"external-outside-ranges", "198.18.201.5", "eth0", false},
}

type frontend string

const (
	feClusterIP  frontend = "ClusterIP"
	feNodePort   frontend = "NodePort"
	feLB         frontend = "LoadBalancer"
	feExternalIP frontend = "externalIP"
)

var (
	remoteEP = "198.18.65.10:8080"
	localEP  = "198.18.64.10:8080"
)

type epKind string

const (
	epsBoth        epKind = "endpoints"
	epsNone        epKind = "none"
	epsTerminating epKind = "only-terminating"
	epsRemoteOnly  epKind = "remote-only"
)

func matrixEndpoints(k epKind) []*model.Endpoint {
	switch k {
	case epsBoth:
		return []*model.Endpoint{dptest.EP("198.18.64.10", 8080, true), dptest.EP("198.18.65.10", 8080, false)}
	case epsTerminating:
		return []*model.Endpoint{dptest.Terminating(dptest.EP("198.18.64.10", 8080, true)), dptest.Terminating(dptest.EP("198.18.65.10", 8080, false))}
	case epsRemoteOnly:
		return []*model.Endpoint{dptest.EP("198.18.65.10", 8080, false)}
	}
	return nil
}

func matrixService(policy string, k epKind) *model.ServicePort {
	opts := []func(*model.ServicePort){
		dptest.WithNodePort(30080), dptest.WithLB("198.19.100.1"), dptest.WithExternalIPs("198.19.100.2"),
		dptest.WithSourceRanges("198.18.200.0/24"), dptest.WithEPs(matrixEndpoints(k)...),
	}
	switch policy {
	case "ETP=Local":
		opts = append(opts, dptest.WithETPLocal)
	case "ITP=Local":
		opts = append(opts, dptest.WithITPLocal)
	}
	return dptest.Svc("ns", "m", "198.19.0.1", 80, opts...)
}

func (fe frontend) packet(s source) tracePacket {
	p := tracePacket{src: netip.MustParseAddr(s.ip), proto: "tcp", dport: 80, iif: s.iif, fromHost: s.fromHost}
	switch fe {
	case feClusterIP:
		p.dst = netip.MustParseAddr("198.19.0.1")
	case feNodePort:
		p.dst, p.dport = dptest.NodeIP, 30080
	case feLB:
		p.dst = netip.MustParseAddr("198.19.100.1")
	case feExternalIP:
		p.dst = netip.MustParseAddr("198.19.100.2")
	}
	return p
}

// oracle is upstream's behaviour for the matrix, written out plainly.
func oracle(s source, fe frontend, policy string, k epKind) traceResult {
	fromPod := dptest.ClusterNet.Contains(netip.MustParseAddr(s.ip))
	if fe == feLB && !netip.MustParsePrefix("198.18.200.0/24").Contains(netip.MustParseAddr(s.ip)) {
		return traceResult{verdict: "drop"} // loadBalancerSourceRanges
	}
	var all, local []string
	switch k {
	case epsNone:
		return traceResult{verdict: "reject"}
	case epsRemoteOnly:
		all = []string{remoteEP}
	default:
		all, local = []string{localEP, remoteEP}, []string{localEP}
	}
	var targets []string
	masq := false
	switch {
	case fe == feClusterIP && policy == "ITP=Local":
		targets, masq = local, !fromPod
	case fe == feClusterIP:
		targets, masq = all, !fromPod
	case policy == "ETP=Local" && fromPod:
		targets = all // pods short-circuit to cluster endpoints
	case policy == "ETP=Local" && s.fromHost:
		targets, masq = all, true
	case policy == "ETP=Local":
		targets = local
	default:
		targets, masq = all, true
	}
	if len(targets) == 0 {
		return traceResult{verdict: "drop"}
	}
	slices.Sort(targets)
	return traceResult{verdict: "accept", dnat: targets, masq: masq}
}

func TestTraceMatrix(t *testing.T) {
	for _, policy := range []string{"Cluster", "ETP=Local", "ITP=Local"} {
		for _, k := range []epKind{epsBoth, epsNone, epsTerminating, epsRemoteOnly} {
			tr := traceOf(t, dptest.Config(), dptest.Snapshot(matrixService(policy, k)), model.IPv4)
			for _, s := range sources {
				for _, fe := range []frontend{feClusterIP, feNodePort, feLB, feExternalIP} {
					name := fmt.Sprintf("%s/%s/%s/%s", policy, k, s.name, fe)
					t.Run(name, func(t *testing.T) {
						got := tr.trace(fe.packet(s))
						want := oracle(s, fe, policy, k)
						if got.String() != want.String() {
							t.Errorf("got %v, want %v", got, want)
						}
					})
				}
			}
		}
	}
}
