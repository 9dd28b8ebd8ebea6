package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// explainArgs explain the demo's objects (examples/demo.yaml) on its node.
var explainArgs = []string{"explain", "--source-file", "../../examples/demo.yaml", "--node", "demo-node", "--proxy-mode", "nftables"}

func TestRun(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	content := "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n" +
		"masqueradeBitt: 1\niptables:\n  masqueradeBit: 40\noomScoreAdj: 5000\n"
	if err := os.WriteFile(bad, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out.yaml")
	tests := []struct {
		name       string
		args       []string
		code       int
		stdout     []string
		stderr     []string
		wantOutput bool
	}{
		{name: "version", args: []string{"--version"}, stdout: []string{"kproxy version ", "(kube-proxy v1.36.3 compatible)"}},
		{name: "version raw", args: []string{"--version=raw"}, stdout: []string{"kproxy version ", "go: go"}},
		{name: "version override of another release", args: []string{"--version=v1.2.3"}, code: 1, stderr: []string{"must match major/minor/patch"}},
		{name: "help", args: []string{"--help"}, stdout: []string{"--proxy-mode ProxyMode", "--iptables-masquerade-bit int32", "--source-file", "--dry-run", "--feature-gates", "--logging-format", "--vmodule"}},
		{name: "write config", args: []string{"--write-config-to=" + out, "--proxy-mode=nftables"}, wantOutput: true},
		{name: "invalid config lists every problem", args: []string{"--config=" + bad}, code: 1,
			stderr: []string{"invalid configuration (2 problems)", "\n  iptables.masqueradeBit: Invalid value: 40", "\n  oomScoreAdj: Invalid value: 5000"}},
		{name: "missing config", args: []string{"--config=" + filepath.Join(dir, "none.yaml")}, code: 1, stderr: []string{"none.yaml"}},
		{name: "argument", args: []string{"extra"}, code: 1, stderr: []string{"does not take any arguments"}},
		{name: "bad flag shows usage", args: []string{"--bind-address=x"}, code: 1, stderr: []string{"not a valid IP address", "Usage:"}},
		{name: "explain", args: append(explainArgs, "--from", "198.18.0.100", "--to", "198.18.128.10:80"),
			stdout: []string{"service:    demo/echo:tcp (ClusterIP)", "FORWARD", "198.18.17.12:8080", "33.3%"}},
		{name: "explain json", args: append(explainArgs, "--from", "fd00:0:0:101::a", "--to", "[fd00:0:0:ffff::10]:80/udp", "-o", "json"),
			stdout: []string{`"verdict": "forward"`, `"service": "demo/echo:udp"`}},
		{name: "explain no service", args: append(explainArgs, "--from", "198.18.0.100", "--to", "198.18.99.1:80"), code: 1,
			stdout: []string{"NOT-PROXIED: no Service has 198.18.99.1:80/tcp"}},
		{name: "explain unknown node", args: []string{"explain", "--source-file", "../../examples/demo.yaml", "--node", "nope",
			"--from", "198.18.0.100", "--to", "198.18.128.10:80"}, code: 1, stderr: []string{`node "nope" does not exist`}},
		{name: "explain bad port", args: append(explainArgs, "--from", "198.18.0.100", "--to", "198.18.128.10:99999"), code: 1, stderr: []string{"--to"}},
		{name: "inspect without a running kproxy", args: []string{"inspect", "--address", "127.0.0.1:1"}, code: 1, stderr: []string{"debug endpoint", "--debug-bind-address"}},
		{name: "debug endpoint is loopback only", args: []string{"--debug-bind-address", "0.0.0.0:10259"}, code: 1, stderr: []string{"debugBindAddress", "loopback"}},
		{name: "explain needs from", args: append(explainArgs, "--to", "198.18.128.10:80"), code: 1, stderr: []string{"needs --from"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resetLogging(t)
			var stdout, stderr strings.Builder
			code := run(tc.args, &stdout, &stderr)
			if code != tc.code {
				t.Errorf("exit code %d, want %d\nstdout: %s\nstderr: %s", code, tc.code, stdout.String(), stderr.String())
			}
			for _, s := range tc.stdout {
				if !strings.Contains(stdout.String(), s) {
					t.Errorf("stdout lacks %q:\n%s", s, stdout.String())
				}
			}
			for _, s := range tc.stderr {
				if !strings.Contains(stderr.String(), s) {
					t.Errorf("stderr lacks %q:\n%s", s, stderr.String())
				}
			}
			if tc.wantOutput {
				data, err := os.ReadFile(out)
				if err != nil || !strings.Contains(string(data), "mode: nftables") {
					t.Errorf("written config: %v\n%s", err, data)
				}
			}
		})
	}
}

func TestCheckVersionOverride(t *testing.T) {
	for _, tc := range []struct {
		s  string
		ok bool
	}{
		{"v1.36.3", true},
		{"v1.36.3-custom.1", true},
		{"v1.36.3+build", true},
		{"v1.36.4", false},
		{"v1.35.3", false},
		{"vX", false},
	} {
		if err := checkVersionOverride(tc.s, "v1.36.3"); (err == nil) != tc.ok {
			t.Errorf("checkVersionOverride(%q) = %v, want ok=%v", tc.s, err, tc.ok)
		}
	}
}
