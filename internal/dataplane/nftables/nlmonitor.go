package nftables

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/kproxy/kproxy/internal/model"
)

// The kernel notifies every change an nftables transaction commits (rule
// added or deleted, chain flushed, set element deleted, ...) to listeners
// of the NFNLGRP_NFTABLES netlink group, each message carrying the netlink
// port of the socket that sent the transaction, then a NEWGEN message.
// monitor listens to that group so that Drifted learns, for the price of a
// non-blocking read, whether anyone else touched kproxy's tables: a flushed
// Service chain or a flushed map shows up as well as a deleted table,
// without listing anything.

// ownPorts remembers the netlink ports of the sockets kproxy's own batches
// were sent from, so that their notifications are not taken for drift.
var ownPorts = &portRing{}

// portRing is a small ring of recently used netlink port ids.
type portRing struct {
	mu    sync.Mutex
	ports [256]uint32
	next  int
}

func (r *portRing) add(port uint32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ports[r.next%len(r.ports)] = port
	r.next++
}

func (r *portRing) has(port uint32) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.ports {
		if p == port && p != 0 {
			return true
		}
	}
	return false
}

// recordOwnPort notes the port of a socket kproxy sends a batch from.
func recordOwnPort(fd int) {
	if sa, err := unix.Getsockname(fd); err == nil {
		if nl, ok := sa.(*unix.SockaddrNetlink); ok {
			ownPorts.add(nl.Pid)
		}
	}
}

// monitorBufBytes is the monitor's receive buffer. A repair of a large
// table by kproxy itself can overflow it; Drifted then falls back to its
// by-name checks (the lost notifications were kproxy's own unless the
// generation says otherwise).
const monitorBufBytes = 8 << 20

// monitor is a non-blocking socket in the NFNLGRP_NFTABLES group of the
// network namespace it was opened in.
type monitor struct {
	fd  int
	buf []byte
}

// monitorHandle owns a monitor's socket; the socket is closed when the
// handle becomes unreachable (the Proxier has no Close).
type monitorHandle struct{ m *monitor }

func openMonitor() (*monitorHandle, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("opening nftables monitor socket: %w", err)
	}
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, monitorBufBytes) != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, monitorBufBytes)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("binding nftables monitor socket: %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_ADD_MEMBERSHIP, unix.NFNLGRP_NFTABLES); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("joining the nftables monitor group: %w", err)
	}
	h := &monitorHandle{m: &monitor{fd: fd, buf: make([]byte, 64<<10)}}
	runtime.AddCleanup(h, func(fd int) { unix.Close(fd) }, fd)
	return h, nil
}

// monitorReport is what a read of the monitor found.
type monitorReport struct {
	// touched holds, per family, the names of kproxy's objects (table,
	// chains, sets) changed by someone else; "" stands for the table.
	touched map[model.Family]map[string]bool
	// lost is set when the kernel dropped notifications (buffer overrun).
	lost bool
}

// read consumes every pending notification and reports the changes to
// table made by others. It never blocks.
func (m *monitor) read(table string) (monitorReport, error) {
	rep := monitorReport{touched: map[model.Family]map[string]bool{}}
	for range 1 << 20 {
		n, _, err := unix.Recvfrom(m.fd, m.buf, 0)
		switch {
		case errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EWOULDBLOCK):
			return rep, nil
		case errors.Is(err, unix.ENOBUFS):
			rep.lost = true
			continue
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return rep, fmt.Errorf("reading nftables notifications: %w", err)
		}
		classifyNotifications(m.buf[:n], table, ownPorts.has, rep.touched)
	}
	return rep, fmt.Errorf("nftables notifications do not stop")
}

// classifyNotifications adds to touched the objects of table that the
// notification messages in b say someone else (a port for which own is
// false) changed.
func classifyNotifications(b []byte, table string, own func(uint32) bool, touched map[model.Family]map[string]bool) {
	for len(b) >= nlmsgHdrLen {
		l := int(binary.NativeEndian.Uint32(b))
		if l < nlmsgHdrLen || l > len(b) {
			return
		}
		msg := b[:l]
		b = b[min((l+3)&^3, len(b)):]
		typ := binary.NativeEndian.Uint16(msg[4:])
		if typ>>8 != nfnlSubsysNFTables || len(msg) < nlmsgHdrLen+nfgenHdrLen || own(binary.NativeEndian.Uint32(msg[12:])) {
			continue
		}
		fam, ok := familyOf(msg[nlmsgHdrLen])
		if !ok {
			continue
		}
		if name, ok := touchedObject(typ&0xff, msg[nlmsgHdrLen+nfgenHdrLen:], table); ok {
			if touched[fam] == nil {
				touched[fam] = map[string]bool{}
			}
			touched[fam][name] = true
		}
	}
}

func familyOf(nfproto byte) (model.Family, bool) {
	switch nfproto {
	case unix.NFPROTO_IPV4:
		return model.IPv4, true
	case unix.NFPROTO_IPV6:
		return model.IPv6, true
	}
	return 0, false
}

// touchedObject returns the object of table a notification is about:
// "" for the table itself, else a chain or set name. Elements of affinity
// sets (filled and expired by the packet path) do not count.
func touchedObject(msgType uint16, attrs []byte, table string) (string, bool) {
	// Attribute 1 is the table name in every object message.
	if string(attr(attrs, 1)) != table+"\x00" {
		return "", false
	}
	name := func(typ uint16) string { return strings.TrimRight(string(attr(attrs, typ)), "\x00") }
	switch msgType {
	case unix.NFT_MSG_NEWTABLE, unix.NFT_MSG_DELTABLE:
		return "", true
	case unix.NFT_MSG_NEWCHAIN, unix.NFT_MSG_DELCHAIN:
		return name(unix.NFTA_CHAIN_NAME), true
	case unix.NFT_MSG_NEWRULE, unix.NFT_MSG_DELRULE:
		return name(unix.NFTA_RULE_CHAIN), true
	case unix.NFT_MSG_NEWSET, unix.NFT_MSG_DELSET:
		return name(unix.NFTA_SET_NAME), true
	case unix.NFT_MSG_NEWSETELEM, unix.NFT_MSG_DELSETELEM:
		set := name(unix.NFTA_SET_ELEM_LIST_SET)
		// The affinity set, and the per-endpoint sets of older versions.
		return set, !isDynamicSet(set) && !strings.HasPrefix(set, "aff-")
	case unix.NFT_MSG_NEWGEN:
		return "", false
	}
	return "", true // objects kproxy does not make (flowtables, stateful objects)
}
