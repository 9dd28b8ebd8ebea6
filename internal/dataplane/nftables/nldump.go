package nftables

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/kproxy/kproxy/internal/nfnl"
)

// This file reads the kernel with raw netlink dumps, decoding replies in
// place: a restart at 10k Services reads 130k elements and 11k chain
// names, which google/nftables' generic decoding turns into hundreds of
// megabytes of garbage.

// dump sends one dump request about the table (attrs written by fill) and
// calls fn with the attributes of every reply message. With reset, an
// interrupted dump is taken again (nfnl.DumpWhole: listings number the
// objects of every table of the family, and kubelet's iptables-nft commits
// can shift them); with reset nil (elements of one of kproxy's sets, which
// only kproxy changes) an interrupted dump counts as whole.
func (n *netlinkReader) dump(typ uint16, fill func(b *nlBatch), fn func(attrs []byte) error, reset func()) error {
	attrs := func(b *nfnl.Batch) { fill(&nlBatch{Batch: b, table: n.table.Name}) }
	if reset != nil {
		return nfnl.DumpWhole(n.nfproto(), typ, attrs, fn, reset)
	}
	if err := nfnl.Dump(n.nfproto(), typ, attrs, fn); !errors.Is(err, nfnl.ErrInterrupted) {
		return err
	}
	return nil
}

// eachAttr calls fn for every attribute in b (type without flags).
func eachAttr(b []byte, fn func(typ uint16, data []byte)) { nfnl.EachAttr(b, fn) }

// attr returns the data of the first attribute of type typ in b.
func attr(b []byte, typ uint16) []byte {
	var out []byte
	eachAttr(b, func(t uint16, data []byte) {
		if t == typ && out == nil {
			out = data
		}
	})
	return out
}

// elementMap returns the elements of s as key -> value strings, formatted
// as render formats them (fields joined by " . ", verdicts as "goto X").
func (n *netlinkReader) elementMap(s *set) (map[string]string, error) {
	fields, dataFields := s.fields()
	if slices.Contains(s.Flags, knftables.IntervalFlag) && fields[0] == "numgen" {
		return n.rangeMap(s)
	}
	out := map[string]string{}
	var decodeErr error
	err := n.eachElement(s, func(el []byte) {
		k, v, err := decodeElem(fields, dataFields, s.IsMap, el)
		if err != nil && decodeErr == nil {
			decodeErr = fmt.Errorf("element of %s: %w", s.Name, err)
		}
		out[k] = v
	})
	if err != nil {
		return nil, err
	}
	return out, decodeErr
}

// eachElement dumps the elements of s, calling fn with each one's
// attributes.
func (n *netlinkReader) eachElement(s *set, fn func(el []byte)) error {
	return n.dump(unix.NFT_MSG_GETSETELEM, func(b *nlBatch) {
		b.AttrStr(unix.NFTA_SET_ELEM_LIST_TABLE, b.table)
		b.AttrStr(unix.NFTA_SET_ELEM_LIST_SET, s.Name)
	}, func(attrs []byte) error {
		eachAttr(attr(attrs, unix.NFTA_SET_ELEM_LIST_ELEMENTS), func(_ uint16, el []byte) { fn(el) })
		return nil
	}, nil)
}

func decodeElem(fields, dataFields []string, isMap bool, el []byte) (string, string, error) {
	key, err := decodeKey(fields, attr(attr(el, unix.NFTA_SET_ELEM_KEY), unix.NFTA_DATA_VALUE))
	if err != nil || !isMap {
		return strings.Join(key, " . "), "", err
	}
	data := attr(el, unix.NFTA_SET_ELEM_DATA)
	if dataFields[0] == "verdict" {
		v, err := decodeVerdict(attr(data, unix.NFTA_DATA_VERDICT))
		return strings.Join(key, " . "), v, err
	}
	val, err := decodeKey(dataFields, attr(data, unix.NFTA_DATA_VALUE))
	return strings.Join(key, fieldSep), strings.Join(val, fieldSep), err
}

// rangeMap returns the elements of an endpoint-ranges map as "first-last"
// -> "address . port", formatted as render formats them (rangeList's
// ranges as text).
func (n *netlinkReader) rangeMap(s *set) (map[string]string, error) {
	ranges, err := n.rangeList(s)
	return rangesText(ranges), err
}

// rangesText is ranges as "first-last" -> "address . port".
func rangesText(ranges []kernelRange) map[string]string {
	out := make(map[string]string, len(ranges))
	for _, r := range ranges {
		out[rangeKey(r.lo, r.hi)] = addrPort(r.addr, r.port)
	}
	return out
}

// kernelRange is one range of an endpoint-ranges map as read from the
// kernel: keys lo..hi go to addr and port. A restart at 10k Services × 100
// endpoints reads a million of them; read as text (two edges with a value
// string each, then a map of "lo-hi" keys) they were ~100 MiB of that
// sync's peak RSS, so only verify (rangeMap) makes text of them.
type kernelRange struct {
	lo, hi uint32
	addr   netip.Addr
	port   uint16
}

// rangeList returns the ranges of an endpoint-ranges map sorted by first
// key, each start paired with the edge after it (pairStarts).
func (n *netlinkReader) rangeList(s *set) ([]kernelRange, error) {
	var starts []kernelRange
	var ends []uint32
	var decodeErr error
	fail := func(format string, a ...any) {
		if decodeErr == nil {
			decodeErr = fmt.Errorf("element of %s: "+format, append([]any{s.Name}, a...)...)
		}
	}
	err := n.eachElement(s, func(el []byte) {
		key := attr(attr(el, unix.NFTA_SET_ELEM_KEY), unix.NFTA_DATA_VALUE)
		if len(key) != 4 {
			fail("range key of %d bytes", len(key))
			return
		}
		k := binary.BigEndian.Uint32(key)
		if f := attr(el, unix.NFTA_SET_ELEM_FLAGS); len(f) == 4 && binary.BigEndian.Uint32(f)&unix.NFT_SET_ELEM_INTERVAL_END != 0 {
			ends = append(ends, k)
			return
		}
		data := attr(attr(el, unix.NFTA_SET_ELEM_DATA), unix.NFTA_DATA_VALUE)
		addr, port, ok := decodeTarget(data)
		if !ok {
			fail("endpoint of %d bytes", len(data))
			return
		}
		starts = append(starts, kernelRange{lo: k, addr: addr, port: port})
	})
	if err != nil {
		return nil, err
	}
	return pairStarts(starts, ends), decodeErr
}

// decodeTarget decodes an endpoint-ranges element's data: an address and
// a port, each padded to a multiple of 4 bytes (encodeRange).
func decodeTarget(b []byte) (netip.Addr, uint16, bool) {
	switch len(b) {
	case 8:
		return netip.AddrFrom4([4]byte(b[:4])), binary.BigEndian.Uint16(b[4:6]), true
	case 20:
		return netip.AddrFrom16([16]byte(b[:16])), binary.BigEndian.Uint16(b[16:18]), true
	}
	return netip.Addr{}, 0, false
}

// pairStarts sorts range starts (in place) and gives each its last key:
// the one before the next edge (a start, or an end after it), or the top
// of the key space. The kernel lists them in any order. Of two starts with
// the same first key the later one read is kept: not a range kproxy wrote,
// the diff replaces it.
func pairStarts(starts []kernelRange, ends []uint32) []kernelRange {
	slices.SortStableFunc(starts, func(a, b kernelRange) int { return cmp.Compare(a.lo, b.lo) })
	slices.Sort(ends)
	out := starts[:0]
	j := 0
	for i, r := range starts {
		next := uint64(math.MaxUint32) + 1
		if i+1 < len(starts) {
			if starts[i+1].lo == r.lo {
				continue
			}
			next = uint64(starts[i+1].lo)
		}
		for j < len(ends) && ends[j] <= r.lo {
			j++
		}
		if j < len(ends) {
			next = min(next, uint64(ends[j]))
		}
		r.hi = uint32(next - 1)
		out = append(out, r)
	}
	return out
}
