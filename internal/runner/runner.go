// Package runner decides when kproxy programs the kernel. It coalesces change
// notifications into syncs at most every MinInterval, syncs at least every
// MaxInterval when nothing changes, retries after RetryInterval when a sync
// fails, forces a full sync every FullInterval and polls for drift (kernel
// state changed behind kproxy's back). Nothing syncs until Ready reports true.
//
// It is the one place that loops and sleeps: dataplanes never do. The clock is
// injected, so tests drive it with a fake clock and never sleep.
package runner

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// FullSyncPeriod is how often upstream kube-proxy v1.36 (iptables and
// nftables modes) rewrites everything even when nothing changed.
const FullSyncPeriod = time.Hour

// DefaultPollInterval is how often Drifted (and Ready, until it is true) are
// polled when Config.PollInterval is zero.
const DefaultPollInterval = time.Second

// Reason says why a sync runs.
type Reason string

const (
	// ReasonInitial is the first sync after Ready became true.
	ReasonInitial Reason = "initial"
	// ReasonChange is a sync for changes announced with Trigger.
	ReasonChange Reason = "change"
	// ReasonRetry retries a failed sync.
	ReasonRetry Reason = "retry"
	// ReasonPeriodic is the sync due MaxInterval after the last one.
	ReasonPeriodic Reason = "periodic"
	// ReasonDrift repairs kernel state that Drifted reported changed.
	ReasonDrift Reason = "drift"
)

// Request is what one sync is asked to do.
type Request struct {
	// Full asks the sync to rewrite everything and re-read kernel state: the
	// first sync, the one after a failure, after drift, and every FullInterval.
	Full   bool
	Reason Reason
}

// SyncFunc programs the kernel. An error makes the runner retry after
// RetryInterval with a full sync.
type SyncFunc func(ctx context.Context, req Request) error

// Config sets the runner's timing and the conditions it polls.
type Config struct {
	// MinInterval is the least time from the end of one sync to the start of
	// the next (minSyncPeriod). Triggers inside it are coalesced.
	MinInterval time.Duration
	// MaxInterval is the most time from the end of one sync to the start of
	// the next when nothing is triggered. Upstream uses FullSyncPeriod (1 h)
	// for iptables and nftables, syncPeriod for ipvs. Must be >= MinInterval.
	MaxInterval time.Duration
	// RetryInterval is how soon a failed sync is retried (upstream: syncPeriod).
	// Zero or more than MaxInterval means MaxInterval.
	RetryInterval time.Duration
	// FullInterval forces Request.Full when the last full sync is this old.
	// Zero never forces it (the first sync and retries are full anyway).
	FullInterval time.Duration
	// PollInterval is how often Drifted and Ready are polled; zero means
	// DefaultPollInterval.
	PollInterval time.Duration

	// Ready reports whether the inputs are complete (Services and
	// EndpointSlices synced). Nil means always ready.
	Ready func() bool
	// Drifted reports whether the kernel state was changed behind kproxy's
	// back. It is polled only after a successful sync, never concurrently with
	// a sync. Nil disables drift polling.
	Drifted func(ctx context.Context) bool

	// Clock is the time source; nil means the real clock.
	Clock clock.Clock
}

// Runner runs a SyncFunc with bounded frequency. Create it with New and start
// it with Run; Trigger may be called from any goroutine at any time.
type Runner struct {
	cfg     Config
	sync    SyncFunc
	trigger chan struct{}
	st      state

	// onIdle, when set (tests only), is called each time the loop is about to
	// wait, with the time it will wake up at the latest.
	onIdle func(wake time.Time)
}

// state is owned by the goroutine in Run.
type state struct {
	pending   bool // Trigger was called since the last sync started
	drifted   bool // Drifted returned true since the last sync started
	failed    bool // the last sync failed
	needFull  bool
	synced    bool      // a sync has succeeded
	lastEnd   time.Time // end of the last sync; zero before the first
	lastFull  time.Time // end of the last successful full sync
	due       time.Time // periodic or retry deadline
	nextPoll  time.Time
	wasReady  bool // Ready's answer at the top of this loop iteration
	readyOnce bool // Ready has returned true once
}

// New checks cfg and returns a Runner that calls sync. It starts nothing.
func New(cfg Config, sync SyncFunc) (*Runner, error) {
	if sync == nil {
		return nil, errors.New("runner: nil sync func")
	}
	if cfg.MinInterval < 0 || cfg.MaxInterval <= 0 {
		return nil, fmt.Errorf("runner: need MinInterval >= 0 and MaxInterval > 0, have %v and %v", cfg.MinInterval, cfg.MaxInterval)
	}
	if cfg.MaxInterval < cfg.MinInterval {
		return nil, fmt.Errorf("runner: MaxInterval %v is less than MinInterval %v", cfg.MaxInterval, cfg.MinInterval)
	}
	if cfg.RetryInterval <= 0 || cfg.RetryInterval > cfg.MaxInterval {
		cfg.RetryInterval = cfg.MaxInterval
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	r := &Runner{cfg: cfg, sync: sync, trigger: make(chan struct{}, 1)}
	r.st.pending = true // the initial sync
	r.st.needFull = true
	return r, nil
}

// Trigger asks for a sync as soon as MinInterval allows. It never blocks;
// triggers before the next sync starts are coalesced into one.
func (r *Runner) Trigger() {
	select {
	case r.trigger <- struct{}{}:
	default:
	}
}

// Run runs syncs until ctx is cancelled. Call it once.
func (r *Runner) Run(ctx context.Context) {
	logger := klog.FromContext(ctx).WithName("runner")
	ctx = klog.NewContext(ctx, logger)
	r.st.nextPoll = r.cfg.Clock.Now().Add(r.cfg.PollInterval)
	for ctx.Err() == nil {
		now := r.cfg.Clock.Now()
		r.poll(ctx, now)
		if req, ok := r.decide(now); ok {
			r.runOnce(ctx, req)
			continue
		}
		if !r.wait(ctx, r.nextWake(now)) {
			return
		}
	}
}

func (r *Runner) ready() bool {
	return r.cfg.Ready == nil || r.cfg.Ready()
}

// poll takes a waiting trigger, checks readiness and, when due, drift.
func (r *Runner) poll(ctx context.Context, now time.Time) {
	select {
	case <-r.trigger:
		r.st.pending = true
	default:
	}
	ready := r.ready()
	if ready && !r.st.readyOnce {
		klog.FromContext(ctx).V(2).Info("Inputs synced, syncing may start")
		r.st.readyOnce = true
	}
	r.st.wasReady = ready
	if now.Before(r.st.nextPoll) {
		return
	}
	r.st.nextPoll = now.Add(r.cfg.PollInterval)
	if r.cfg.Drifted == nil || !r.st.synced || !ready || r.st.drifted {
		return
	}
	if r.cfg.Drifted(ctx) {
		klog.FromContext(ctx).Info("Kernel state changed outside kproxy, scheduling a full sync")
		r.st.drifted = true
	}
}

// reason returns why a sync is wanted now, or "" when none is.
func (r *Runner) reason(now time.Time) Reason {
	switch {
	case !r.st.synced && !r.st.failed:
		return ReasonInitial
	case r.st.drifted:
		return ReasonDrift
	case r.st.pending:
		return ReasonChange
	case now.Before(r.st.due):
		return ""
	case r.st.failed:
		return ReasonRetry
	default:
		return ReasonPeriodic
	}
}

// decide returns the sync to run now, if any.
func (r *Runner) decide(now time.Time) (Request, bool) {
	if !r.st.wasReady {
		return Request{}, false
	}
	reason := r.reason(now)
	if reason == "" || now.Before(r.earliest()) {
		return Request{}, false
	}
	full := r.st.needFull || reason == ReasonDrift ||
		(r.cfg.FullInterval > 0 && !now.Before(r.st.lastFull.Add(r.cfg.FullInterval)))
	return Request{Full: full, Reason: reason}, true
}

// earliest is the first moment MinInterval allows the next sync to start.
func (r *Runner) earliest() time.Time {
	if r.st.lastEnd.IsZero() {
		return time.Time{}
	}
	return r.st.lastEnd.Add(r.cfg.MinInterval)
}

// runOnce calls the sync func and schedules what comes next.
func (r *Runner) runOnce(ctx context.Context, req Request) {
	r.st.pending, r.st.drifted = false, false
	err := r.call(ctx, req)
	end := r.cfg.Clock.Now()
	r.st.lastEnd = end
	if err != nil {
		klog.FromContext(ctx).Error(err, "Sync failed, will retry", "reason", req.Reason, "full", req.Full, "retryIn", r.cfg.RetryInterval)
		r.st.failed, r.st.needFull = true, true
		r.st.due = end.Add(r.cfg.RetryInterval)
		return
	}
	r.st.failed, r.st.synced = false, true
	if req.Full {
		r.st.needFull = false
		r.st.lastFull = end
	}
	r.st.due = end.Add(r.cfg.MaxInterval)
}

// call runs the sync func, turning a panic into an error so the loop survives.
func (r *Runner) call(ctx context.Context, req Request) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("sync panicked: %v", p)
		}
	}()
	return r.sync(ctx, req)
}

// nextWake is the latest time the loop must look again; it is after now.
func (r *Runner) nextWake(now time.Time) time.Time {
	if !r.st.wasReady {
		return r.st.nextPoll
	}
	wake := r.st.due
	if r.reason(now) != "" {
		wake = r.earliest()
	}
	if r.polling() && r.st.nextPoll.Before(wake) {
		wake = r.st.nextPoll
	}
	if !wake.After(now) { // cannot happen; never spin
		wake = now.Add(r.cfg.PollInterval)
	}
	return wake
}

// polling reports whether the loop must wake up for Drifted.
func (r *Runner) polling() bool {
	return r.cfg.Drifted != nil && r.st.synced
}

// wait blocks until wake, a Trigger or ctx is done; false means ctx is done.
func (r *Runner) wait(ctx context.Context, wake time.Time) bool {
	timer := r.cfg.Clock.NewTimer(wake.Sub(r.cfg.Clock.Now()))
	defer timer.Stop()
	if r.onIdle != nil {
		r.onIdle(wake)
	}
	select {
	case <-ctx.Done():
		return false
	case <-r.trigger:
		r.st.pending = true
	case <-timer.C():
	}
	return true
}
