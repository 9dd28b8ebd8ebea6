package nftables

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	gnftables "github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"
)

// errNoNetlink means a transaction holds something the netlink path does
// not translate (table, set definitions, base chains, affinity or firewall
// rules); the caller then uses the nft CLI.
var errNoNetlink = errors.New("not translatable to netlink")

// netlinkApply sends ops as one netlink batch (atomic, like nft -f) without
// the nft CLI, whose cache fetch costs tens of milliseconds per call at 10k
// Services. It handles the operations of incremental syncs: regular chains,
// endpoint/external chain rules, and elements of the shared sets and maps.
// It returns errNoNetlink, before sending anything, for anything else.
func (n *netlinkReader) apply(ops []op, sets map[string]*set) error {
	conn, err := gnftables.New()
	if err != nil {
		return err
	}
	tb := n.table
	for _, o := range ops {
		if err := n.queue(conn, tb, o, sets); err != nil {
			return err
		}
	}
	return conn.Flush()
}

func (n *netlinkReader) queue(conn *gnftables.Conn, tb *gnftables.Table, o op, sets map[string]*set) error {
	switch obj := o.obj.(type) {
	case *knftables.Chain:
		if obj.Hook != nil {
			return errNoNetlink
		}
		c := &gnftables.Chain{Name: obj.Name, Table: tb}
		switch o.verb {
		case opAdd:
			conn.AddChain(c)
		case opFlush:
			conn.FlushChain(c)
		case opDelete:
			conn.DelChain(c)
		}
		return nil
	case *knftables.Rule:
		exprs, err := n.ruleExprs(obj.Rule)
		if err != nil || o.verb != opAdd {
			return errNoNetlink
		}
		conn.AddRule(&gnftables.Rule{Table: tb, Chain: &gnftables.Chain{Name: obj.Chain, Table: tb}, Exprs: exprs})
		return nil
	case *knftables.Set:
		if o.verb != opDelete {
			return errNoNetlink
		}
		conn.DelSet(&gnftables.Set{Name: obj.Name, Table: tb})
		return nil
	case *knftables.Element:
		return n.queueElement(conn, tb, o.verb, obj, sets)
	}
	return errNoNetlink
}

func (n *netlinkReader) queueElement(conn *gnftables.Conn, tb *gnftables.Table, verb opVerb, e *knftables.Element, sets map[string]*set) error {
	s := sets[e.Set+e.Map]
	if s == nil || s.Name == setNodePortIPs {
		return errNoNetlink
	}
	fields, dataFields := s.fields()
	key, err := encodeKey(fields, e.Key)
	if err != nil {
		return errNoNetlink
	}
	el := gnftables.SetElement{Key: key}
	if len(dataFields) > 0 && dataFields[0] != "verdict" {
		if verb == opAdd {
			if el.Val, err = encodeKey(dataFields, e.Value); err != nil {
				return errNoNetlink
			}
		}
	} else if s.IsMap && verb == opAdd {
		if el.VerdictData, err = parseVerdict(strings.Join(e.Value, " ")); err != nil {
			return errNoNetlink
		}
	}
	gs := &gnftables.Set{Name: s.Name, Table: tb, IsMap: s.IsMap}
	if verb == opDelete {
		return conn.SetDeleteElements(gs, []gnftables.SetElement{el})
	}
	return conn.SetAddElements(gs, []gnftables.SetElement{el})
}

// encodeKey is the inverse of decodeKey.
func encodeKey(fields, key []string) ([]byte, error) {
	if len(fields) != len(key) {
		return nil, fmt.Errorf("key %v does not match type %v", key, fields)
	}
	var out []byte
	for i, f := range fields {
		var b []byte
		switch f {
		case "ipv4_addr", "ipv6_addr":
			a, err := netip.ParseAddr(key[i])
			if err != nil {
				return nil, err
			}
			b = a.AsSlice()
		case "inet_proto":
			p, ok := protoNumbers[key[i]]
			if !ok {
				return nil, fmt.Errorf("unknown protocol %q", key[i])
			}
			b = []byte{p}
		case "numgen":
			v, err := strconv.ParseUint(key[i], 10, 32)
			if err != nil {
				return nil, err
			}
			b = binary.NativeEndian.AppendUint32(nil, uint32(v))
		case "inet_service":
			v, err := strconv.ParseUint(key[i], 10, 16)
			if err != nil {
				return nil, err
			}
			b = binary.BigEndian.AppendUint16(nil, uint16(v))
		default:
			return nil, fmt.Errorf("unknown type %q", f)
		}
		out = append(out, b...)
		for len(out)%4 != 0 {
			out = append(out, 0)
		}
	}
	return out, nil
}

var protoNumbers = map[string]byte{"tcp": unix.IPPROTO_TCP, "udp": unix.IPPROTO_UDP, "sctp": unix.IPPROTO_SCTP}

func parseVerdict(v string) (*expr.Verdict, error) {
	f := strings.Fields(v)
	switch {
	case len(f) == 2 && f[0] == "goto":
		return &expr.Verdict{Kind: expr.VerdictGoto, Chain: f[1]}, nil
	case len(f) == 2 && f[0] == "jump":
		return &expr.Verdict{Kind: expr.VerdictJump, Chain: f[1]}, nil
	case len(f) == 1 && f[0] == "drop":
		return &expr.Verdict{Kind: expr.VerdictDrop}, nil
	case len(f) == 1 && f[0] == "accept":
		return &expr.Verdict{Kind: expr.VerdictAccept}, nil
	}
	return nil, fmt.Errorf("verdict %q", v)
}

// ruleExprs translates the rule vocabulary of endpoint and external chains
// into expressions equivalent to what nft generates for the same text.
func (n *netlinkReader) ruleExprs(rule string) ([]expr.Any, error) {
	toks := strings.Fields(rule)
	var out []expr.Any
	for len(toks) > 0 {
		exprs, used, err := n.stmt(toks)
		if err != nil {
			return nil, err
		}
		out = append(out, exprs...)
		toks = toks[used:]
	}
	return out, nil
}

func cmpReg(op expr.CmpOp, data []byte) *expr.Cmp { return &expr.Cmp{Op: op, Register: 1, Data: data} }

func (n *netlinkReader) stmt(t []string) ([]expr.Any, int, error) {
	at := func(i int) string {
		if i < len(t) {
			return t[i]
		}
		return ""
	}
	switch {
	case at(0) == "numgen" && at(1) == "random" && at(2) == "mod" && at(4) == "0":
		m, err := strconv.ParseUint(at(3), 10, 32)
		if err != nil {
			return nil, 0, err
		}
		return []expr.Any{&expr.Numgen{Register: 1, Modulus: uint32(m), Type: unix.NFT_NG_RANDOM},
			cmpReg(expr.CmpOpEq, make([]byte, 4))}, 5, nil
	case at(0) == "meta" && at(1) == "l4proto":
		p, ok := protoNumbers[at(2)]
		if !ok {
			return nil, 0, errNoNetlink
		}
		return []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, cmpReg(expr.CmpOpEq, []byte{p})}, 3, nil
	case at(0) == "dnat" && at(1) == "to":
		return n.dnat(at(2))
	case at(0) == "dnat" && at(2) == "to" && at(3) == "numgen" && at(5) == "mod" && at(7) == "offset" && at(9) == "map":
		return n.mappedDNAT(at(6), at(8), at(10))
	case at(0) == "goto" && at(1) != "":
		return []expr.Any{&expr.Verdict{Kind: expr.VerdictGoto, Chain: at(1)}}, 2, nil
	case at(0) == "fib" && at(1) == "saddr" && at(2) == "type" && at(3) == "local":
		return []expr.Any{&expr.Fib{Register: 1, FlagSADDR: true, ResultADDRTYPE: true},
			cmpReg(expr.CmpOpEq, binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL))}, 4, nil
	case at(0) == "mark" && at(1) == "set" && at(2) == "mark" && at(3) == "or":
		return markOr(at(4))
	case at(0) == "iifname":
		return iifname(t)
	case (at(0) == "ip" || at(0) == "ip6") && at(1) == "saddr":
		return n.saddr(t)
	}
	return nil, 0, errNoNetlink
}

func (n *netlinkReader) dnat(target string) ([]expr.Any, int, error) {
	ap, err := netip.ParseAddrPort(target)
	if err != nil {
		return nil, 0, errNoNetlink
	}
	fam := uint32(unix.NFPROTO_IPV4)
	if n.table.Family == gnftables.TableFamilyIPv6 {
		fam = unix.NFPROTO_IPV6
	}
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: ap.Addr().AsSlice()},
		&expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(ap.Port())},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: fam, RegAddrMin: 1, RegProtoMin: 2, Specified: true},
	}, 3, nil
}

// mappedDNAT is `dnat ip to numgen random mod M offset B map @endpoints`:
// the map's data (address . port) fills a register pair.
func (n *netlinkReader) mappedDNAT(mod, offset, setRef string) ([]expr.Any, int, error) {
	m, err1 := strconv.ParseUint(mod, 10, 32)
	b, err2 := strconv.ParseUint(offset, 10, 32)
	if err1 != nil || err2 != nil || !strings.HasPrefix(setRef, "@") {
		return nil, 0, errNoNetlink
	}
	fam, protoReg := uint32(unix.NFPROTO_IPV4), uint32(unix.NFT_REG32_01)
	if n.table.Family == gnftables.TableFamilyIPv6 {
		fam, protoReg = unix.NFPROTO_IPV6, unix.NFT_REG32_04
	}
	return []expr.Any{
		&expr.Numgen{Register: 1, Modulus: uint32(m), Type: unix.NFT_NG_RANDOM, Offset: uint32(b)},
		&expr.Lookup{SourceRegister: 1, DestRegister: 1, IsDestRegSet: true, SetName: setRef[1:]},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: fam, RegAddrMin: 1, RegProtoMin: protoReg},
	}, 11, nil
}

func markOr(val string) ([]expr.Any, int, error) {
	v, err := strconv.ParseUint(val, 0, 32)
	if err != nil {
		return nil, 0, errNoNetlink
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(^uint32(v)), Xor: binaryutil.NativeEndian.PutUint32(uint32(v))},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1},
	}, 5, nil
}

// iifname handles `iifname [!=] "name"` and the prefix form "name*".
func iifname(t []string) ([]expr.Any, int, error) {
	op, i := expr.CmpOpEq, 1
	if len(t) > 1 && t[1] == "!=" {
		op, i = expr.CmpOpNeq, 2
	}
	if len(t) <= i {
		return nil, 0, errNoNetlink
	}
	name := strings.Trim(t[i], `"`)
	var data []byte
	if p, ok := strings.CutSuffix(name, "*"); ok {
		data = []byte(p)
	} else {
		if len(name) >= unix.IFNAMSIZ {
			return nil, 0, errNoNetlink
		}
		data = make([]byte, unix.IFNAMSIZ)
		copy(data, name)
	}
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1}, cmpReg(op, data)}, i + 1, nil
}

// saddr handles `ip saddr [!=] CIDR-or-address`.
func (n *netlinkReader) saddr(t []string) ([]expr.Any, int, error) {
	op, i := expr.CmpOpEq, 2
	if len(t) > 2 && t[2] == "!=" {
		op, i = expr.CmpOpNeq, 3
	}
	if len(t) <= i {
		return nil, 0, errNoNetlink
	}
	p, err := netip.ParsePrefix(t[i])
	if err != nil {
		a, err2 := netip.ParseAddr(t[i])
		if err2 != nil {
			return nil, 0, errNoNetlink
		}
		p = netip.PrefixFrom(a, a.BitLen())
	}
	p = p.Masked()
	off, size := uint32(12), uint32(4)
	if p.Addr().Is6() {
		off, size = 8, 16
	}
	out := []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: size}}
	if p.Bits() < p.Addr().BitLen() {
		mask := netip.PrefixFrom(p.Addr(), p.Bits())
		out = append(out, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: size,
			Mask: prefixMask(mask), Xor: make([]byte, size)})
	}
	return append(out, cmpReg(op, p.Addr().AsSlice())), i + 1, nil
}

func prefixMask(p netip.Prefix) []byte {
	b := make([]byte, p.Addr().BitLen()/8)
	for i := 0; i < p.Bits(); i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	return b
}
