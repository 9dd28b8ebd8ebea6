package netbed

import (
	"context"
	"os"
	"os/exec"
	"testing"
)

// RequireRoot skips t when not running as root with the tools the testbed
// needs — except in CI (CI=true), where it fails instead.
func RequireRoot(t testing.TB) {
	t.Helper()
	missing := ""
	if os.Geteuid() != 0 {
		missing = "not running as root"
	}
	for _, tool := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(tool); err != nil && missing == "" {
			missing = tool + " not found in PATH"
		}
	}
	if missing == "" {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("testbed prerequisite missing in CI: %s", missing)
	}
	t.Skipf("skipping privileged testbed test: %s", missing)
}

// Start builds a Bed for t (RequireRoot first, then DeleteStale) and registers its Teardown
// with t.Cleanup. When t fails, the process logs are printed before teardown.
// Progress goes to t.Logf unless opts.Logf is set.
func Start(t testing.TB, opts Options) *Bed {
	t.Helper()
	RequireRoot(t)
	if opts.Logf == nil {
		opts.Logf = t.Logf
	}
	for _, err := range DeleteStale() {
		t.Logf("netbed: removing leftovers of earlier runs: %v", err)
	}
	b := New(opts)
	t.Cleanup(func() {
		if t.Failed() {
			b.DumpLogs(t.Logf)
		}
		if err := b.Teardown(); err != nil {
			t.Errorf("netbed teardown: %v", err)
		}
		if !t.Failed() {
			_ = b.RemoveLogs()
		}
	})
	if err := b.Up(context.Background()); err != nil {
		t.Fatalf("netbed up: %v", err)
	}
	return b
}

// DumpLogs writes every process's log through logf.
func (b *Bed) DumpLogs(logf func(format string, args ...any)) {
	b.mu.Lock()
	procs := append([]*Process(nil), b.procs...)
	b.mu.Unlock()
	for _, p := range procs {
		logf("---- %s in %s (%s) ----\n%s", p.Name, p.Netns.Name, p.LogPath, p.Log())
	}
}
