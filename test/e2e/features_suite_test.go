//go:build e2e

package e2e

import (
	"os"
	"testing"
)

// TestFeatures runs every Service feature of the dataplanes with real
// traffic, per proxy mode (KPROXY_E2E_MODES) and IP family. One bed per mode
// is shared by all cases; the cases that need other kproxy flags run last,
// each after restarting kproxy with its flags, and --cleanup runs at the end.
func TestFeatures(t *testing.T) {
	for _, mode := range featureModes() {
		t.Run(mode, func(t *testing.T) {
			b := &fbed{cluster: newCluster(t, mode), top: t}
			b.ensureClient2(t)
			for _, f := range families {
				t.Run(f.name, func(t *testing.T) {
					for _, tc := range featureCases {
						t.Run(tc.name, func(t *testing.T) {
							if why, ok := notInMode[mode][tc.name]; ok {
								t.Skipf("not in %s mode: %s", mode, why)
							}
							tc.run(t, b, f)
							b.checkKproxysRunning(t)
						})
					}
				})
			}
			for _, v := range featureVariants {
				t.Run(v.name, func(t *testing.T) {
					if v.mode != "" && v.mode != mode {
						t.Skipf("%s mode only", v.mode)
					}
					if why, ok := notInMode[mode][v.name]; ok {
						t.Skipf("not in %s mode: %s", mode, why)
					}
					if v.setup != nil {
						v.setup(t, b)
					}
					b.restartKproxys(t, v.flags...)
					for _, f := range families {
						t.Run(f.name, func(t *testing.T) {
							v.run(t, b, f)
							b.checkKproxysRunning(t)
						})
					}
					if v.teardown != nil {
						v.teardown(t, b)
					}
				})
			}
			t.Run("Cleanup", func(t *testing.T) { testCleanup(t, b) })
		})
	}
}

// featureModes are the modes of TestFeatures: KPROXY_E2E_MODES when set,
// else the traffic cases' modes and, for kproxy, its userspace mode.
func featureModes() []string {
	if os.Getenv("KPROXY_E2E_MODES") != "" || isUpstream() {
		return modes()
	}
	return append(modes(), "userspace")
}

// notInMode lists, per mode, the cases (and variants) that test what the
// mode does not have, and why; the README's userspace section says the
// same. The other cases hold in the mode as they are, or say inline where
// its answer differs (a reset for a drop, the node's address as source).
var notInMode = map[string]map[string]string{
	"userspace": {
		"MasqueradeDefaults":             "no NAT: every endpoint sees the relaying node's address",
		"DetectLocalClusterCIDR":         "no masquerade decision to detect local traffic for",
		"DetectLocalNodeCIDR":            "no masquerade decision to detect local traffic for",
		"DetectLocalBridgeInterface":     "no masquerade decision to detect local traffic for",
		"DetectLocalInterfaceNamePrefix": "no masquerade decision to detect local traffic for",
		"MasqueradeAll":                  "no NAT: every endpoint sees the relaying node's address",
		"RestartUnderTraffic":            "the listeners live in the process: between a stop and a start nothing listens (TestUserspaceMode/HandOver hands over between overlapping processes)",
		"CrashUnderChurn":                "compares kernel rule sets; the mode keeps its state in sockets",
		"Verify":                         "explain --verify traces netfilter rules; the mode has none",
		"ServiceTrafficMetrics":          "counts netfilter rule hits; the mode's own relay metrics are kproxy_userspace_*",
	},
}

// featureCases run with the suite's kproxy flags, for both families.
var featureCases = []fcase{
	// features_clusterip_test.go
	{"ClusterIPProtocolsOnOnePort", testProtocolsOnOnePort},
	{"ClusterIPTargetPortRemap", testTargetPortRemap},
	{"ClusterIPUnknownPortRejected", testUnknownPortRejected},
	{"ServiceCIDR", testServiceCIDR}, // features_servicecidr_test.go (nftables mode only)
	// features_external_test.go
	{"LoadBalancerIngress", testLoadBalancerIngress},
	{"LoadBalancerNoNodePorts", testLoadBalancerNoNodePorts},
	{"LoadBalancerIPModeProxy", testLoadBalancerIPModeProxy},
	{"LoadBalancerSourceRanges", testLoadBalancerSourceRanges},
	{"ExternalIPs", testExternalIPs},
	{"SCTP", testSCTP}, // features_sctp_test.go (in the VM: the host has no SCTP)
	// features_policy_test.go
	{"SessionAffinityClientIP", testSessionAffinity},
	{"ExternalTrafficPolicyLocal", testExternalTrafficPolicyLocal},
	{"HealthCheckPortTaken", testHealthCheckPortTaken},
	{"InternalTrafficPolicyLocal", testInternalTrafficPolicyLocal},
	{"TerminatingEndpoints", testTerminatingEndpoints},
	{"TopologyHints", testTopologyHints},
	// features_balancing_test.go (kproxy.io/load-balancing)
	{"BalancingRoundRobin", testBalancingRoundRobin},
	{"BalancingSourceHash", testBalancingSourceHash},
	{"BalancingLeastConnections", testBalancingLeastConnections},
	// features_masquerade_test.go
	{"MasqueradeDefaults", testMasqueradeDefaults},
	{"Hairpin", testHairpin},
	{"DetectLocalClusterCIDR", testDetectLocal},
	// features_lifecycle_test.go
	{"StaleConntrackUDP", testStaleConntrackUDP},
	{"UDPGainsEndpoint", testUDPGainsEndpoint},
	{"NoBlackholeOnAddBack", testNoBlackholeOnAddBack},
	{"RestartUnderTraffic", testRestartUnderTraffic},
	{"CrashUnderChurn", testCrashUnderChurn}, // features_crash_test.go
	{"FlushRepair", testFlushRepair},
	// inspect_test.go (kproxy's debug endpoint: kproxy inspect, explain --debug-address)
	{"Inspect", testInspect},
	// verify_test.go (explain --verify: hand edits, other proxies' tables)
	{"Verify", testVerify},
	// traffic_metrics_test.go (kproxy's --service-traffic-metrics)
	{"ServiceTrafficMetrics", testServiceTrafficMetrics},
	// features_oddinput_test.go (odd objects through the API server)
	{"OddInput", testOddInput},
	{"OddNodeInput", testOddNodeInput},
	// features_iptables_test.go (iptables mode only)
	{"LocalhostNodePort", testLocalhostNodePort},
}

// featureVariants need kproxy restarted with other flags; each runs for
// both families after the restart.
// A variant with a mode runs in that mode only; setup runs before the
// restart, teardown after both families.
var featureVariants = []struct {
	name            string
	flags           []string
	run             func(t *testing.T, b *fbed, f family)
	mode            string
	setup, teardown func(t *testing.T, b *fbed)
}{
	{"NodePortAddresses", []string{"--nodeport-addresses", nodePortCIDRs}, testNodePortAddresses, "", nil, nil},
	{"MasqueradeAll", []string{"--masquerade-all"}, testMasqueradeAll, "", nil, nil},
	{"NoExternalIPs", []string{"--feature-gates", "AllowServiceExternalIPs=false"}, testNoExternalIPs, "", nil, nil},
	{"DetectLocalNodeCIDR", []string{"--detect-local-mode", "NodeCIDR"}, testDetectLocal, "", nil, nil},
	{"DetectLocalBridgeInterface", []string{"--detect-local-mode", "BridgeInterface", "--pod-bridge-interface", "cbr0"}, testDetectLocal, "", nil, nil},
	// Pod traffic reaches the IP layer from the pod bridge (br_netfilter hands
	// it up with the bridge as input interface), so the prefix names cbr0.
	{"DetectLocalInterfaceNamePrefix", []string{"--detect-local-mode", "InterfaceNamePrefix", "--pod-interface-name-prefix", "cbr"}, testDetectLocal, "", nil, nil},
	// features_iptables_test.go
	{"NoLocalhostNodePorts", []string{"--iptables-localhost-nodeports=false"}, testNoLocalhostNodePorts, "iptables", nil, nil},
	{"LegacyBackend", nil, testLegacyBackend, "iptables", setupLegacy, teardownLegacy},
}
