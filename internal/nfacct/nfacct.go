// Package nfacct creates, reads and deletes the kernel's named packet
// counters (nfnetlink_acct), which iptables rules count into with
// "-m nfacct --nfacct-name NAME". The counters belong to a network
// namespace: every call acts in the calling thread's.
package nfacct

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/kproxy/kproxy/internal/nfnl"
)

// The counters upstream kube-proxy's iptables mode counts into, and its
// kubeproxy_iptables_*_packets_total metrics read.
const (
	// CTStateInvalidDropped counts the packets the conntrack-INVALID rule
	// drops.
	CTStateInvalidDropped = "ct_state_invalid_dropped_pkts"
	// LocalhostNodePortsAccepted counts the packets accepted on a NodePort
	// of 127.0.0.0/8.
	LocalhostNodePortsAccepted = "localhost_nps_accepted_pkts"
)

// MaxNameLen is the longest counter name the kernel takes (NFACCT_NAME_MAX
// is 32 bytes with the terminating NUL).
const MaxNameLen = 31

// The nfnetlink subsystem and its messages and attributes, as
// linux/netfilter/nfnetlink_acct.h numbers them.
const (
	subsysAcct = 7 // NFNL_SUBSYS_ACCT

	msgNew = 0 // NFNL_MSG_ACCT_NEW
	msgGet = 1 // NFNL_MSG_ACCT_GET
	msgDel = 3 // NFNL_MSG_ACCT_DEL

	attrName    = 1 // NFACCT_NAME
	attrPackets = 2 // NFACCT_PKTS, big-endian u64
)

// ErrInUse is returned by Delete for a counter a rule still counts into.
var ErrInUse = errors.New("nfacct counter is in use")

// ErrNotSupported is returned by Supported when the kernel has no
// nfnetlink_acct.
var ErrNotSupported = errors.New("nfacct is not available")

func message(typ, flags uint16, name string) ([]byte, error) {
	if name == "" || len(name) > MaxNameLen {
		return nil, fmt.Errorf("nfacct counter name %q: want 1-%d bytes", name, MaxNameLen)
	}
	return nfnl.SubsysMessage(subsysAcct, typ, flags, unix.AF_UNSPEC, func(b *nfnl.Batch) {
		b.AttrStr(attrName, name)
	}), nil
}

// Ensure creates the counter unless it exists (an existing one keeps its
// count).
func Ensure(name string) error {
	msg, err := message(msgNew, unix.NLM_F_CREATE|unix.NLM_F_EXCL|unix.NLM_F_ACK, name)
	if err != nil {
		return err
	}
	if _, err := nfnl.Request(msg, 0); err != nil && !errors.Is(err, syscall.EEXIST) {
		return fmt.Errorf("creating nfacct counter %s: %w", name, err)
	}
	return nil
}

// Packets returns the counter's packet count; the error wraps
// syscall.ENOENT when there is no such counter.
func Packets(name string) (uint64, error) {
	msg, err := message(msgGet, 0, name)
	if err != nil {
		return 0, err
	}
	attrs, err := nfnl.Request(msg, subsysAcct<<8|msgNew)
	if err != nil {
		return 0, fmt.Errorf("reading nfacct counter %s: %w", name, err)
	}
	return packetsOf(attrs)
}

// packetsOf finds NFACCT_PKTS in a counter's attributes.
func packetsOf(attrs []byte) (uint64, error) {
	var n uint64
	found := false
	nfnl.EachAttr(attrs, func(typ uint16, data []byte) {
		if typ == attrPackets && len(data) == 8 {
			n, found = binary.BigEndian.Uint64(data), true
		}
	})
	if !found {
		return 0, errors.New("nfacct reply without a packet count")
	}
	return n, nil
}

// Delete removes the counter. A missing one is not an error; one that a
// rule counts into is ErrInUse, and stays.
func Delete(name string) error {
	msg, err := message(msgDel, unix.NLM_F_ACK, name)
	if err != nil {
		return err
	}
	_, err = nfnl.Request(msg, 0)
	switch {
	case err == nil, errors.Is(err, syscall.ENOENT):
		return nil
	case errors.Is(err, syscall.EBUSY):
		return fmt.Errorf("deleting nfacct counter %s: %w", name, ErrInUse)
	}
	return fmt.Errorf("deleting nfacct counter %s: %w", name, err)
}

// Supported reports whether the kernel answers nfacct requests: a read of
// a counter that does not exist must fail with ENOENT (upstream
// kube-proxy probes the same way).
func Supported() error {
	_, err := Packets("kproxy-probe")
	switch {
	case err == nil, errors.Is(err, syscall.ENOENT):
		return nil
	}
	return fmt.Errorf("%w: %w", ErrNotSupported, err)
}
