package conntrack

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/model"
)

// Table is the kernel's conntrack table.
type Table interface {
	// DeleteFlows deletes the entries of family for which stale returns true,
	// walking the table once, and returns how many it deleted. An entry that
	// vanished meanwhile counts as deleted. A partial walk (the kernel
	// interrupted the dump) returns an error wrapping ErrPartial along with the
	// entries it did delete.
	DeleteFlows(family model.Family, stale func(Flow) bool) (int, error)
}

// ErrPartial says the kernel interrupted the table dump, so some entries may
// not have been looked at.
var ErrPartial = errors.New("conntrack dump interrupted")

// maxAttempts bounds the walks of one DeleteFlows call when dumps are
// interrupted.
const maxAttempts = 3

// NetlinkTable is the Table of the current network namespace, over netlink.
type NetlinkTable struct {
	mu     sync.Mutex // one walk at a time on the one socket
	handle *netlink.Handle
	owned  bool // handle was opened here (and is replaced after a failure)
}

// NewNetlinkTable returns a Table over netlink in the current network
// namespace. It opens its socket when first used, and keeps it: closing a
// netfilter netlink socket right after a ruleset commit makes the kernel
// wait for an RCU grace period (~12-15 ms here), which a socket per call
// would add to every sync.
func NewNetlinkTable() *NetlinkTable { return &NetlinkTable{} }

// NewNetlinkTableWith returns a Table using h, e.g. a handle opened in
// another network namespace with netlink.NewHandleAt.
func NewNetlinkTableWith(h *netlink.Handle) *NetlinkTable { return &NetlinkTable{handle: h} }

// DeleteFlows implements Table.
func (t *NetlinkTable) DeleteFlows(family model.Family, stale func(Flow) bool) (int, error) {
	fam := netlink.InetFamily(unix.AF_INET)
	if family == model.IPv6 {
		fam = unix.AF_INET6
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.handle == nil {
		h, err := netlink.NewHandle(unix.NETLINK_NETFILTER)
		if err != nil {
			return 0, fmt.Errorf("opening a conntrack netlink socket: %w", err)
		}
		// A kept socket has no default timeout: a lost reply must not
		// block every later sync.
		if err := h.SetSocketTimeout(socketTimeout); err != nil {
			h.Close()
			return 0, fmt.Errorf("setting the conntrack netlink socket's timeout: %w", err)
		}
		t.handle, t.owned = h, true
	}
	total := 0
	var err error
	for range maxAttempts {
		var n uint
		n, err = t.handle.ConntrackDeleteFilters(netlink.ConntrackTable, fam, flowFilter(stale))
		total += int(n)
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	switch {
	case errors.Is(err, netlink.ErrDumpInterrupted):
		return total, fmt.Errorf("%w: %w", ErrPartial, err)
	case err != nil:
		// The socket may hold the rest of a dump: the next call opens
		// another.
		if t.owned {
			t.handle.Close()
			t.handle = nil
		}
		return total, fmt.Errorf("deleting %s conntrack entries: %w", family, err)
	}
	return total, nil
}

// socketTimeout bounds each read and write on the kept socket.
const socketTimeout = 30 * time.Second

// tcpConntrackSynSent is the kernel's TCP_CONNTRACK_SYN_SENT.
const tcpConntrackSynSent = 1

// flowFilter adapts a stale func to netlink's filter interface.
type flowFilter func(Flow) bool

// MatchConntrackFlow implements netlink.CustomConntrackFilter.
func (f flowFilter) MatchConntrackFlow(c *netlink.ConntrackFlow) bool {
	flow, ok := toFlow(c)
	return ok && f(flow)
}

// toFlow converts a netlink entry; ok is false for protocols never cleaned.
func toFlow(c *netlink.ConntrackFlow) (Flow, bool) {
	var proto model.Protocol
	switch c.Forward.Protocol {
	case unix.IPPROTO_UDP:
		proto = model.UDP
	case unix.IPPROTO_SCTP:
		proto = model.SCTP
	case unix.IPPROTO_TCP:
		proto = model.TCP
	default:
		return Flow{}, false
	}
	f := Flow{
		Protocol: proto,
		OrigDst:  addrPort(c.Forward.DstIP, c.Forward.DstPort),
		ReplySrc: addrPort(c.Reverse.SrcIP, c.Reverse.SrcPort),
	}
	if info, ok := c.ProtoInfo.(*netlink.ProtoInfoTCP); ok {
		f.SynSent = info.State == tcpConntrackSynSent
	}
	return f, true
}

func addrPort(ip net.IP, port uint16) netip.AddrPort {
	a, _ := netip.AddrFromSlice(ip)
	return netip.AddrPortFrom(a.Unmap(), port)
}

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
			plan = NewPartialPlan(prevFam, nextFam, changed)
		} else {
			plan = NewPlan(prevFam, nextFam, full)
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
	res.Deleted, res.Err = c.table.DeleteFlows(fam, plan.Stale)
	res.Duration = c.now().Sub(start)
	switch {
	case errors.Is(res.Err, ErrPartial):
		logger.V(2).Info("Conntrack table walk was interrupted, cleaned what was seen", "ipFamily", fam, "deleted", res.Deleted, "err", res.Err)
	case res.Err != nil:
		logger.Error(res.Err, "Failed to delete stale conntrack entries", "ipFamily", fam, "deleted", res.Deleted)
	default:
		logger.V(4).Info("Deleted stale conntrack entries", "ipFamily", fam, "deleted", res.Deleted, "took", res.Duration)
	}
	return res
}
