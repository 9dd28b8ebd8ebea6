//go:build e2e

package bench

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/kproxy/kproxy/test/testbed/netbed"
)

// prober sends the benchmark's traffic from one pod namespace.
type prober struct {
	ns *netbed.Netns
}

// attemptTimeout bounds one connect: a SYN that is dropped is retransmitted
// only after 1 s, so anything slower counts as "no answer".
const attemptTimeout = 500 * time.Millisecond

// run runs fn with a fresh event loop inside the namespace.
func (p prober) run(timeout time.Duration, fn func(l *connLoop) error) error {
	return p.ns.Do(func() error {
		l, err := newConnLoop(timeout)
		if err != nil {
			return err
		}
		defer l.close()
		return fn(l)
	})
}

// waitAnswering fires a connect to every target not yet answering every
// `every`, until each has answered once, and returns when the last one
// answered (completion of its first successful connect). It gives up at
// deadline or when abort returns an error.
func (p prober) waitAnswering(targets []netip.AddrPort, every time.Duration, deadline time.Time, abort func() error) (time.Time, error) {
	var last time.Time
	err := p.run(attemptTimeout, func(l *connLoop) error {
		answered := make([]bool, len(targets))
		left := len(targets)
		done := func(a *attempt) {
			if a.outcome == ok && !answered[a.tag] {
				answered[a.tag] = true
				left--
				last = a.end
			}
		}
		next := time.Now()
		for left > 0 {
			now := time.Now()
			if now.After(deadline) {
				return fmt.Errorf("%d of %d sample Services not answering", left, len(targets))
			}
			if !now.Before(next) {
				if err := abort(); err != nil {
					return err
				}
				for i, t := range targets {
					if !answered[i] {
						if a := l.fire(t, i); a.fd < 0 {
							done(a)
						}
					}
				}
				next = now.Add(every)
			}
			l.poll(time.Until(next), done)
		}
		return nil
	})
	return last, err
}

// changeResult is the outcome of one timed change.
type changeResult struct {
	latency  time.Duration // write start -> start of the first connect seeing the new state
	start    time.Time     // write start
	attempts int
}

// errChangeTimeout: the new state was not seen within the bound.
var errChangeTimeout = errors.New("new state not seen in time")

// timeChange starts write (an API write, on another goroutine) and, from
// the same moment, a fresh connect to dst every `every`. It returns the
// time from the write's start to the start of the earliest connect whose
// outcome is want. Connects started before the write never count.
func (p prober) timeChange(dst netip.AddrPort, want outcome, every, bound time.Duration, write func() error) (changeResult, error) {
	var res changeResult
	err := p.run(attemptTimeout, func(l *connLoop) error {
		werr := make(chan error, 1)
		t0 := time.Now()
		go func() { werr <- write() }()
		var seen *attempt
		wrote := false
		done := func(a *attempt) {
			if a.outcome == want && (seen == nil || a.start.Before(seen.start)) {
				seen = a
			}
		}
		next := t0
		for seen == nil {
			now := time.Now()
			if now.Sub(t0) > bound {
				return errChangeTimeout
			}
			select {
			case err := <-werr:
				if err != nil {
					return fmt.Errorf("API write: %w", err)
				}
				wrote = true
			default:
			}
			if !now.Before(next) {
				if a := l.fire(dst, 0); a.fd < 0 {
					done(a)
				}
				res.attempts++
				next = next.Add(every)
				if next.Before(now) { // fell behind: do not burst
					next = now.Add(every)
				}
			}
			l.poll(time.Until(next), done)
		}
		// Connects started earlier may still be on their way: give them a
		// moment, they may have seen the new state first.
		l.drain(20*time.Millisecond, done)
		res.start, res.latency = t0, seen.start.Sub(t0)
		// The proxy may act before the API server answers the write: wait
		// for the answer, so that the caller sees the written object.
		if !wrote {
			if err := <-werr; err != nil {
				return fmt.Errorf("API write: %w", err)
			}
		}
		return nil
	})
	return res, err
}

// connectLatencies makes n sequential connects to dst and returns the
// handshake times of those that succeeded (first-packet latency: SYN out,
// SYN-ACK back through the proxy's rules).
func (p prober) connectLatencies(dst netip.AddrPort, n int) ([]time.Duration, error) {
	var out []time.Duration
	err := p.run(attemptTimeout, func(l *connLoop) error {
		for range n {
			var got *attempt
			if a := l.fire(dst, 0); a.fd < 0 {
				got = a
			}
			for got == nil {
				l.poll(attemptTimeout, func(a *attempt) { got = a })
			}
			if got.outcome == ok {
				out = append(out, got.elapsed())
			}
		}
		return nil
	})
	if err == nil && len(out) < n/2 {
		err = fmt.Errorf("only %d of %d connects to %s succeeded", len(out), n, dst)
	}
	return out, err
}

// connectRate keeps `parallel` connects to dst in flight for d and returns
// the successful new connections per second.
func (p prober) connectRate(dst netip.AddrPort, parallel int, d time.Duration) (float64, error) {
	var okCount, fails int
	err := p.run(attemptTimeout, func(l *connLoop) error {
		done := func(a *attempt) {
			if a.outcome == ok {
				okCount++
			} else {
				fails++
			}
		}
		end := time.Now().Add(d)
		for time.Now().Before(end) {
			for i := l.inFlight(); i < parallel; i++ {
				if a := l.fire(dst, 0); a.fd < 0 {
					done(a)
				}
			}
			l.poll(time.Until(end), done)
		}
		l.drain(attemptTimeout, func(*attempt) {})
		return nil
	})
	if err == nil && fails > okCount/100+10 {
		err = fmt.Errorf("%d failed connects (%d ok) to %s", fails, okCount, dst)
	}
	return float64(okCount) / d.Seconds(), err
}
