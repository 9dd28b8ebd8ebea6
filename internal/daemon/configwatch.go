package daemon

import (
	"context"
	"errors"
	"fmt"

	"github.com/fsnotify/fsnotify"
)

// errConfigChanged ends the daemon when the --config file is written or
// renamed, as upstream's does: the pod restarts and reads the new settings
// from scratch.
var errConfigChanged = errors.New("content of the proxy server's configuration file was updated")

// configWatch watches the --config file as upstream kube-proxy v1.36 does:
// an inotify watch on the file (through a symlink, on its target), where a
// write or a rename of that file ends the daemon and every other event is
// ignored. A ConfigMap volume update swaps the volume's ..data symlink and
// deletes the old file (chmod and remove events), so an edited ConfigMap,
// as upstream, takes effect when the pod next starts and does not restart
// every node's proxy at once; once the watched file is gone, nothing more
// is reported.
type configWatch struct{ w *fsnotify.Watcher }

// newConfigWatch starts watching path.
func newConfigWatch(path string) (*configWatch, error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("watching the configuration file: %w", err)
	}
	if err := w.Add(path); err != nil {
		_ = w.Close()
		return nil, fmt.Errorf("watching the configuration file %s: %w", path, err)
	}
	return &configWatch{w: w}, nil
}

// run reports errConfigChanged on errc at the file's first write or rename,
// or the watch's error, as upstream ends on either; it returns then, or
// when ctx is done, and closes the watch.
func (c *configWatch) run(ctx context.Context, errc chan<- error) {
	defer c.w.Close()
	for {
		var err error
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-c.w.Events:
			if !ok {
				return
			}
			if !ev.Has(fsnotify.Write) && !ev.Has(fsnotify.Rename) {
				continue
			}
			err = errConfigChanged
		case werr, ok := <-c.w.Errors:
			if !ok {
				return
			}
			err = fmt.Errorf("watching the configuration file: %w", werr)
		}
		select {
		case errc <- err:
		case <-ctx.Done():
		}
		return
	}
}
