package daemon

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestConfigWatch: as upstream's inotify watch, a write (same bytes or
// not) or a rename of the --config file ends the daemon; a ConfigMap
// volume's update (a new data directory, the ..data symlink swapped, the
// old directory removed) and a chmod do not.
func TestConfigWatch(t *testing.T) {
	const conf = "mode: nftables\n"
	for _, tc := range []struct {
		name string
		// plain: a regular file (a hostPath config) instead of a
		// ConfigMap volume's symlinks.
		plain  bool
		change func(t *testing.T, dir string)
		want   bool
	}{
		{"same bytes rewritten", true, func(t *testing.T, dir string) { write(t, filepath.Join(dir, "config.conf"), conf) }, true},
		{"content changed", true, func(t *testing.T, dir string) { write(t, filepath.Join(dir, "config.conf"), "mode: iptables\n") }, true},
		{"renamed", true, func(t *testing.T, dir string) {
			must(t, os.Rename(filepath.Join(dir, "config.conf"), filepath.Join(dir, "old.conf")))
		}, true},
		{"chmod", false, func(t *testing.T, dir string) { must(t, os.Chmod(filepath.Join(dir, "config.conf"), 0o644)) }, false},
		{"ConfigMap volume update", false, func(t *testing.T, dir string) {
			// The kubelet's atomic writer: a new timestamped directory,
			// ..data swapped to it by a rename, the old one removed.
			must(t, os.Mkdir(filepath.Join(dir, "..2"), 0o755))
			write(t, filepath.Join(dir, "..2", "config.conf"), "mode: iptables\n")
			must(t, os.Symlink("..2", filepath.Join(dir, "..data_tmp")))
			must(t, os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")))
			must(t, os.RemoveAll(filepath.Join(dir, "..1")))
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			// The layout of a ConfigMap volume: config.conf -> ..data/config.conf,
			// ..data -> ..1.
			must(t, os.Mkdir(filepath.Join(dir, "..1"), 0o755))
			write(t, filepath.Join(dir, "..1", "config.conf"), conf)
			must(t, os.Symlink("..1", filepath.Join(dir, "..data")))
			must(t, os.Symlink(filepath.Join("..data", "config.conf"), filepath.Join(dir, "config.conf")))
			path := filepath.Join(dir, "config.conf")
			if tc.plain {
				must(t, os.Remove(path))
				write(t, path, conf)
			}
			w, err := newConfigWatch(path)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			errc := make(chan error, 1)
			done := make(chan struct{})
			go func() { w.run(ctx, errc); close(done) }()
			tc.change(t, dir)
			select {
			case err := <-errc:
				if !tc.want || !errors.Is(err, errConfigChanged) {
					t.Fatalf("got %v, want a change: %v", err, tc.want)
				}
			case <-time.After(300 * time.Millisecond):
				if tc.want {
					t.Fatal("no change reported")
				}
			}
			cancel()
			<-done
		})
	}
}

func write(t *testing.T, path, content string) {
	t.Helper()
	must(t, os.WriteFile(path, []byte(content), 0o600))
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
