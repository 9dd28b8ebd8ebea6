package daemon

import (
	"context"
	"runtime/debug"
	"testing"
	"time"
)

func TestColdLimit(t *testing.T) {
	const mb = 1 << 20
	for _, tc := range []struct {
		name string
		live int64
		want int64
	}{
		{"small heap gets the floor", 10 * mb, defaultMemoryLimit},
		{"at the floor", defaultMemoryLimit * 10 / 22, defaultMemoryLimit},
		{"10k x 100 after its model", 120 * mb, 264 * mb},
	} {
		if got := coldLimit(tc.live); got != tc.want {
			t.Errorf("%s: coldLimit(%d) = %d, want %d", tc.name, tc.live, got, tc.want)
		}
	}
}

func TestRaisedLimit(t *testing.T) {
	for _, tc := range []struct {
		name        string
		live, limit int64
		want        int64
	}{
		{"a quarter free: kept", 100, 125, 125},
		{"more free: kept", 100, 300, 300},
		{"less than a quarter free: 1.5 x live", 101, 125, 151},
		{"live over the limit", 400, 300, 600},
	} {
		if got := raisedLimit(tc.live, tc.limit); got != tc.want {
			t.Errorf("%s: raisedLimit(%d, %d) = %d, want %d", tc.name, tc.live, tc.limit, got, tc.want)
		}
	}
}

// TestGuardColdLimit: a limit below the live heap is raised above it, and
// the guard ends with its context.
func TestGuardColdLimit(t *testing.T) {
	old := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(old)
	keep := make([]byte, 8<<20)
	defer func() { _ = keep[0] }()
	debug.FreeOSMemory() // a collection: the live heap is known
	live := liveHeap()
	if live == 0 {
		t.Fatal("the runtime reports no live heap")
	}
	debug.SetMemoryLimit(live / 2)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		guardColdLimit(ctx, time.Millisecond)
	}()
	deadline := time.Now().Add(5 * time.Second)
	for debug.SetMemoryLimit(-1) < live && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done
	if got := debug.SetMemoryLimit(-1); got < live {
		t.Errorf("limit %d after the guard, want it raised above the live heap %d", got, live)
	}
}
