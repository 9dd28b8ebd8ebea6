package iptables

import (
	"github.com/kproxy/kproxy/internal/dataplane/dptest"
	"github.com/kproxy/kproxy/internal/model"
)

// The test addresses, configuration and snapshot builders are dptest's.

func testParams() Params { return Params{Config: dptest.Config(), LocalhostNodePorts: true} }

// featureSnapshot exercises every feature once.
func featureSnapshot() *model.Snapshot {
	return dptest.Snapshot(
		dptest.Svc("ns", "plain", "198.19.0.1", 80, dptest.WithEPs(dptest.EP("198.18.64.10", 8080, true), dptest.EP("198.18.65.10", 8080, false))),
		dptest.Svc("ns", "udp", "198.19.0.2", 53, dptest.WithProto(model.UDP), dptest.WithEPs(dptest.EP("198.18.65.11", 53, false))),
		dptest.Svc("ns", "empty", "198.19.0.3", 80, dptest.WithNodePort(30003), dptest.WithExternalIPs("198.19.100.3")),
		dptest.Svc("ns", "np", "198.19.0.4", 80, dptest.WithNodePort(30004), dptest.WithEPs(dptest.EP("198.18.65.12", 80, false))),
		dptest.Svc("ns", "lb", "198.19.0.5", 80, dptest.WithNodePort(30005), dptest.WithLB("198.19.100.5"), dptest.WithSourceRanges("198.18.200.0/24", "198.18.0.0/24"),
			dptest.WithEPs(dptest.EP("198.18.65.13", 80, false))),
		dptest.Svc("ns", "etp", "198.19.0.6", 80, dptest.WithNodePort(30006), dptest.WithLB("198.19.100.6"), dptest.WithETPLocal,
			dptest.WithEPs(dptest.EP("198.18.64.14", 80, true), dptest.EP("198.18.65.14", 80, false))),
		dptest.Svc("ns", "etp-none", "198.19.0.7", 80, dptest.WithNodePort(30007), dptest.WithETPLocal, dptest.WithEPs(dptest.EP("198.18.65.15", 80, false))),
		dptest.Svc("ns", "itp", "198.19.0.8", 80, dptest.WithITPLocal, dptest.WithEPs(dptest.EP("198.18.65.16", 80, false))),
		dptest.Svc("ns", "aff", "198.19.0.9", 80, dptest.WithAffinity(600), dptest.WithEPs(dptest.EP("198.18.64.17", 80, true), dptest.EP("198.18.65.17", 80, false))),
		dptest.Svc("ns", "term", "198.19.0.10", 80, dptest.WithEPs(dptest.Terminating(dptest.EP("198.18.65.18", 80, false)))),
		dptest.Svc("ns", "rr", "198.19.0.11", 80, dptest.WithBalancing(model.BalanceRoundRobin), dptest.WithEPs(dptest.EP("198.18.64.19", 80, true), dptest.EP("198.18.65.19", 80, false), dptest.EP("198.18.65.20", 80, false))),
		dptest.Svc("ns", "v6", "fd00:96::1", 80, dptest.WithNodePort(30010), dptest.WithEPs(dptest.EP("fd00:64::10", 8080, true))),
	)
}
