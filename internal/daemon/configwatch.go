package daemon

import (
	"bytes"
	"context"
	"errors"
	"os"
	"time"
)

// errConfigChanged ends the daemon when the --config file changes, as
// upstream does: the pod restarts and reads the new settings from scratch.
var errConfigChanged = errors.New("content of the proxy server's configuration file was updated")

// configPollInterval is how often the --config file is compared with what
// was read at start.
const configPollInterval = 2 * time.Second

// watchConfigFile reports errConfigChanged on errc when path's content
// differs from initial. A file rewritten with the same bytes, as ConfigMap
// volume updates often are, is not a change. It returns when ctx is done.
func watchConfigFile(ctx context.Context, path string, initial []byte, interval time.Duration, errc chan<- error) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now, err := os.ReadFile(path)
		if err == nil && bytes.Equal(now, initial) {
			continue
		}
		if err != nil && errors.Is(err, os.ErrNotExist) {
			// A ConfigMap volume swaps a symlink; give it one more tick.
			continue
		}
		select {
		case errc <- errConfigChanged:
		case <-ctx.Done():
		}
		return
	}
}
