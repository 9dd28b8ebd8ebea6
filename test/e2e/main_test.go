//go:build e2e

package e2e

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/test/testbed/controlplane"
)

// The suite shares one control plane (etcd + kube-apiserver), started by
// TestMain, and the kproxy and echo binaries TestMain builds. TestMain
// publishes them to the tests through sharedControlPlane and these
// environment variables:
const (
	envKproxyBin = "KPROXY_BIN"  // the kproxy binary
	envEchoBin   = "KPROXY_ECHO" // the echo server binary
	// envKproxyKubeconfig: a kubeconfig as the least-privileged "kproxy"
	// user (ClusterRole system:node-proxier), from the root namespace.
	envKproxyKubeconfig = "KPROXY_E2E_KPROXY_KUBECONFIG"
	// envKubeconfig (admin) is declared in env_test.go.
)

// shared is the suite's control plane; nil until TestMain started it.
var shared *controlplane.ControlPlane

// sharedControlPlane returns the suite's control plane.
func sharedControlPlane(t testing.TB) *controlplane.ControlPlane {
	t.Helper()
	if shared == nil {
		t.Fatal("e2e: no control plane (TestMain did not start one)")
	}
	if err := shared.Running(); err != nil {
		t.Fatalf("e2e: control plane died: %v", err)
	}
	return shared
}

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(runSuite(m))
}

// runSuite checks prerequisites, builds the binaries, starts the control
// plane, runs the tests and cleans up. It returns the exit code.
func runSuite(m *testing.M) int {
	if missing := missingPrerequisites(); len(missing) > 0 {
		msg := "e2e: prerequisites missing:\n  " + strings.Join(missing, "\n  ")
		if os.Getenv("CI") == "true" {
			fmt.Fprintln(os.Stderr, msg+"\ne2e: FAIL: CI=true, so missing prerequisites fail the run")
			return 1
		}
		fmt.Println(msg + "\ne2e: SKIP: the whole e2e suite is skipped (set up the above, or run .ci/run)")
		return 0
	}
	binDir, err := os.MkdirTemp("", "kproxy-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(binDir)
	if err := buildBinaries(binDir); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: FAIL:", err)
		return 1
	}
	cp, err := startControlPlane()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: FAIL:", err)
		return 1
	}
	shared = cp
	code := m.Run()
	stopControlPlane(cp, code != 0)
	return code
}

// missingPrerequisites lists what the suite needs and does not find.
func missingPrerequisites() []string {
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "not root: the suite creates network namespaces")
	}
	for _, tool := range []string{"nft", "iptables", "ip", "conntrack"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, fmt.Sprintf("%s not in PATH (apt-get install iptables nftables conntrack iproute2)", tool))
		}
	}
	if _, err := exec.LookPath(controlplane.EtcdPath()); err != nil {
		missing = append(missing, fmt.Sprintf("etcd: %v (run: make testbed-deps; KPROXY_ETCD=debian: apt-get install etcd-server)", err))
	}
	if _, err := os.Stat(controlplane.APIServerPath()); err != nil {
		missing = append(missing, fmt.Sprintf("kube-apiserver: %v (run: make testbed-deps)", err))
	}
	return missing
}

// buildBinaries builds kproxy and the echo server into dir, unless the
// environment already names them, and publishes their paths.
func buildBinaries(dir string) error {
	if os.Getenv(envKproxyBin) != "" && os.Getenv(envEchoBin) != "" {
		fmt.Printf("e2e: using %s=%s %s=%s\n", envKproxyBin, os.Getenv(envKproxyBin), envEchoBin, os.Getenv(envEchoBin))
		return nil
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		return err
	}
	start := time.Now()
	cmd := exec.Command("go", "build", "-o", dir+"/", "./cmd/kproxy", "./test/echo")
	cmd.Dir = root
	// Static, as make build and the image build them.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./cmd/kproxy ./test/echo: %w\n%s", err, out)
	}
	os.Setenv(envKproxyBin, filepath.Join(dir, "kproxy"))
	os.Setenv(envEchoBin, filepath.Join(dir, "echo"))
	fmt.Printf("e2e: built kproxy and echo into %s in %v\n", dir, time.Since(start).Round(time.Millisecond))
	return nil
}

// startControlPlane starts the shared control plane, listening on every
// address so kproxy in node namespaces reaches it through the bed's link to
// the root namespace (controlplane.AdvertiseAddress4).
func startControlPlane() (*controlplane.ControlPlane, error) {
	cp, err := controlplane.Start(context.Background(), controlplane.Options{
		BindAddress: netip.IPv4Unspecified(),
		Logf:        func(f string, a ...any) { fmt.Printf("e2e: "+f+"\n", a...) },
		// Under the VM's emulation the API server alone takes ~25 s.
		Timeout: 60 * time.Second * vmFactor(),
	})
	if err != nil {
		return nil, err
	}
	os.Setenv(envKubeconfig, cp.Kubeconfig)
	os.Setenv(envKproxyKubeconfig, cp.KproxyKubeconfig)
	return cp, nil
}

// stopControlPlane stops cp; after failed tests it first keeps its logs in
// $KPROXY_E2E_LOGS (default bin/e2e-logs).
func stopControlPlane(cp *controlplane.ControlPlane, failed bool) {
	if failed {
		dir := os.Getenv("KPROXY_E2E_LOGS")
		if dir == "" {
			dir, _ = filepath.Abs(filepath.Join("..", "..", "bin", "e2e-logs"))
		}
		if err := cp.SaveLogs(dir); err != nil {
			fmt.Fprintln(os.Stderr, "e2e:", err)
		} else {
			fmt.Printf("e2e: control plane logs kept in %s\n", dir)
		}
	}
	start := time.Now()
	if err := cp.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: stop control plane:", err)
	}
	fmt.Printf("e2e: control plane stopped in %v\n", time.Since(start).Round(time.Millisecond))
}
