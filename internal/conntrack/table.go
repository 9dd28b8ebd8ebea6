package conntrack

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/nfnl"
)

// Table is the kernel's conntrack table.
type Table interface {
	// DeleteFlows deletes the entries of family within scope for which
	// stale returns true, walking the table once, and returns how many it
	// deleted. An entry that vanished meanwhile counts as deleted. A
	// partial walk (the kernel interrupted the dump) returns an error
	// wrapping ErrPartial along with the entries it did delete.
	DeleteFlows(family model.Family, scope Scope, stale func(Flow) bool) (int, error)
	// Local returns a test for this node's own addresses of family (nil
	// when the table cannot tell). It may be called from within a
	// DeleteFlows walk's stale function.
	Local(family model.Family) (func(netip.Addr) bool, error)
}

// ErrPartial says the kernel interrupted the table dump, so some entries may
// not have been looked at.
var ErrPartial = errors.New("conntrack dump interrupted")

// maxAttempts bounds the walks of one DeleteFlows call when dumps are
// interrupted.
const maxAttempts = 3

// NetlinkTable is the Table of the current network namespace, over netlink.
// It reads the dump as it arrives and keeps only the stale entries: the
// table of a busy node holds hundreds of thousands of entries.
type NetlinkTable struct {
	mu   sync.Mutex // one walk at a time on the one socket
	fd   int        // -1 until opened
	open func() (int, error)
	// unfiltered is set once the kernel refused a filtered dump: every
	// later walk reads the whole family.
	unfiltered bool
	rb         []byte // the dumps' receive buffer, kept
}

// NewNetlinkTable returns a Table over netlink in the current network
// namespace. It opens its socket when first used, and keeps it: closing a
// netfilter netlink socket right after a ruleset commit makes the kernel
// wait for an RCU grace period (~12-15 ms here), which a socket per call
// would add to every sync.
func NewNetlinkTable() *NetlinkTable {
	return &NetlinkTable{fd: -1, open: func() (int, error) { return nfnl.OpenSocket(0) }}
}

// Local implements Table: the addresses of the interfaces of the calling
// thread's namespace (the daemon's, where the table's socket is too), and
// every loopback address.
func (t *NetlinkTable) Local(family model.Family) (func(netip.Addr) bool, error) {
	nlFam := netlink.FAMILY_V4
	if family == model.IPv6 {
		nlFam = netlink.FAMILY_V6
	}
	addrs, err := netlink.AddrList(nil, nlFam)
	for try := 1; errors.Is(err, netlink.ErrDumpInterrupted) && try < maxAttempts; try++ {
		addrs, err = netlink.AddrList(nil, nlFam) // an address changed meanwhile
	}
	if err != nil {
		return nil, fmt.Errorf("listing the node's %s addresses: %w", family, err)
	}
	local := make(map[netip.Addr]bool, len(addrs))
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			local[ip.Unmap()] = true
		}
	}
	return func(a netip.Addr) bool { return a.IsLoopback() || local[a.Unmap()] }, nil
}

// DeleteFlows implements Table.
func (t *NetlinkTable) DeleteFlows(family model.Family, scope Scope, stale func(Flow) bool) (int, error) {
	fam := byte(unix.AF_INET)
	if family == model.IPv6 {
		fam = unix.AF_INET6
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.fd < 0 {
		fd, err := t.open()
		if err != nil {
			return 0, fmt.Errorf("opening a conntrack netlink socket: %w", err)
		}
		t.fd = fd
	}
	total := 0
	var err error
	for range maxAttempts {
		var n int
		n, err = t.walk(fam, scope, stale)
		total += n
		if !errors.Is(err, nfnl.ErrInterrupted) {
			break
		}
	}
	switch {
	case errors.Is(err, nfnl.ErrInterrupted):
		return total, fmt.Errorf("%w: %w", ErrPartial, err)
	case err != nil:
		// The socket may hold the rest of a dump: the next call opens
		// another.
		unix.Close(t.fd)
		t.fd = -1
		return total, fmt.Errorf("deleting %s conntrack entries: %w", family, err)
	}
	return total, nil
}

// walk dumps the table once, then deletes the stale entries it saw. An
// interrupted dump still deletes them and returns nfnl.ErrInterrupted.
func (t *NetlinkTable) walk(fam byte, scope Scope, stale func(Flow) bool) (int, error) {
	var found []entry
	collect := func(attrs []byte) error {
		if e := parseEntry(attrs); e.ok && stale(e.flow) {
			found = append(found, e.kept())
		}
		return nil
	}
	filtered := !t.unfiltered && scope != Scope{}
	if t.rb == nil {
		t.rb = make([]byte, nfnl.MinDumpBufSize)
	}
	clean, err := nfnl.DumpOn(t.fd, dumpRequest(fam, scope, filtered), t.rb, collect)
	var errno syscall.Errno
	if filtered && clean && errors.As(err, &errno) {
		// A kernel that knows the filter attributes but not these
		// values: read everything from now on.
		t.unfiltered = true
		found = found[:0]
		_, err = nfnl.DumpOn(t.fd, dumpRequest(fam, scope, false), t.rb, collect)
	}
	if err != nil && !errors.Is(err, nfnl.ErrInterrupted) {
		return 0, err
	}
	n, derr := t.delete(fam, found)
	if derr != nil {
		return n, derr
	}
	return n, err
}

// deleteChunk bounds the bytes of delete requests sent at once (the
// socket's send buffer is 256 KiB).
const deleteChunk = 64 << 10

// delete deletes entries, a chunk of requests per sendmsg. An entry already
// gone (ENOENT: expired, or deleted by someone else) counts as deleted.
func (t *NetlinkTable) delete(fam byte, entries []entry) (int, error) {
	deleted, failed := 0, 0
	var firstErr syscall.Errno
	var buf []byte
	for len(entries) > 0 {
		buf = buf[:0]
		sent := 0
		for sent < len(entries) && len(buf) < deleteChunk {
			buf = appendDelete(buf, fam, entries[sent])
			sent++
		}
		entries = entries[sent:]
		if err := unix.Sendto(t.fd, buf, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
			return deleted, fmt.Errorf("sending conntrack deletes: %w", err)
		}
		err := nfnl.ReadAcks(t.fd, sent, func(errno syscall.Errno) {
			switch errno {
			case 0, unix.ENOENT:
				deleted++
			default:
				failed++
				if firstErr == 0 {
					firstErr = errno
				}
			}
		})
		if err != nil {
			return deleted, err
		}
	}
	if failed > 0 {
		return deleted, fmt.Errorf("%d conntrack entries not deleted: %w", failed, firstErr)
	}
	return deleted, nil
}

// tcpConntrackSynSent is the kernel's TCP_CONNTRACK_SYN_SENT.
const tcpConntrackSynSent = 1

// Result is the outcome of one family's cleanup.
type Result struct {
	Family model.Family
	// Skipped is true when nothing could be stale, so the table was not read.
	Skipped  bool
	Deleted  int
	Duration time.Duration
	// Err is nil, or the failure (wrapping ErrPartial for a partial walk).
	Err error
}

// Merge adds the results of a walk before the commit (CleanSYNs) to those
// of Clean after it, family by family: one sync's cleanup, as the metrics
// count it. A family is Skipped when both skipped it.
func Merge(before, after []Result) []Result {
	out := slices.Clone(after)
	for _, b := range before {
		i := slices.IndexFunc(out, func(r Result) bool { return r.Family == b.Family })
		if i < 0 {
			out = append(out, b)
			continue
		}
		r := &out[i]
		r.Skipped = r.Skipped && b.Skipped
		r.Deleted += b.Deleted
		r.Duration += b.Duration
		r.Err = errors.Join(b.Err, r.Err)
	}
	return out
}

// Cleaner deletes stale conntrack entries after each successful sync.
type Cleaner struct {
	table Table
	now   func() time.Time
	// compared counts the ports its plans compared (for tests).
	compared int
}

// NewCleaner returns a Cleaner over table.
func NewCleaner(table Table) *Cleaner { return &Cleaner{table: table, now: time.Now} }

// Clean deletes, for each family of next, the flows that the sync from prev
// (nil for the first sync) to next left stale; full cleans every frontend
// instead of only the changed ones. It logs failures and returns one Result
// per family for metrics; a failure is not fatal (the next full sync cleans
// again).
func (c *Cleaner) Clean(ctx context.Context, prev, next *model.Snapshot, full bool) []Result {
	return c.clean(ctx, prev, next, full, false)
}

// CleanSYNs is Clean's TCP part, for before the sync from prev to next is
// committed: it deletes the un-DNATed SYNs to the TCP frontends that the
// sync makes reachable, and nothing else. Clean after the commit deletes
// them too, but a SYN retransmitted between the commit and that walk still
// meets such an entry and bypasses the nat table; with the entry gone
// before the commit, it makes a new one that the rules see. Without work to
// do (no TCP frontend becomes reachable) the table is not read.
func (c *Cleaner) CleanSYNs(ctx context.Context, prev, next *model.Snapshot, full bool) []Result {
	return c.clean(ctx, prev, next, full, true)
}

func (c *Cleaner) clean(ctx context.Context, prev, next *model.Snapshot, full, synsOnly bool) []Result {
	var results []Result
	changed, partial := next.ChangedSince(prev)
	partial = partial && !full
	for _, fam := range []model.Family{model.IPv4, model.IPv6} {
		nextFam := next.Family(fam)
		if nextFam == nil {
			continue
		}
		var prevFam *model.FamilySnapshot
		if prev != nil {
			prevFam = prev.Family(fam)
		}
		var plan *Plan
		if partial {
			plan = newPartialPlan(prevFam, nextFam, changed, synsOnly)
		} else {
			plan = newPlan(prevFam, nextFam, full, synsOnly)
		}
		c.compared += plan.compared
		results = append(results, c.cleanFamily(ctx, plan, fam))
	}
	return results
}

func (c *Cleaner) cleanFamily(ctx context.Context, plan *Plan, fam model.Family) Result {
	logger := klog.FromContext(ctx)
	res := Result{Family: fam}
	if plan.Empty() {
		res.Skipped = true
		return res
	}
	start := c.now()
	var errs []error
	if plan.protos[model.TCP] {
		// Unanswered TCP flows are judged by NodePort only when they went
		// to the node itself (an outbound SYN to another host's port of
		// the same number is not this node's). The addresses are read when
		// such a flow first turns up, which is rare.
		local := sync.OnceValue(func() func(netip.Addr) bool {
			local, err := c.table.Local(fam)
			if err != nil {
				logger.V(2).Info("Cannot tell the node's addresses; unanswered TCP flows to any address with a NodePort's number are cleaned", "ipFamily", fam, "err", err)
			}
			return local
		})
		plan.local = func(a netip.Addr) bool { is := local(); return is == nil || is(a) }
	}
	for _, scope := range plan.Scopes() {
		n, err := c.table.DeleteFlows(fam, scope, plan.Stale)
		res.Deleted += n
		if err != nil {
			errs = append(errs, err)
		}
	}
	res.Err = errors.Join(errs...)
	res.Duration = c.now().Sub(start)
	switch {
	case errors.Is(res.Err, ErrPartial):
		logger.V(2).Info("Conntrack table walk was interrupted, cleaned what was seen", "ipFamily", fam, "synsOnly", plan.synsOnly, "deleted", res.Deleted, "err", res.Err)
	case res.Err != nil:
		logger.Error(res.Err, "Failed to delete stale conntrack entries", "ipFamily", fam, "synsOnly", plan.synsOnly, "deleted", res.Deleted)
	default:
		logger.V(4).Info("Deleted stale conntrack entries", "ipFamily", fam, "synsOnly", plan.synsOnly, "deleted", res.Deleted, "took", res.Duration)
	}
	return res
}
