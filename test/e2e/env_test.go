//go:build e2e

package e2e

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kproxy/kproxy/test/testbed/controlplane"
	"github.com/kproxy/kproxy/test/testbed/netbed"
)

// This file adapts what TestMain (main_test.go, the control plane's) provides
// to what the network cases need.

// testLayout is the bed's address plan: netbed's default plus an IPv4 link
// from the root namespace (where the API server listens) into the node
// network. No IPv6 host link: this machine's own eth0 is on fd00::/64.
func testLayout() netbed.Layout {
	l := netbed.DefaultLayout()
	l.Host4 = controlplane.AdvertiseAddress4
	return l
}

// clusterCIDRs is kproxy's --cluster-cidr for testLayout.
func clusterCIDRs() string {
	return netbed.ClusterCIDR4.String() + "," + netbed.ClusterCIDR6.String()
}

// echoBinary returns the kproxy-echo binary TestMain built.
func echoBinary(t *testing.T) string {
	return binary(t, "KPROXY_ECHO", "kproxy-echo")
}

// kproxyBinary returns the kproxy binary TestMain built.
func kproxyBinary(t *testing.T) string {
	return binary(t, "KPROXY_BIN", "kproxy")
}

func binary(t *testing.T, env, name string) string {
	t.Helper()
	p := os.Getenv(env)
	if p == "" {
		p = filepath.Join("..", "..", "bin", name)
	}
	abs, err := filepath.Abs(p)
	if err == nil {
		_, err = os.Stat(abs)
	}
	if err != nil {
		t.Fatalf("%s binary (%s): %v", name, env, err)
	}
	return abs
}

// envKubeconfig names an admin kubeconfig for the shared API server, usable
// from the root namespace; TestMain sets it after starting the API server.
const envKubeconfig = "KPROXY_E2E_KUBECONFIG"

// nodeKubeconfig writes a kubeconfig for kproxy inside the node namespaces:
// the least-privileged kproxy user (system:node-proxier), reaching the API
// server at its address on the node network (the bed's root-namespace link).
func nodeKubeconfig(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kproxy-node.kubeconfig")
	err := sharedControlPlane(t).WriteKubeconfig(path, controlplane.AdvertiseAddress4, controlplane.KproxyUser)
	if err != nil {
		t.Fatalf("e2e: node kubeconfig: %v", err)
	}
	return path
}
