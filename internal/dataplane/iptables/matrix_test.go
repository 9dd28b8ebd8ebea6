package iptables

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/kproxy/kproxy/internal/model"
)

// The matrix traces every source kind to every frontend of a Service under
// every traffic policy and endpoint situation, against an oracle that
// states upstream kube-proxy's semantics plainly.

type source struct {
	name, ip, iif string
	fromHost      bool
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

const (
	localEP  = "198.18.64.10:8080"
	remoteEP = "198.18.65.10:8080"
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
		return []*model.Endpoint{ep("198.18.64.10", 8080, true), ep("198.18.65.10", 8080, false)}
	case epsTerminating:
		return []*model.Endpoint{terminating(ep("198.18.64.10", 8080, true)), terminating(ep("198.18.65.10", 8080, false))}
	case epsRemoteOnly:
		return []*model.Endpoint{ep("198.18.65.10", 8080, false)}
	}
	return nil
}

func matrixService(policy string, k epKind) *model.ServicePort {
	opts := []spOpt{withNodePort(30080), withLB("198.19.100.1"), withExternalIPs("198.19.100.2"),
		withSourceRanges("198.18.200.0/24"), withEPs(matrixEndpoints(k)...)}
	switch policy {
	case "ETP=Local":
		opts = append(opts, withETPLocal)
	case "ITP=Local":
		opts = append(opts, withITPLocal)
	}
	return svc("ns", "m", "198.19.0.1", 80, opts...)
}

func (fe frontend) packet(s source) tracePacket {
	p := tracePacket{src: netip.MustParseAddr(s.ip), proto: "tcp", dport: 80, iif: s.iif, fromHost: s.fromHost}
	switch fe {
	case feClusterIP:
		p.dst = netip.MustParseAddr("198.19.0.1")
	case feNodePort:
		p.dst, p.dport = nodeIP, 30080
	case feLB:
		p.dst = netip.MustParseAddr("198.19.100.1")
	case feExternalIP:
		p.dst = netip.MustParseAddr("198.19.100.2")
	}
	return p
}

// oracle is upstream's behaviour for the matrix.
func oracle(s source, fe frontend, policy string, k epKind) traceResult {
	fromPod := clusterNet.Contains(netip.MustParseAddr(s.ip))
	if k == epsNone && s.fromHost && (fe == feLB || fe == feExternalIP) {
		// Upstream's iptables mode jumps to KUBE-EXTERNAL-SERVICES from
		// INPUT and FORWARD only: the host's own packets to a non-local
		// external IP leave the node untouched.
		return traceResult{verdict: "accept"}
	}
	if k == epsNone {
		return traceResult{verdict: "reject"}
	}
	if fe == feLB && !netip.MustParsePrefix("198.18.200.0/24").Contains(netip.MustParseAddr(s.ip)) {
		return traceResult{verdict: "drop"} // loadBalancerSourceRanges
	}
	all, local := []string{localEP, remoteEP}, []string{localEP}
	if k == epsRemoteOnly {
		all, local = []string{remoteEP}, nil
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
			tr := traceOf(t, testParams(), snapshot(matrixService(policy, k)), model.IPv4)
			for _, s := range sources {
				for _, fe := range []frontend{feClusterIP, feNodePort, feLB, feExternalIP} {
					t.Run(fmt.Sprintf("%s/%s/%s/%s", policy, k, s.name, fe), func(t *testing.T) {
						got, want := tr.trace(fe.packet(s)), oracle(s, fe, policy, k)
						if got.String() != want.String() {
							t.Errorf("got %v, want %v", got, want)
						}
					})
				}
			}
		}
	}
}
