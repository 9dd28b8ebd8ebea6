package conntrack

import (
	"encoding/binary"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/nfnl"
)

// ctnetlink's message types and attributes (linux/netfilter/nfnetlink_conntrack.h).
const (
	msgCTGet    = 1 // IPCTNL_MSG_CT_GET
	msgCTDelete = 2 // IPCTNL_MSG_CT_DELETE

	ctaTupleOrig  = 1  // CTA_TUPLE_ORIG
	ctaTupleReply = 2  // CTA_TUPLE_REPLY
	ctaStatus     = 3  // CTA_STATUS
	ctaProtoinfo  = 4  // CTA_PROTOINFO
	ctaID         = 12 // CTA_ID
	ctaZone       = 18 // CTA_ZONE
	ctaFilter     = 25 // CTA_FILTER (Linux 5.8)
	ctaStatusMask = 26 // CTA_STATUS_MASK (Linux 5.15)

	ctaTupleIP    = 1 // CTA_TUPLE_IP
	ctaTupleProto = 2 // CTA_TUPLE_PROTO

	ctaIPv4Src = 1 // CTA_IP_V4_SRC
	ctaIPv4Dst = 2 // CTA_IP_V4_DST
	ctaIPv6Src = 3 // CTA_IP_V6_SRC
	ctaIPv6Dst = 4 // CTA_IP_V6_DST

	ctaProtoNum     = 1 // CTA_PROTO_NUM
	ctaProtoSrcPort = 2 // CTA_PROTO_SRC_PORT
	ctaProtoDstPort = 3 // CTA_PROTO_DST_PORT

	ctaProtoinfoTCP      = 1 // CTA_PROTOINFO_TCP
	ctaProtoinfoTCPState = 1 // CTA_PROTOINFO_TCP_STATE

	ctaFilterOrigFlags  = 1      // CTA_FILTER_ORIG_FLAGS
	ctaFilterReplyFlags = 2      // CTA_FILTER_REPLY_FLAGS
	ctaFilterFProtoNum  = 1 << 3 // CTA_FILTER_F_CTA_PROTO_NUM

	ipsSeenReply = 1 << 1 // IPS_SEEN_REPLY
)

// Scope is the part of a family's table that one walk reads: the kernel
// leaves the other entries out of the dump (by protocol since Linux 5.8,
// by reply status since 5.15), so that a node's established TCP
// connections are neither copied to kproxy nor parsed when only UDP
// frontends changed. A kernel without those filters sends every entry and
// the stale func judges them all, with the same result.
type Scope struct {
	// Protocol, when set, is the only protocol read.
	Protocol model.Protocol
	// Unreplied reads only entries that never saw a reply (a TCP SYN
	// still unanswered).
	Unreplied bool
}

// protoNumbers maps the protocols cleaned to their IP protocol numbers.
var protoNumbers = map[model.Protocol]uint8{model.TCP: unix.IPPROTO_TCP, model.UDP: unix.IPPROTO_UDP, model.SCTP: unix.IPPROTO_SCTP}

// dumpRequest is the request of one walk of family fam's table within
// scope; filtered false leaves the scope to the caller's judgement.
func dumpRequest(fam byte, scope Scope, filtered bool) []byte {
	return nfnl.SubsysMessage(unix.NFNL_SUBSYS_CTNETLINK, msgCTGet, unix.NLM_F_DUMP, fam, func(b *nfnl.Batch) {
		if !filtered {
			return
		}
		if num, ok := protoNumbers[scope.Protocol]; ok {
			t := b.Nest(ctaTupleOrig)
			p := b.Nest(ctaTupleProto)
			b.Attr(ctaProtoNum, []byte{num})
			b.End(p)
			b.End(t)
			f := b.Nest(ctaFilter)
			b.Attr(ctaFilterOrigFlags, binary.NativeEndian.AppendUint32(nil, ctaFilterFProtoNum))
			b.Attr(ctaFilterReplyFlags, binary.NativeEndian.AppendUint32(nil, 0))
			b.End(f)
		}
		if scope.Unreplied {
			b.AttrBE32(ctaStatus, 0)
			b.AttrBE32(ctaStatusMask, ipsSeenReply)
		}
	})
}

// entry is what a walk keeps of one conntrack entry: the flow it is judged
// by, and the attributes that name it in a delete request.
type entry struct {
	flow Flow
	ok   bool // a protocol the cleanup knows
	// The delete request's attributes, as the kernel sent them (they
	// alias the receive buffer until copied).
	orig, id, zone []byte
}

// parseEntry reads one conntrack message's attributes.
func parseEntry(attrs []byte) entry {
	var e entry
	var proto uint8
	var replySrc netip.AddrPort
	nfnl.EachAttr(attrs, func(typ uint16, data []byte) {
		switch typ {
		case ctaTupleOrig:
			e.orig = data
			var dst netip.AddrPort
			proto, _, dst = parseTuple(data)
			e.flow.OrigDst = dst
		case ctaTupleReply:
			_, replySrc, _ = parseTuple(data)
		case ctaProtoinfo:
			nfnl.EachAttr(data, func(typ uint16, data []byte) {
				if typ != ctaProtoinfoTCP {
					return
				}
				nfnl.EachAttr(data, func(typ uint16, data []byte) {
					if typ == ctaProtoinfoTCPState && len(data) >= 1 {
						e.flow.SynSent = data[0] == tcpConntrackSynSent
					}
				})
			})
		case ctaID:
			e.id = data
		case ctaZone:
			e.zone = data
		}
	})
	e.flow.ReplySrc = replySrc
	switch proto {
	case unix.IPPROTO_UDP:
		e.flow.Protocol, e.ok = model.UDP, true
	case unix.IPPROTO_SCTP:
		e.flow.Protocol, e.ok = model.SCTP, true
	case unix.IPPROTO_TCP:
		e.flow.Protocol, e.ok = model.TCP, true
	}
	if e.flow.Protocol != model.TCP {
		e.flow.SynSent = false
	}
	e.ok = e.ok && e.orig != nil && e.flow.OrigDst.IsValid() && replySrc.IsValid()
	return e
}

// parseTuple reads a CTA_TUPLE_* attribute: protocol number, source and
// destination.
func parseTuple(b []byte) (proto uint8, src, dst netip.AddrPort) {
	var srcIP, dstIP netip.Addr
	var srcPort, dstPort uint16
	nfnl.EachAttr(b, func(typ uint16, data []byte) {
		switch typ {
		case ctaTupleIP:
			nfnl.EachAttr(data, func(typ uint16, data []byte) {
				a, ok := netip.AddrFromSlice(data)
				if !ok || (typ == ctaIPv4Src || typ == ctaIPv4Dst) != a.Is4() {
					return
				}
				switch typ {
				case ctaIPv4Src, ctaIPv6Src:
					srcIP = a.Unmap()
				case ctaIPv4Dst, ctaIPv6Dst:
					dstIP = a.Unmap()
				}
			})
		case ctaTupleProto:
			nfnl.EachAttr(data, func(typ uint16, data []byte) {
				switch {
				case typ == ctaProtoNum && len(data) >= 1:
					proto = data[0]
				case typ == ctaProtoSrcPort && len(data) >= 2:
					srcPort = binary.BigEndian.Uint16(data)
				case typ == ctaProtoDstPort && len(data) >= 2:
					dstPort = binary.BigEndian.Uint16(data)
				}
			})
		}
	})
	if srcIP.IsValid() {
		src = netip.AddrPortFrom(srcIP, srcPort)
	}
	if dstIP.IsValid() {
		dst = netip.AddrPortFrom(dstIP, dstPort)
	}
	return proto, src, dst
}

// appendDelete appends the request deleting e (whose attributes the caller
// copied out of the receive buffer) to buf. The entry's ID makes the kernel
// refuse (ENOENT) when the tuple now names a newer entry.
func appendDelete(buf []byte, fam byte, e entry) []byte {
	return append(buf, nfnl.SubsysMessage(unix.NFNL_SUBSYS_CTNETLINK, msgCTDelete, unix.NLM_F_ACK, fam, func(b *nfnl.Batch) {
		b.Attr(ctaTupleOrig|unix.NLA_F_NESTED, e.orig)
		if e.id != nil {
			b.Attr(ctaID, e.id)
		}
		if e.zone != nil {
			b.Attr(ctaZone, e.zone)
		}
	})...)
}

// kept returns e with its attributes copied out of the receive buffer.
func (e entry) kept() entry {
	e.orig, e.id, e.zone = clone(e.orig), clone(e.id), clone(e.zone)
	return e
}

func clone(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append([]byte(nil), b...)
}
