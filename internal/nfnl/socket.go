package nfnl

import (
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

// Sockets are kept open and reused, a few per network namespace. When a
// netfilter netlink socket closes, nf_tables waits, holding its commit
// lock, for the cleanup of the last committed transaction, which waits
// for an RCU grace period (~12-15 ms in this VM). A sync that opened and
// closed sockets around its commit (a generation query before and after,
// the batch's own socket) returned after 12-16 ms whatever the table's
// size, ~1 ms of it the commit; closing in the background only moved the
// wait to the next commit.

// maxIdlePerNS bounds the idle sockets kept for one namespace (two
// writers at once, plus queries).
const maxIdlePerNS = 4

type nsID struct{ dev, ino uint64 }

var idle = struct {
	sync.Mutex
	fds map[nsID][]int
}{fds: map[nsID][]int{}}

// currentNS identifies the calling thread's network namespace. Without
// /proc (never seen on a node) every caller shares one pool, which is right
// for a daemon that stays in its namespace.
func currentNS() nsID {
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err == nil {
		return nsID{st.Dev, st.Ino}
	}
	// Kernels before 3.17 have no thread-self.
	if err := unix.Stat(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()), &st); err == nil {
		return nsID{st.Dev, st.Ino}
	}
	return nsID{}
}

// WithSocket runs fn with a netfilter netlink socket of the calling
// thread's network namespace (the caller keeps its goroutine on one
// thread when that matters), idle and with nothing left to read. The
// socket is kept for later calls when fn succeeds, closed otherwise (it
// may hold unread replies).
func WithSocket(fn func(fd int) error) error {
	return withSocket(func(fd int) (bool, error) {
		err := fn(fd)
		return err == nil, err
	})
}

// withSocket is WithSocket where fn tells whether the socket is left clean
// (an error reply that ended a dump leaves nothing to read).
func withSocket(fn func(fd int) (clean bool, err error)) error {
	ns := currentNS()
	fd := -1
	idle.Lock()
	if free := idle.fds[ns]; len(free) > 0 {
		fd = free[len(free)-1]
		idle.fds[ns] = free[:len(free)-1]
	}
	idle.Unlock()
	if fd >= 0 && !drain(fd) {
		closeSocket(fd)
		fd = -1
	}
	if fd < 0 {
		var err error
		if fd, err = OpenSocket(0); err != nil {
			return err
		}
	}
	clean, err := fn(fd)
	if !clean {
		closeSocket(fd)
		return err
	}
	idle.Lock()
	defer idle.Unlock()
	if len(idle.fds[ns]) >= maxIdlePerNS {
		closeSocket(fd)
	} else {
		idle.fds[ns] = append(idle.fds[ns], fd)
	}
	return err
}

// CloseIdle closes every kept socket. A socket keeps its namespace alive:
// tests call this before deleting the namespaces they made.
func CloseIdle() {
	idle.Lock()
	defer idle.Unlock()
	for ns, fds := range idle.fds {
		for _, fd := range fds {
			closeSocket(fd)
		}
		delete(idle.fds, ns)
	}
}

// IdleSockets is how many sockets are kept, in every namespace.
func IdleSockets() int {
	idle.Lock()
	defer idle.Unlock()
	n := 0
	for _, fds := range idle.fds {
		n += len(fds)
	}
	return n
}

// closeSocket closes fd in the background (see above: the close may wait
// for a grace period).
func closeSocket(fd int) { go unix.Close(fd) }

// drain discards anything queued on fd; false when fd is not known to be
// empty afterwards.
func drain(fd int) bool {
	buf := make([]byte, 8192)
	for range 1 << 16 {
		_, _, err := unix.Recvfrom(fd, buf, unix.MSG_DONTWAIT)
		switch {
		case err == nil, err == unix.ENOBUFS, err == unix.EINTR:
			continue // an overrun is reported first; data may follow
		case err == unix.EAGAIN:
			return true
		default:
			return false
		}
	}
	return false
}

// setSendBuffer lets fd take a batch of size bytes in one message (the
// kernel takes a batch only whole).
func setSendBuffer(fd, size int) error {
	v := max(size+64<<10, 256<<10)
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, v); err != nil {
		return fmt.Errorf("sizing netlink send buffer to %d bytes: %w", v, err)
	}
	return nil
}
