package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	logsapi "k8s.io/component-base/logs/api/v1"
)

// upstreamHelp is upstream kube-proxy's --help output, checked in. To
// regenerate it for a new upstream version (then update
// config.UpstreamVersion and the feature gate list):
//
//	~/.cache/kproxy/bin/vX.Y.Z/kube-proxy --help > cmd/kproxy/testdata/kube-proxy-vX.Y.Z-help.txt
const upstreamHelp = "testdata/kube-proxy-v1.36.3-help.txt"

// flagLine matches the first line of one flag in pflag's usage listing:
// optional shorthand, name, then the rest (value name, usage, default).
var flagLine = regexp.MustCompile(`^\s+(?:-\w, )?--([a-z0-9-]+)(.*)$`)

// helpFlag is one flag of a --help listing.
type helpFlag struct {
	// signature is the flag as listed before its usage text: shorthand,
	// name and value type, e.g. "--proxy-mode ProxyMode".
	signature string
	// usage is the usage text, default included, joined over lines.
	usage string
}

// parseHelp returns the flags of a --help output by name.
func parseHelp(t *testing.T, help string) map[string]helpFlag {
	t.Helper()
	flags := map[string]helpFlag{}
	var current string
	for _, line := range strings.Split(help, "\n") {
		if m := flagLine.FindStringSubmatch(line); m != nil {
			current = m[1]
			sig, usage := splitSignature(strings.TrimSpace(line))
			flags[current] = helpFlag{signature: sig, usage: usage}
			continue
		}
		if current == "" || strings.TrimSpace(line) == "" {
			current = ""
			continue
		}
		f := flags[current]
		f.usage += "\n" + strings.TrimSpace(line)
		flags[current] = f
	}
	if len(flags) == 0 {
		t.Fatal("no flags found in the help output")
	}
	return flags
}

// splitSignature splits "--name type   usage" at the run of spaces that
// pflag puts before the usage text.
func splitSignature(line string) (sig, usage string) {
	i := strings.Index(line, "   ")
	if i < 0 {
		return line, ""
	}
	return line[:i], strings.TrimSpace(line[i:])
}

// TestUpstreamFlags fails when a flag of upstream kube-proxy is missing
// from kproxy, or differs in value type, default or usage text.
func TestUpstreamFlags(t *testing.T) {
	data, err := os.ReadFile(upstreamHelp)
	if err != nil {
		t.Fatal(err)
	}
	upstream := parseHelp(t, string(data))
	var stdout, stderr strings.Builder
	if code := run([]string{"--help"}, &stdout, &stderr); code != 0 {
		t.Fatalf("--help: exit %d: %s", code, stderr.String())
	}
	ours := parseHelp(t, stdout.String())
	for name, want := range upstream {
		got, ok := ours[name]
		switch {
		case !ok:
			t.Errorf("flag --%s of upstream kube-proxy is missing", name)
		case got.signature != want.signature:
			t.Errorf("flag --%s: listed as %q, upstream %q", name, got.signature, want.signature)
		case name == "help":
			// "help for kube-proxy" vs "help for kproxy".
		case got.usage != want.usage:
			t.Errorf("flag --%s: usage/default differ:\n got: %s\nwant: %s", name, got.usage, want.usage)
		}
	}
	for name, f := range ours {
		if _, ok := upstream[name]; !ok && !strings.HasPrefix(f.usage, "[kproxy] ") {
			t.Errorf("flag --%s is not upstream's: its usage must start with [kproxy]", name)
		}
	}
}

// TestHiddenUpstreamFlags checks the flags upstream accepts without
// listing them in --help (deprecated ones): they must parse.
func TestHiddenUpstreamFlags(t *testing.T) {
	resetLogging(t)
	out := filepath.Join(t.TempDir(), "out.yaml")
	args := []string{"--healthz-port=0", "--metrics-port=10999", "--write-config-to=" + out}
	var stdout, stderr strings.Builder
	if code := run(args, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	// As upstream: with --write-config-to the deprecated port flags are
	// not folded into the addresses.
	if !strings.Contains(string(data), "metricsBindAddress: 127.0.0.1:10249") {
		t.Errorf("written config:\n%s", data)
	}
}

// resetLogging lets the next run apply its logging configuration again
// (component-base allows that once per process).
func resetLogging(t *testing.T) {
	t.Cleanup(func() {
		if err := logsapi.ResetForTest(nil); err != nil {
			t.Error(err)
		}
	})
}
