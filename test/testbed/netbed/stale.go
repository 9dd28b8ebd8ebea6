package netbed

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
)

// staleName matches names made with a default-style prefix: "kpt", optional
// letters, the owner's PID, "-".
var staleName = regexp.MustCompile(`^(kpt[a-z]*)([0-9]+)-`)

// DeleteStale removes namespaces and root-namespace links left by earlier
// runs: those named like a default prefix ("kpt<letters><pid>-...") whose
// owner process no longer exists. Names of live processes are left alone.
func DeleteStale() []error {
	var errs []error
	ctx := context.Background()
	entries, err := os.ReadDir("/run/netns")
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return []error{fmt.Errorf("netbed: list namespaces: %w", err)}
	}
	for _, e := range entries {
		if ownerGone(e.Name()) {
			if _, err := run(ctx, "ip", "netns", "delete", e.Name()); err != nil {
				errs = append(errs, err)
			}
		}
	}
	links, err := os.ReadDir("/sys/class/net")
	if err != nil {
		return append(errs, fmt.Errorf("netbed: list links: %w", err))
	}
	for _, l := range links {
		if ownerGone(l.Name()) && strings.HasSuffix(l.Name(), "-h") {
			if _, err := run(ctx, "ip", "link", "delete", l.Name()); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errs
}

// ownerGone reports whether name carries a stale-style prefix whose PID is
// not a running process.
func ownerGone(name string) bool {
	m := staleName.FindStringSubmatch(name)
	if m == nil {
		return false
	}
	pid, err := strconv.Atoi(m[2])
	if err != nil || pid <= 0 {
		return false
	}
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}
