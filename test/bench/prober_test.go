//go:build e2e

package bench

import (
	"errors"
	"fmt"
	"net/netip"
	"syscall"
	"time"
)

// The prober opens TCP connections without goroutines or exec: one event
// loop on a thread switched into a pod's network namespace (netbed's
// Netns.Do), non-blocking sockets, epoll. Every attempt is a fresh socket and
// a fresh source port; a connected socket is closed with SO_LINGER 0 (a
// reset), so no TIME_WAIT piles up at a thousand connects per second.

// outcome is how one connect attempt ended.
type outcome int

const (
	pending  outcome = iota
	ok               // handshake completed
	refused          // TCP reset or ICMP port unreachable (kproxy's reject)
	timedOut         // nothing came back within the attempt's bound
	failed           // anything else (host unreachable, ...)
)

func (o outcome) String() string {
	return [...]string{"pending", "ok", "refused", "timeout", "failed"}[o]
}

// attempt is one connect.
type attempt struct {
	dst     netip.AddrPort
	tag     int // caller's label (e.g. target index)
	start   time.Time
	end     time.Time
	outcome outcome
	fd      int
}

func (a *attempt) elapsed() time.Duration { return a.end.Sub(a.start) }

// connLoop is the event loop. It must be created and used on one thread
// inside the namespace the sockets should belong to.
type connLoop struct {
	epfd     int
	timeout  time.Duration // bound of one attempt
	inflight map[int]*attempt
	queue    []*attempt // in start order, for expiry
	events   []syscall.EpollEvent
	maxOpen  int // bound on sockets in flight
}

func newConnLoop(timeout time.Duration) (*connLoop, error) {
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("bench: epoll: %w", err)
	}
	return &connLoop{epfd: epfd, timeout: timeout, inflight: map[int]*attempt{},
		events: make([]syscall.EpollEvent, 256), maxOpen: 4000}, nil
}

// close ends every attempt in flight and the loop.
func (l *connLoop) close() {
	for fd := range l.inflight {
		syscall.Close(fd)
	}
	l.inflight, l.queue = map[int]*attempt{}, nil
	syscall.Close(l.epfd)
}

// inFlight is the number of attempts not finished yet.
func (l *connLoop) inFlight() int { return len(l.inflight) }

// fire starts a connect to dst. An attempt that fails at once (or that the
// in-flight bound refuses) is returned finished.
func (l *connLoop) fire(dst netip.AddrPort, tag int) *attempt {
	a := &attempt{dst: dst, tag: tag, start: time.Now(), fd: -1}
	if len(l.inflight) >= l.maxOpen {
		a.end, a.outcome = a.start, failed
		return a
	}
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		a.end, a.outcome = time.Now(), failed
		return a
	}
	sa := &syscall.SockaddrInet4{Port: int(dst.Port()), Addr: dst.Addr().As4()}
	err = syscall.Connect(fd, sa)
	if err != nil && !errors.Is(err, syscall.EINPROGRESS) {
		syscall.Close(fd)
		a.end, a.outcome = time.Now(), classify(err)
		return a
	}
	ev := syscall.EpollEvent{Events: syscall.EPOLLOUT | syscall.EPOLLERR | syscall.EPOLLHUP, Fd: int32(fd)}
	if err := syscall.EpollCtl(l.epfd, syscall.EPOLL_CTL_ADD, fd, &ev); err != nil {
		syscall.Close(fd)
		a.end, a.outcome = time.Now(), failed
		return a
	}
	a.fd = fd
	l.inflight[fd] = a
	l.queue = append(l.queue, a)
	return a
}

// poll waits at most wait for attempts to finish and calls done for each
// one that finished (completed, refused or expired).
func (l *connLoop) poll(wait time.Duration, done func(*attempt)) {
	wait = max(wait, 0) // a negative epoll timeout blocks forever
	if len(l.inflight) > 0 {
		if next := time.Until(l.queue[0].start.Add(l.timeout)); next < wait {
			wait = max(next, 0)
		}
	}
	ms := int((wait + time.Millisecond - 1) / time.Millisecond)
	n, err := syscall.EpollWait(l.epfd, l.events, ms)
	if err != nil && !errors.Is(err, syscall.EINTR) {
		n = 0
	}
	now := time.Now()
	for _, ev := range l.events[:max(n, 0)] {
		a := l.inflight[int(ev.Fd)]
		if a == nil {
			continue
		}
		soErr, err := syscall.GetsockoptInt(a.fd, syscall.SOL_SOCKET, syscall.SO_ERROR)
		switch {
		case err != nil:
			a.outcome = failed
		case soErr == 0:
			a.outcome = ok
		default:
			a.outcome = classify(syscall.Errno(soErr))
		}
		l.finish(a, now)
		done(a)
	}
	l.expire(now, done)
}

// expire ends the attempts older than the loop's timeout.
func (l *connLoop) expire(now time.Time, done func(*attempt)) {
	i := 0
	for ; i < len(l.queue); i++ {
		a := l.queue[i]
		if a.fd < 0 { // already finished
			continue
		}
		if now.Sub(a.start) < l.timeout {
			break
		}
		a.outcome = timedOut
		l.finish(a, now)
		done(a)
	}
	l.queue = l.queue[i:]
	// drop finished attempts from the head so the queue stays short
	for len(l.queue) > 0 && l.queue[0].fd < 0 {
		l.queue = l.queue[1:]
	}
}

// finish closes the socket; a connected one with a reset (SO_LINGER 0).
func (l *connLoop) finish(a *attempt, now time.Time) {
	a.end = now
	if a.outcome == ok {
		_ = syscall.SetsockoptLinger(a.fd, syscall.SOL_SOCKET, syscall.SO_LINGER, &syscall.Linger{Onoff: 1, Linger: 0})
	}
	_ = syscall.EpollCtl(l.epfd, syscall.EPOLL_CTL_DEL, a.fd, nil)
	syscall.Close(a.fd)
	delete(l.inflight, a.fd)
	a.fd = -1
}

func classify(err error) outcome {
	switch {
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET):
		return refused
	case errors.Is(err, syscall.ETIMEDOUT):
		return timedOut
	default:
		return failed
	}
}

// drain waits (at most bound) until no attempt is in flight.
func (l *connLoop) drain(bound time.Duration, done func(*attempt)) {
	deadline := time.Now().Add(bound)
	for l.inFlight() > 0 && time.Now().Before(deadline) {
		l.poll(time.Until(deadline), done)
	}
}
