package conntrack

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/nfnl"
)

const ipsConfirmed = 1 << 3 // IPS_CONFIRMED

// wireTuple encodes a CTA_TUPLE_* attribute's contents as the kernel does.
func wireTuple(proto uint8, src, dst netip.AddrPort) []byte {
	var ip []byte
	srcT, dstT := uint16(ctaIPv4Src), uint16(ctaIPv4Dst)
	if src.Addr().Is6() {
		srcT, dstT = ctaIPv6Src, ctaIPv6Dst
	}
	ip = nfnl.AppendAttr(ip, srcT, src.Addr().AsSlice())
	ip = nfnl.AppendAttr(ip, dstT, dst.Addr().AsSlice())
	var p []byte
	p = nfnl.AppendAttr(p, ctaProtoNum, []byte{proto})
	p = nfnl.AppendAttr(p, ctaProtoSrcPort, binary.BigEndian.AppendUint16(nil, src.Port()))
	p = nfnl.AppendAttr(p, ctaProtoDstPort, binary.BigEndian.AppendUint16(nil, dst.Port()))
	var t []byte
	t = nfnl.AppendAttr(t, ctaTupleIP|unix.NLA_F_NESTED, ip)
	return nfnl.AppendAttr(t, ctaTupleProto|unix.NLA_F_NESTED, p)
}

// wireEntry encodes a conntrack entry's attributes: a flow from client to
// frontend, answered by reply (the endpoint, or the frontend when not
// DNATed); tcpState is set for TCP, and replied sets the status of a
// confirmed entry that saw a reply (a create that would change the
// confirmed bit, or the NAT bits the kernel sets for a DNATed reply tuple,
// is refused with EBUSY).
func wireEntry(proto uint8, client, frontend, reply netip.AddrPort, tcpState uint8, replied bool, id uint32) []byte {
	var b []byte
	b = nfnl.AppendAttr(b, ctaTupleOrig|unix.NLA_F_NESTED, wireTuple(proto, client, frontend))
	b = nfnl.AppendAttr(b, ctaTupleReply|unix.NLA_F_NESTED, wireTuple(proto, reply, client))
	if replied {
		b = nfnl.AppendAttrBE32(b, ctaStatus, ipsSeenReply|ipsConfirmed)
	}
	if proto == unix.IPPROTO_TCP {
		tcp := nfnl.AppendAttr(nil, ctaProtoinfoTCPState, []byte{tcpState})
		info := nfnl.AppendAttr(nil, ctaProtoinfoTCP|unix.NLA_F_NESTED, tcp)
		b = nfnl.AppendAttr(b, ctaProtoinfo|unix.NLA_F_NESTED, info)
	}
	if id != 0 {
		b = nfnl.AppendAttrBE32(b, ctaID, id)
	}
	return b
}

func TestParseEntry(t *testing.T) {
	ap := netip.MustParseAddrPort
	client, svc, ep := ap("198.18.5.5:40000"), ap("198.18.0.10:53"), ap("198.19.1.1:5353")
	for _, tc := range []struct {
		name  string
		attrs []byte
		want  Flow
		ok    bool
	}{
		{"udp", wireEntry(unix.IPPROTO_UDP, client, svc, ep, 0, false, 7), Flow{model.UDP, svc, ep, false}, true},
		{"sctp", wireEntry(unix.IPPROTO_SCTP, client, svc, ep, 0, false, 7), Flow{model.SCTP, svc, ep, false}, true},
		{"tcp syn sent", wireEntry(unix.IPPROTO_TCP, client, svc, svc, tcpConntrackSynSent, false, 7), Flow{model.TCP, svc, svc, true}, true},
		{"tcp established", wireEntry(unix.IPPROTO_TCP, client, svc, ep, 3, false, 7), Flow{model.TCP, svc, ep, false}, true},
		{"ipv6", wireEntry(unix.IPPROTO_UDP, ap("[fd00::5]:40000"), ap("[fd00:10::10]:53"), ap("[fd00:19::1]:5353"), 0, false, 7),
			Flow{model.UDP, ap("[fd00:10::10]:53"), ap("[fd00:19::1]:5353"), false}, true},
		{"icmp is not cleaned", wireEntry(unix.IPPROTO_ICMP, client, svc, ep, 0, false, 7), Flow{}, false},
		{"no reply tuple", nfnl.AppendAttr(nil, ctaTupleOrig|unix.NLA_F_NESTED, wireTuple(unix.IPPROTO_UDP, client, svc)), Flow{}, false},
		{"empty", nil, Flow{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := parseEntry(tc.attrs)
			if e.ok != tc.ok || tc.ok && e.flow != tc.want {
				t.Errorf("parseEntry() = %+v ok=%v, want %+v ok=%v", e.flow, e.ok, tc.want, tc.ok)
			}
			if !tc.ok {
				return
			}
			// The delete names the entry by its original tuple and ID.
			del := appendDelete(nil, unix.AF_INET, e.kept())
			if !bytes.Contains(del, e.orig) || !bytes.Contains(del, binary.BigEndian.AppendUint32(nil, 7)) {
				t.Errorf("delete request % x lacks the tuple or the ID", del)
			}
			if typ := binary.NativeEndian.Uint16(del[4:]); typ != unix.NFNL_SUBSYS_CTNETLINK<<8|msgCTDelete {
				t.Errorf("delete request type %#x", typ)
			}
		})
	}
}

// TestDumpRequest checks the filter attributes a scoped walk asks for.
func TestDumpRequest(t *testing.T) {
	attrsOf := func(req []byte) map[uint16][]byte {
		m := map[uint16][]byte{}
		nfnl.EachAttr(req[16+4:], func(typ uint16, data []byte) { m[typ] = data })
		return m
	}
	udp := attrsOf(dumpRequest(unix.AF_INET, Scope{Protocol: model.UDP}, true))
	if proto, _, _ := parseTuple(udp[ctaTupleOrig]); proto != unix.IPPROTO_UDP {
		t.Errorf("UDP walk filters protocol %d", proto)
	}
	var flags uint32
	nfnl.EachAttr(udp[ctaFilter], func(typ uint16, data []byte) {
		if typ == ctaFilterOrigFlags {
			flags = binary.NativeEndian.Uint32(data)
		}
	})
	if flags != ctaFilterFProtoNum {
		t.Errorf("UDP walk's original-tuple filter flags = %#x", flags)
	}
	if _, ok := udp[ctaStatus]; ok {
		t.Error("UDP walk filters on status")
	}
	tcp := attrsOf(dumpRequest(unix.AF_INET6, Scope{Protocol: model.TCP, Unreplied: true}, true))
	if !bytes.Equal(tcp[ctaStatus], []byte{0, 0, 0, 0}) || !bytes.Equal(tcp[ctaStatusMask], []byte{0, 0, 0, ipsSeenReply}) {
		t.Errorf("unanswered TCP walk's status filter = % x / % x", tcp[ctaStatus], tcp[ctaStatusMask])
	}
	if len(attrsOf(dumpRequest(unix.AF_INET, Scope{Protocol: model.UDP}, false))) != 0 {
		t.Error("an unfiltered walk carries filter attributes")
	}
}

func TestPlanScopes(t *testing.T) {
	port := func(proto model.Protocol, name string) *model.ServicePort {
		return &model.ServicePort{ID: model.PortID{Namespace: "ns", Name: name, Protocol: proto}, Family: model.IPv4, Protocol: proto,
			Port: 53, ClusterIP: netip.MustParseAddr("198.18.0.10"),
			Endpoints: []*model.Endpoint{{IP: netip.MustParseAddr("198.19.1.1"), Port: 53, Ready: true, Serving: true}}}
	}
	next := &model.FamilySnapshot{Family: model.IPv4, Ports: []*model.ServicePort{port(model.UDP, "a"), port(model.TCP, "b")}}
	got := NewPlan(nil, next, true).Scopes()
	want := []Scope{{Protocol: model.UDP}, {Protocol: model.TCP, Unreplied: true}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("full plan's scopes = %v, want %v", got, want)
	}
	if s := NewPlan(next, next, false).Scopes(); len(s) != 0 {
		t.Errorf("a plan with nothing changed has scopes %v", s)
	}
}

func FuzzParseEntry(f *testing.F) {
	ap := netip.MustParseAddrPort
	f.Add(wireEntry(unix.IPPROTO_UDP, ap("198.18.5.5:40000"), ap("198.18.0.10:53"), ap("198.19.1.1:5353"), 0, false, 7))
	f.Add(wireEntry(unix.IPPROTO_TCP, ap("[fd00::5]:1"), ap("[fd00::10]:80"), ap("[fd00::10]:80"), 1, false, 9))
	f.Fuzz(func(t *testing.T, b []byte) {
		e := parseEntry(b)
		if e.ok && (!e.flow.OrigDst.IsValid() || !e.flow.ReplySrc.IsValid() || e.orig == nil) {
			t.Fatalf("parseEntry accepted an incomplete entry: %+v", e)
		}
		if e.ok {
			_ = appendDelete(nil, unix.AF_INET, e.kept())
		}
	})
}
