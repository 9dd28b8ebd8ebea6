// Package daemon wires kproxy together: sources feed the change tracker, the
// runner rebuilds the model and hands each Snapshot to the dataplane, and the
// health and metrics servers report on it.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/conntrack"
)

// Run runs kproxy until ctx is cancelled. It honours o.CleanupAndExit,
// o.InitOnly and o.DryRun.
func Run(ctx context.Context, o *config.Options) error {
	return run(ctx, o, defaultEnv())
}

// env is everything the daemon takes from the outside world; tests replace
// parts of it.
type env struct {
	hostname   func() (string, error)
	inputs     InputsFunc
	dataplanes map[string]DataplaneFunc
	// servers builds the healthz and metrics servers and the observers that
	// feed them.
	servers   func(p ServerParams) ([]Server, []Observer, error)
	conntrack conntrack.Table
	sysctls   conntrack.IntFiles
	numCPU    func() int
	ipv6      func() bool
	clock     clock.Clock
	stdout    io.Writer
	// nodeIPsWait and podCIDRsWait bound the wait for this node's Node object
	// (upstream: 30 s for its IPs, 5 min for its podCIDRs in NodeCIDR mode).
	nodeIPsWait  time.Duration
	podCIDRsWait time.Duration
	pollInterval time.Duration
}

func defaultEnv() env {
	return env{
		hostname:     os.Hostname,
		inputs:       defaultInputs,
		dataplanes:   defaultDataplanes(),
		servers:      defaultServers,
		conntrack:    conntrack.NewNetlinkTable(),
		sysctls:      conntrack.HostFiles(),
		numCPU:       conntrack.NumCPU,
		ipv6:         kernelIPv6Supported,
		clock:        clock.RealClock{},
		stdout:       os.Stdout,
		nodeIPsWait:  30 * time.Second,
		podCIDRsWait: 5 * time.Minute,
		pollInterval: time.Second,
	}
}

func run(ctx context.Context, o *config.Options, e env) error {
	if o == nil || o.Config == nil {
		return errors.New("daemon: no configuration")
	}
	switch {
	case o.CleanupAndExit:
		return cleanupAll(ctx, e)
	case o.InitOnly:
		return initNode(ctx, o, e)
	}
	d, err := newDaemon(o, e)
	if err != nil {
		return err
	}
	if o.DryRun {
		return d.dryRun(ctx)
	}
	return d.serve(ctx)
}

// cleanupAll is --cleanup: every backend removes what it (or upstream
// kube-proxy in that mode) left in the kernel.
func cleanupAll(ctx context.Context, e env) error {
	var errs []error
	for _, mode := range sortedModes(e.dataplanes) {
		if err := cleanupMode(ctx, e, mode); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// cleanupMode runs one backend's Cleanup.
func cleanupMode(ctx context.Context, e env, mode string) error {
	dp, err := e.dataplanes[mode](cleanupConfig(e))
	if err == nil {
		err = dp.Cleanup(ctx)
	}
	if err != nil {
		return fmt.Errorf("cleaning up %s state: %w", mode, err)
	}
	klog.FromContext(ctx).V(2).Info("Cleaned up leftovers", "mode", mode)
	return nil
}

// initNode is --init-only: the privileged node setup (conntrack sysctls), then exit.
func initNode(ctx context.Context, o *config.Options, e env) error {
	if err := conntrack.ApplySysctls(ctx, &o.Config.Conntrack, e.numCPU(), e.sysctls); err != nil {
		return fmt.Errorf("could not set conntrack parameters from kube-proxy configuration: %w", err)
	}
	return nil
}
