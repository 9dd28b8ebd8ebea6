package runner

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// call is one recorded sync: when it started (relative to t0) and what it was asked.
type call struct {
	At     time.Duration
	Full   bool
	Reason Reason
}

func (c call) String() string { return fmt.Sprintf("%v %s full=%v", c.At, c.Reason, c.Full) }

// harness drives a Runner with a fake clock. The runner's onIdle hook tells
// the harness when the loop waits and until when, so every step is
// deterministic and nothing sleeps.
type harness struct {
	t     *testing.T
	clock *clocktesting.FakeClock
	r     *Runner
	idle  chan time.Time
	wake  time.Time

	ready   atomic.Bool
	drifted atomic.Bool
	fails   map[int]bool // sync calls (0-based) that fail

	mu     sync.Mutex
	calls  []call
	polls  int
	cancel context.CancelFunc
	done   chan struct{}
}

func newHarness(t *testing.T, cfg Config, fails ...int) *harness {
	t.Helper()
	h := &harness{t: t, clock: clocktesting.NewFakeClock(t0), idle: make(chan time.Time), fails: map[int]bool{}}
	for _, i := range fails {
		h.fails[i] = true
	}
	cfg.Clock = h.clock
	if cfg.Ready == nil {
		cfg.Ready = h.ready.Load
	}
	r, err := New(cfg, h.sync)
	if err != nil {
		t.Fatal(err)
	}
	r.onIdle = func(w time.Time) { h.idle <- w }
	h.r = r
	return h
}

func (h *harness) sync(_ context.Context, req Request) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := len(h.calls)
	h.calls = append(h.calls, call{At: h.clock.Now().Sub(t0), Full: req.Full, Reason: req.Reason})
	if h.fails[n] {
		return errors.New("injected failure")
	}
	return nil
}

func (h *harness) drift(context.Context) bool {
	h.mu.Lock()
	h.polls++
	h.mu.Unlock()
	return h.drifted.Swap(false)
}

func (h *harness) start() {
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel, h.done = cancel, make(chan struct{})
	go func() { defer close(h.done); h.r.Run(ctx) }()
	h.wait()
	h.t.Cleanup(h.stop)
}

func (h *harness) stop() {
	h.cancel()
	<-h.done
}

// wait reads the next idle report, failing instead of hanging.
func (h *harness) wait() {
	select {
	case h.wake = <-h.idle:
	case <-time.After(10 * time.Second):
		h.t.Fatal("runner loop did not go idle")
	}
}

func (h *harness) trigger() { h.r.Trigger(); h.wait() }

// advance moves the clock forward by d, letting the loop act at every
// wake-up on the way.
func (h *harness) advance(d time.Duration) {
	target := h.clock.Now().Add(d)
	for !h.wake.After(target) {
		h.clock.SetTime(h.wake)
		h.wait()
	}
	h.clock.SetTime(target)
}

func (h *harness) recorded() []call {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]call(nil), h.calls...)
}

// step is one action in a scenario.
type step struct {
	trigger bool
	ready   bool // make Ready return true (then poke the loop with a trigger)
	drift   bool // make the next Drifted poll return true
	advance time.Duration
}

func (h *harness) do(s step) {
	switch {
	case s.ready:
		h.ready.Store(true)
		h.trigger()
	case s.trigger:
		h.trigger()
	case s.drift:
		h.drifted.Store(true)
	}
	if s.advance > 0 {
		h.advance(s.advance)
	}
}

func TestRunnerSchedule(t *testing.T) {
	base := Config{MinInterval: time.Second, MaxInterval: time.Hour, RetryInterval: 30 * time.Second, FullInterval: time.Hour}
	sec := time.Second
	tests := []struct {
		name  string
		cfg   Config
		fails []int
		steps []step
		want  []call
	}{{
		name:  "nothing syncs until ready, not even when triggered or after long waits",
		cfg:   base,
		steps: []step{{trigger: true, advance: 2 * time.Hour}},
		want:  nil,
	}, {
		name:  "first sync is full, right when ready",
		cfg:   base,
		steps: []step{{advance: 5 * sec}, {ready: true}},
		want:  []call{{5 * sec, true, ReasonInitial}},
	}, {
		name: "triggers within MinInterval coalesce into one partial sync",
		cfg:  base,
		steps: []step{{ready: true}, {advance: 200 * time.Millisecond}, {trigger: true},
			{advance: 300 * time.Millisecond}, {trigger: true}, {advance: 2 * sec}},
		want: []call{{0, true, ReasonInitial}, {sec, false, ReasonChange}},
	}, {
		name:  "a trigger after MinInterval syncs at once",
		cfg:   base,
		steps: []step{{ready: true}, {advance: 10 * sec}, {trigger: true}},
		want:  []call{{0, true, ReasonInitial}, {10 * sec, false, ReasonChange}},
	}, {
		name:  "idle: periodic full sync every MaxInterval (upstream: one hour)",
		cfg:   base,
		steps: []step{{ready: true}, {advance: 2*time.Hour + sec}},
		want:  []call{{0, true, ReasonInitial}, {time.Hour, true, ReasonPeriodic}, {2 * time.Hour, true, ReasonPeriodic}},
	}, {
		name:  "ipvs-like: periodic every syncPeriod, partial until FullInterval",
		cfg:   Config{MinInterval: sec, MaxInterval: 30 * sec, FullInterval: 70 * sec},
		steps: []step{{ready: true}, {advance: 100 * sec}},
		want: []call{{0, true, ReasonInitial}, {30 * sec, false, ReasonPeriodic},
			{60 * sec, false, ReasonPeriodic}, {90 * sec, true, ReasonPeriodic}},
	}, {
		name:  "a failure is retried after RetryInterval with a full sync",
		cfg:   base,
		fails: []int{1},
		steps: []step{{ready: true}, {advance: 5 * sec}, {trigger: true}, {advance: time.Minute}},
		want:  []call{{0, true, ReasonInitial}, {5 * sec, false, ReasonChange}, {35 * sec, true, ReasonRetry}},
	}, {
		name:  "a trigger after a failure syncs before the retry is due, and full",
		cfg:   base,
		fails: []int{0},
		steps: []step{{ready: true}, {advance: 3 * sec}, {trigger: true}, {advance: time.Minute}},
		want:  []call{{0, true, ReasonInitial}, {3 * sec, true, ReasonChange}},
	}, {
		name:  "repeated failures keep retrying every RetryInterval",
		cfg:   base,
		fails: []int{0, 1, 2},
		steps: []step{{ready: true}, {advance: 100 * sec}},
		want: []call{{0, true, ReasonInitial}, {30 * sec, true, ReasonRetry},
			{60 * sec, true, ReasonRetry}, {90 * sec, true, ReasonRetry}},
	}, {
		name:  "retry never later than MaxInterval",
		cfg:   Config{MinInterval: sec, MaxInterval: 10 * sec, RetryInterval: time.Minute},
		fails: []int{0},
		steps: []step{{ready: true}, {advance: 15 * sec}},
		want:  []call{{0, true, ReasonInitial}, {10 * sec, true, ReasonRetry}},
	}, {
		name:  "MinInterval also holds back a retry-triggering change",
		cfg:   Config{MinInterval: 10 * sec, MaxInterval: time.Hour, RetryInterval: 5 * sec},
		fails: []int{0},
		steps: []step{{ready: true}, {advance: 20 * sec}},
		want:  []call{{0, true, ReasonInitial}, {10 * sec, true, ReasonRetry}},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, tc.cfg, tc.fails...)
			h.start()
			for _, s := range tc.steps {
				h.do(s)
			}
			assertCalls(t, h.recorded(), tc.want)
		})
	}
}

func TestRunnerDrift(t *testing.T) {
	sec := time.Second
	tests := []struct {
		name  string
		min   time.Duration
		steps []step
		want  []call
	}{{
		name:  "drift repaired by a full sync at the next poll",
		min:   sec,
		steps: []step{{ready: true}, {advance: 10 * sec}, {drift: true}, {advance: 1500 * time.Millisecond}},
		want:  []call{{0, true, ReasonInitial}, {11 * sec, true, ReasonDrift}},
	}, {
		name:  "drift repair waits for MinInterval",
		min:   5 * sec,
		steps: []step{{ready: true}, {drift: true}, {advance: 10 * sec}},
		want:  []call{{0, true, ReasonInitial}, {5 * sec, true, ReasonDrift}},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, Config{MinInterval: tc.min, MaxInterval: time.Hour, Drifted: nil})
			h.r.cfg.Drifted = h.drift
			h.start()
			for _, s := range tc.steps {
				h.do(s)
			}
			assertCalls(t, h.recorded(), tc.want)
		})
	}
}

func TestRunnerNoDriftPollBeforeFirstSync(t *testing.T) {
	h := newHarness(t, Config{MinInterval: time.Second, MaxInterval: time.Hour})
	h.r.cfg.Drifted = h.drift
	h.start()
	h.advance(10 * time.Second)
	h.mu.Lock()
	polls := h.polls
	h.mu.Unlock()
	if polls != 0 {
		t.Errorf("Drifted polled %d times before any sync", polls)
	}
	h.do(step{ready: true})
	h.advance(3 * time.Second)
	h.mu.Lock()
	polls = h.polls
	h.mu.Unlock()
	if polls < 2 {
		t.Errorf("Drifted polled %d times in 3 s after the first sync, want >= 2", polls)
	}
}

func TestRunnerReadyByPoll(t *testing.T) {
	h := newHarness(t, Config{MinInterval: time.Second, MaxInterval: time.Hour})
	h.start()
	h.advance(1500 * time.Millisecond)
	h.ready.Store(true) // no trigger: the loop's next poll notices
	h.advance(time.Second)
	assertCalls(t, h.recorded(), []call{{2 * time.Second, true, ReasonInitial}})
}

func TestRunnerPanicIsAFailure(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	idle := make(chan time.Time)
	var n atomic.Int32
	r, err := New(Config{MinInterval: time.Second, MaxInterval: time.Hour, RetryInterval: 10 * time.Second, Clock: clk},
		func(context.Context, Request) error {
			if n.Add(1) == 1 {
				panic("boom")
			}
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	r.onIdle = func(w time.Time) { idle <- w }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	wake := <-idle
	if got := wake.Sub(t0); got != 10*time.Second {
		t.Errorf("after a panic the next wake-up is %v, want the retry at 10s", got)
	}
	clk.SetTime(wake)
	<-idle
	if n.Load() != 2 {
		t.Errorf("sync ran %d times, want 2", n.Load())
	}
	cancel()
	<-done
}

func TestNewValidates(t *testing.T) {
	noop := func(context.Context, Request) error { return nil }
	tests := []struct {
		name string
		cfg  Config
		fn   SyncFunc
		ok   bool
	}{
		{"valid", Config{MinInterval: time.Second, MaxInterval: time.Hour}, noop, true},
		{"zero min is fine", Config{MaxInterval: time.Hour}, noop, true},
		{"max below min", Config{MinInterval: time.Minute, MaxInterval: time.Second}, noop, false},
		{"zero max", Config{MinInterval: time.Second}, noop, false},
		{"negative min", Config{MinInterval: -1, MaxInterval: time.Second}, noop, false},
		{"nil func", Config{MinInterval: time.Second, MaxInterval: time.Hour}, nil, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.cfg, tc.fn)
			if (err == nil) != tc.ok {
				t.Errorf("New() error = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

func assertCalls(t *testing.T, got, want []call) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d syncs %v, want %d %v", len(got), got, len(want), want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("sync %d = %v, want %v", i, got[i], want[i])
		}
	}
}
