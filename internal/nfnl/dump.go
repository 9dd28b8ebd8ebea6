package nfnl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// ChainNames lists the chains of table (family fam) in the calling
// thread's network namespace, in the kernel's order, without their rules:
// at 10k Services an iptables nat table has ~110k chains and 330k rules,
// and `iptables-save` of it takes seconds. A missing table has no chains.
// An interrupted dump is taken again (DumpWhole).
func ChainNames(fam byte, table string) ([]string, error) {
	var names []string
	seen := map[string]bool{}
	err := DumpWhole(fam, unix.NFT_MSG_GETCHAIN, func(b *Batch) {
		b.AttrStr(unix.NFTA_CHAIN_TABLE, table)
	}, func(attrs []byte) error {
		var tbl, name string
		EachAttr(attrs, func(typ uint16, data []byte) {
			switch typ {
			case unix.NFTA_CHAIN_TABLE:
				tbl = cString(data)
			case unix.NFTA_CHAIN_NAME:
				name = cString(data)
			}
		})
		if tbl == table && name != "" && !seen[name] {
			seen[name] = true
			names = append(names, name)
		}
		return nil
	}, func() { names, seen = names[:0], map[string]bool{} })
	switch {
	case errors.Is(err, unix.ENOENT):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("listing the chains of %s: %w", table, err)
	}
	return names, nil
}

// DumpWhole is Dump taken again, after reset, while the kernel marks it
// interrupted: listings of chains, sets and rules number the objects of
// every table of the family, so any other writer's commit meanwhile can
// make a dump miss or repeat objects. After a few attempts it returns
// ErrInterrupted.
func DumpWhole(fam byte, typ uint16, attrs func(b *Batch), fn func(attrs []byte) error, reset func()) error {
	var err error
	for attempt := range 4 {
		if attempt > 0 {
			reset()
		}
		if err = Dump(fam, typ, attrs, fn); !errors.Is(err, ErrInterrupted) {
			return err
		}
	}
	return err
}

// ErrInterrupted reports a dump during which the ruleset changed (any
// commit in the namespace, of any table): the kernel resumes dumps by
// position, so the dump may have missed or repeated objects.
var ErrInterrupted = errors.New("the dump was interrupted by a concurrent change")

// Dump sends one dump request of type typ (unix.NFT_MSG_GET*, attributes
// written by attrs) in the calling thread's network namespace and calls fn
// with the attributes of every reply, until the dump ends or fn fails. An
// error reply ends it with that errno (syscall.Errno: ENOENT for a missing
// table); a dump that was interrupted returns ErrInterrupted after it ran
// to its end.
func Dump(fam byte, typ uint16, attrs func(b *Batch), fn func(attrs []byte) error) error {
	return withSocket(func(fd int) (bool, error) { return dump(fd, fam, typ, attrs, fn) })
}

// dump runs one dump on fd; clean tells whether it was read to its end.
func dump(fd int, fam byte, typ uint16, attrs func(b *Batch), fn func(attrs []byte) error) (clean bool, err error) {
	return DumpOn(fd, Message(typ, unix.NLM_F_DUMP, fam, attrs), nil, fn)
}

// DumpBufSize is the receive buffer Dump allocates for one dump, far more
// than a read returns; it is garbage after the dump.
const DumpBufSize = 1 << 20

// MinDumpBufSize is the smallest buffer DumpOn reads into, for callers that
// keep theirs. The kernel fills one read of a dump with at most ~32 KiB
// (netlink_recvmsg caps the dump's allocation at SKB_WITH_OVERHEAD(32768))
// unless a single message needs more; a read that would not fit is an
// error, never a silent truncation (reads ask for the length with MSG_TRUNC).
const MinDumpBufSize = 64 << 10

// DumpOn sends the dump request req (built with SubsysMessage and
// unix.NLM_F_DUMP) on fd, a socket the caller keeps, and calls fn with the
// attributes of every reply, as Dump does; they alias rb (at least
// MinDumpBufSize bytes, else DumpBufSize bytes are allocated), which a
// caller that dumps often keeps. clean tells whether the dump was read to
// its end (else fd may hold the rest of it).
func DumpOn(fd int, req, rb []byte, fn func(attrs []byte) error) (clean bool, err error) {
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return false, fmt.Errorf("sending a netlink dump request: %w", err)
	}
	interrupted := false
	if len(rb) < MinDumpBufSize {
		rb = make([]byte, DumpBufSize)
	}
	for range 1 << 24 {
		n, _, err := unix.Recvfrom(fd, rb, unix.MSG_TRUNC)
		if err != nil {
			return false, fmt.Errorf("reading a netlink dump: %w", err)
		}
		if n > len(rb) {
			return false, fmt.Errorf("reading a netlink dump: a read of %d bytes does not fit the %d-byte buffer", n, len(rb))
		}
		var result error
		ended := false
		done := eachMsg(rb[:n], func(m []byte) bool {
			if binary.NativeEndian.Uint16(m[6:])&unix.NLM_F_DUMP_INTR != 0 {
				interrupted = true
			}
			switch binary.NativeEndian.Uint16(m[4:]) {
			case unix.NLMSG_DONE, unix.NLMSG_ERROR:
				// An error reply, or a dump that failed midway (DONE's
				// payload is then a negative errno, else a length).
				if errno, ok := msgErrno(m); ok && errno != 0 {
					result = errno
				}
				ended = true
				return true
			}
			if len(m) >= nlmsgHdrLen+nfgenHdrLen {
				result = fn(m[nlmsgHdrLen+nfgenHdrLen:])
			}
			return result != nil
		})
		if done {
			if result == nil && interrupted {
				result = ErrInterrupted
			}
			return ended, result
		}
	}
	return false, errors.New("no end of the netlink dump")
}

func cString(b []byte) string {
	for len(b) > 0 && b[len(b)-1] == 0 {
		b = b[:len(b)-1]
	}
	return string(b)
}

// msgErrno is the errno an NLMSG_ERROR (or NLMSG_DONE) message carries:
// 0 for an acknowledgement (or DONE's non-negative length); ok is false
// when the message is too short.
func msgErrno(m []byte) (errno syscall.Errno, ok bool) {
	if len(m) < nlmsgHdrLen+4 {
		return 0, false
	}
	if v := int32(binary.NativeEndian.Uint32(m[nlmsgHdrLen:])); v < 0 {
		return syscall.Errno(-v), true
	}
	return 0, true
}

// EachAttr calls fn for every attribute in b (type without its flags).
func EachAttr(b []byte, fn func(typ uint16, data []byte)) {
	for len(b) >= 4 {
		l := int(binary.NativeEndian.Uint16(b))
		if l < 4 || l > len(b) {
			return
		}
		fn(binary.NativeEndian.Uint16(b[2:])&^(unix.NLA_F_NESTED|unix.NLA_F_NET_BYTEORDER), b[4:l])
		b = b[min((l+3)&^3, len(b)):]
	}
}

// Get sends one request of type typ that is not a dump (attributes
// written by attrs) in the calling thread's network namespace and returns
// the attributes of its reply, or the errno of an error reply
// (syscall.Errno: ENOENT for a missing object).
func Get(fam byte, typ uint16, attrs func(b *Batch)) ([]byte, error) {
	// nf_tables answers GET<object> with NEW<object>, numbered one below.
	return request(Message(typ, 0, fam, attrs), uint16(subsysNFTables<<8|(typ-1)))
}

// subsysCompat is nfnetlink's xtables compatibility subsystem
// (NFNL_SUBSYS_NFT_COMPAT), whose one request asks whether the kernel has
// a match or target at a revision.
const subsysCompat = 11

// CompatSupported reports whether the kernel can run the xtables match
// (target false) or target of that name and revision in a rule of the
// family, as nf_tables' compat expressions do: the kernel loads the
// module if it can. An error reply means no; other failures are errors.
func CompatSupported(fam byte, name string, rev uint32, target bool) (bool, error) {
	const compatGet = 0 // NFNL_MSG_COMPAT_GET, answered with the same type
	b := &Batch{buf: make([]byte, 0, 128), fam: fam, seq: requestSeq}
	start := b.header(subsysCompat<<8|compatGet, unix.NLM_F_REQUEST, fam)
	b.AttrStr(1, name) // NFTA_COMPAT_NAME
	b.AttrBE32(2, rev) // NFTA_COMPAT_REV
	typ := uint32(0)   // NFTA_COMPAT_TYPE: 0 match, 1 target
	if target {
		typ = 1
	}
	b.AttrBE32(3, typ)
	b.Finish(start)
	_, err := request(b.buf, subsysCompat<<8|compatGet)
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return false, nil
	}
	return err == nil, err
}

// Request sends msg (built with SubsysMessage) in the calling thread's
// network namespace and returns the attributes of its reply of type reply,
// or the errno of an error reply (syscall.Errno). A request sent with
// NLM_F_ACK and answered by the acknowledgement alone returns no
// attributes and no error.
func Request(msg []byte, reply uint16) ([]byte, error) { return request(msg, reply) }

// request sends msg and returns the attributes of its reply of type reply,
// or the errno of an error reply.
func request(msg []byte, reply uint16) ([]byte, error) {
	var out []byte
	err := withSocket(func(fd int) (bool, error) {
		if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
			return false, fmt.Errorf("sending a netlink request: %w", err)
		}
		// One object's reply (a chain, the generation) is small: this runs
		// twice around every nftables commit, so no large buffer.
		rb := make([]byte, 16<<10)
		n, _, err := unix.Recvfrom(fd, rb, unix.MSG_TRUNC)
		if err != nil {
			return false, fmt.Errorf("reading a netlink reply: %w", err)
		}
		if n > len(rb) {
			return false, fmt.Errorf("a netlink reply of %d bytes is larger than %d", n, len(rb))
		}
		var result error
		got := eachMsg(rb[:n], func(m []byte) bool {
			if binary.NativeEndian.Uint32(m[8:]) != requestSeq {
				return false
			}
			switch binary.NativeEndian.Uint16(m[4:]) {
			case unix.NLMSG_ERROR:
				switch errno, ok := msgErrno(m); {
				case !ok:
					result = syscall.EIO
				case errno != 0:
					result = errno
				}
			case reply:
				if len(m) < nlmsgHdrLen+nfgenHdrLen {
					return false
				}
				out = append([]byte(nil), m[nlmsgHdrLen+nfgenHdrLen:]...)
			default:
				return false
			}
			return true
		})
		if !got {
			return false, errors.New("no reply to a netlink request (or another one)")
		}
		return true, result
	})
	return out, err
}

// ReadAcks reads from fd the replies to n requests sent with NLM_F_ACK
// (one NLMSG_ERROR each) and calls fn with each one's errno, 0 for success.
func ReadAcks(fd int, n int, fn func(errno syscall.Errno)) error {
	rb := make([]byte, 32<<10)
	for seen := 0; seen < n; {
		got, _, err := unix.Recvfrom(fd, rb, 0)
		if err != nil {
			return fmt.Errorf("reading netlink acknowledgements: %w", err)
		}
		eachMsg(rb[:got], func(m []byte) bool {
			if binary.NativeEndian.Uint16(m[4:]) != unix.NLMSG_ERROR {
				return false
			}
			errno, _ := msgErrno(m)
			fn(errno)
			seen++
			return seen == n
		})
	}
	return nil
}
