package daemon

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestWatchConfigFile(t *testing.T) {
	for _, tc := range []struct {
		name    string
		rewrite []byte
		want    bool
	}{
		{"same bytes rewritten", []byte("mode: nftables\n"), false},
		{"content changed", []byte("mode: iptables\n"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "config.conf")
			if err := os.WriteFile(path, []byte("mode: nftables\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			errc := make(chan error, 1)
			done := make(chan struct{})
			go func() { watchConfigFile(ctx, path, []byte("mode: nftables\n"), time.Millisecond, errc); close(done) }()
			if err := os.WriteFile(path, tc.rewrite, 0o600); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-errc:
				if !tc.want || !errors.Is(err, errConfigChanged) {
					t.Fatalf("got %v, want a change: %v", err, tc.want)
				}
			case <-time.After(200 * time.Millisecond):
				if tc.want {
					t.Fatal("no change reported")
				}
			}
			cancel()
			<-done
		})
	}
}
