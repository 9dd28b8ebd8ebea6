//go:build e2e

package e2e

import (
	"testing"
)

// TestFeatures runs every Service feature of the dataplanes with real
// traffic, per proxy mode (KPROXY_E2E_MODES) and IP family. One bed per mode
// is shared by all cases; the cases that need other kproxy flags run last,
// each after restarting kproxy with its flags, and --cleanup runs at the end.
func TestFeatures(t *testing.T) {
	for _, mode := range modes() {
		t.Run(mode, func(t *testing.T) {
			b := &fbed{cluster: newCluster(t, mode), top: t}
			b.ensureClient2(t)
			for _, f := range families {
				t.Run(f.name, func(t *testing.T) {
					for _, tc := range featureCases {
						t.Run(tc.name, func(t *testing.T) {
							tc.run(t, b, f)
							b.checkKproxysRunning(t)
						})
					}
				})
			}
			for _, v := range featureVariants {
				t.Run(v.name, func(t *testing.T) {
					b.restartKproxys(t, v.flags...)
					for _, f := range families {
						t.Run(f.name, func(t *testing.T) {
							v.run(t, b, f)
							b.checkKproxysRunning(t)
						})
					}
				})
			}
			t.Run("Cleanup", func(t *testing.T) { testCleanup(t, b) })
		})
	}
}

// featureCases run with the suite's kproxy flags, for both families.
var featureCases = []fcase{
	// features_clusterip_test.go
	{"ClusterIPProtocolsOnOnePort", testProtocolsOnOnePort},
	{"ClusterIPTargetPortRemap", testTargetPortRemap},
	{"ClusterIPUnknownPortRejected", testUnknownPortRejected},
	// features_external_test.go
	{"LoadBalancerIngress", testLoadBalancerIngress},
	{"LoadBalancerNoNodePorts", testLoadBalancerNoNodePorts},
	{"LoadBalancerIPModeProxy", testLoadBalancerIPModeProxy},
	{"LoadBalancerSourceRanges", testLoadBalancerSourceRanges},
	{"ExternalIPs", testExternalIPs},
	// features_policy_test.go
	{"SessionAffinityClientIP", testSessionAffinity},
	{"ExternalTrafficPolicyLocal", testExternalTrafficPolicyLocal},
	{"InternalTrafficPolicyLocal", testInternalTrafficPolicyLocal},
	{"TerminatingEndpoints", testTerminatingEndpoints},
	{"TopologyHints", testTopologyHints},
	// features_masquerade_test.go
	{"MasqueradeDefaults", testMasqueradeDefaults},
	{"Hairpin", testHairpin},
	{"DetectLocalClusterCIDR", testDetectLocal},
	// features_lifecycle_test.go
	{"StaleConntrackUDP", testStaleConntrackUDP},
	{"UDPGainsEndpoint", testUDPGainsEndpoint},
	{"NoBlackholeOnAddBack", testNoBlackholeOnAddBack},
	{"RestartUnderTraffic", testRestartUnderTraffic},
	{"FlushRepair", testFlushRepair},
}

// featureVariants need kproxy restarted with other flags; each runs for
// both families after the restart.
var featureVariants = []struct {
	name  string
	flags []string
	run   func(t *testing.T, b *fbed, f family)
}{
	{"NodePortAddresses", []string{"--nodeport-addresses", nodePortCIDRs}, testNodePortAddresses},
	{"MasqueradeAll", []string{"--masquerade-all"}, testMasqueradeAll},
	{"DetectLocalNodeCIDR", []string{"--detect-local-mode", "NodeCIDR"}, testDetectLocal},
	{"DetectLocalBridgeInterface", []string{"--detect-local-mode", "BridgeInterface", "--pod-bridge-interface", "cbr0"}, testDetectLocal},
	// Pod traffic reaches the IP layer from the pod bridge (br_netfilter hands
	// it up with the bridge as input interface), so the prefix names cbr0.
	{"DetectLocalInterfaceNamePrefix", []string{"--detect-local-mode", "InterfaceNamePrefix", "--pod-interface-name-prefix", "cbr"}, testDetectLocal},
}
