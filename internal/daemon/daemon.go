// Package daemon wires kproxy together: sources feed the change tracker, the
// runner rebuilds the model and hands each Snapshot to the dataplane, and the
// health and metrics servers report on it.
package daemon

import (
	"context"
	"errors"

	"github.com/kproxy/kproxy/internal/config"
)

// Run runs kproxy until ctx is cancelled. It honours o.CleanupAndExit,
// o.InitOnly and o.DryRun.
func Run(ctx context.Context, o *config.Options) error {
	return errors.New("daemon: not implemented yet")
}
