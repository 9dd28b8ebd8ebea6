package nftables

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/kproxy/kproxy/internal/nfnl"
)

// errNoNetlink means a transaction holds something the netlink path does
// not translate. There is no fallback: nlKernel fails the transaction, so
// the sync fails and the next one is full. Every rule and object render
// produces translates (nl_test.go checks every op of every feature), so
// this names a bug, not a normal path.
var errNoNetlink = errors.New("not translatable to netlink")

// nlTxn translates the ops of one transaction into an nlBatch.
type nlTxn struct {
	n    *netlinkReader
	b    *nlBatch
	sets map[string]*set
	// w is the open element list (consecutive element ops of one set and
	// verb share messages), for set wSet and verb wVerb.
	w     *elemWriter
	wSet  string
	wVerb opVerb
	// scratch and elems hold the encoding of the current element.
	scratch []byte
	elems   [2]nlElem
	// exprs holds the expressions of the rule being encoded: one slice
	// for every rule of the transaction instead of one grown per rule.
	exprs []expr.Any
	// fields caches each set's key and data field types.
	fields map[string]setFields
}

// setFields are the wire types of a set's key and data.
type setFields struct{ key, data []string }

// encode writes ops into a batch, which nlBatch.send sends as one
// transaction: atomic, like nft -f, without the CLI's parsing and cache
// fetch. It returns errNoNetlink when an op does not translate.
func (n *netlinkReader) encode(ops opList, sets map[string]*set) (*nlBatch, error) {
	// About 60 bytes per operation at 10k Services (mostly elements).
	return n.encodeInto(newNLBatch(n.nfproto(), n.table.Name, 64*ops.len()+4096), ops, sets)
}

// encodePooled is encode into a batch whose chunks come from pool (and go
// back to it with release).
func (n *netlinkReader) encodePooled(ops opList, sets map[string]*set, pool *nfnl.Pool) (*nlBatch, error) {
	return n.encodeInto(newPooledNLBatch(n.nfproto(), n.table.Name, pool), ops, sets)
}

// encodeInto is encode into a started batch b.
func (n *netlinkReader) encodeInto(b *nlBatch, ops opList, sets map[string]*set) (*nlBatch, error) {
	t := &nlTxn{n: n, b: b, sets: sets}
	for o := range ops.all {
		if err := t.queue(o); err != nil {
			return nil, err
		}
	}
	t.closeElems()
	return t.b, nil
}

func (t *nlTxn) closeElems() {
	if t.w != nil {
		t.w.close()
		t.w, t.wSet = nil, ""
	}
}

func (t *nlTxn) queue(o op) error {
	switch f := o.obj.(type) {
	case nil:
		return t.element(o.verb, *o.elem)
	case *fill:
		return t.rangeElement(o.verb, f.b.shard, f.elems[o.idx])
	}
	t.closeElems()
	switch obj := o.obj.(type) {
	case *knftables.Table:
		switch o.verb {
		case opAdd:
			t.b.addTable(deref(obj.Comment))
		case opDelete:
			t.b.delTable()
		default:
			return errNoNetlink
		}
	case *knftables.Chain:
		return t.chain(o.verb, obj)
	case *ruleOp:
		return t.rule(o.verb, obj)
	case *knftables.Set:
		return t.set(o.verb, obj.Name, &set{Name: obj.Name, Type: obj.Type, TypeOf: obj.TypeOf, Flags: obj.Flags,
			Timeout: deref(obj.Timeout), Size: deref(obj.Size), Comment: deref(obj.Comment)})
	case *knftables.Map:
		return t.set(o.verb, obj.Name, &set{Name: obj.Name, IsMap: true, Type: obj.Type, TypeOf: obj.TypeOf, Flags: obj.Flags,
			Timeout: deref(obj.Timeout), Size: deref(obj.Size), Comment: deref(obj.Comment)})
	default:
		return errNoNetlink
	}
	return nil
}

func (t *nlTxn) chain(verb opVerb, c *knftables.Chain) error {
	switch verb {
	case opAdd:
		return t.b.addChain(c)
	case opFlush:
		t.b.flushChain(c.Name)
	case opDelete:
		t.b.delChain(c.Name)
	}
	return nil
}

func (t *nlTxn) rule(verb opVerb, r *ruleOp) error {
	if verb != opAdd {
		return errNoNetlink
	}
	if !r.rule.expands() {
		return t.addRule(r.chain, r.rule)
	}
	for _, kr := range r.rule.kernelRules() {
		if err := t.addRule(r.chain, kr); err != nil {
			return err
		}
	}
	return nil
}

// addRule encodes one kernel rule into the batch.
func (t *nlTxn) addRule(chain string, kr rule) error {
	t.exprs = kr.appendExprs(t.exprs[:0])
	err := t.b.addRule(chain, kr, t.exprs)
	clear(t.exprs)
	return err
}

func (t *nlTxn) set(verb opVerb, name string, s *set) error {
	switch verb {
	case opAdd:
		if err := t.b.addSet(s); err != nil {
			return errors.Join(errNoNetlink, err)
		}
	case opFlush:
		t.b.flushSet(name)
	case opDelete:
		t.b.delSet(name)
	}
	return nil
}

func (t *nlTxn) element(verb opVerb, e element) error {
	if verb == opFlush {
		return errNoNetlink
	}
	name := e.Set
	s := t.sets[name]
	if s == nil {
		return errNoNetlink
	}
	if t.scratch == nil {
		t.scratch = make([]byte, 0, 256)
	}
	f, ok := t.fields[name]
	if !ok {
		f.key, f.data = s.fields()
		if t.fields == nil {
			t.fields = map[string]setFields{}
		}
		t.fields[name] = f
	}
	elems, err := encodeElem(t.elems[:0], t.scratch[:0], s, f, verb, e)
	if err != nil {
		return errNoNetlink
	}
	t.write(name, verb, elems)
	return nil
}

// write adds encoded elements of set name to the open element list, or
// to a new one when the set or the verb changes.
func (t *nlTxn) write(name string, verb opVerb, elems []nlElem) {
	if t.w == nil || t.wSet != name || t.wVerb != verb {
		t.closeElems()
		t.w, t.wSet, t.wVerb = t.b.elements(name, verb == opDelete), name, verb
	}
	for _, el := range elems {
		t.w.add(el)
	}
}

// rangeElement encodes an element of the endpoint-ranges map name from
// its numbers (encodeRange).
func (t *nlTxn) rangeElement(verb opVerb, name string, e rangeElem) error {
	if verb == opFlush || t.sets[name] == nil {
		return errNoNetlink
	}
	if t.scratch == nil {
		t.scratch = make([]byte, 0, 256)
	}
	t.write(name, verb, encodeRange(t.elems[:0], t.scratch[:0], verb, e))
	return nil
}

// encodeRange encodes an endpoint-ranges element from its numbers, as
// encodeRangeElem does from its text: the first key with the data
// (address . port, each padded to 4 bytes), and the key after the last
// one flagged as the end (none at the top of the key space).
func encodeRange(dst []nlElem, scratch []byte, verb opVerb, e rangeElem) []nlElem {
	key := binary.BigEndian.AppendUint32(scratch, e.lo)
	el := nlElem{key: key}
	rest := key[len(key):]
	if verb != opDelete {
		var data []byte
		if e.ep.IP.Is4() {
			a := e.ep.IP.As4()
			data = append(rest, a[:]...)
		} else {
			a := e.ep.IP.As16()
			data = append(rest, a[:]...)
		}
		el.data = append(binary.BigEndian.AppendUint16(data, e.ep.Port), 0, 0)
		rest = el.data[len(el.data):]
	}
	dst = append(dst, el)
	if end, ok := intervalEnd(binary.BigEndian.AppendUint32(rest, e.hi)); ok {
		dst = append(dst, end)
	}
	return dst
}

// encodeElem encodes an element of s; a prefix in an interval set is two.
// The encoded bytes are appended to scratch (the caller copies them).
func encodeElem(dst []nlElem, scratch []byte, s *set, f setFields, verb opVerb, e element) ([]nlElem, error) {
	fields, dataFields := f.key, f.data
	if slices.Contains(s.Flags, knftables.IntervalFlag) && fields[0] == "numgen" {
		return encodeRangeElem(dst, scratch, dataFields, verb, e)
	}
	if slices.Contains(s.Flags, knftables.IntervalFlag) {
		p, err := netip.ParsePrefix(e.Key)
		if err != nil {
			a, err2 := netip.ParseAddr(e.Key)
			if err2 != nil {
				return nil, err
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		return append(dst, intervalElems(p)...), nil
	}
	key, err := appendKey(scratch, fields, e.Key)
	if err != nil {
		return nil, err
	}
	el := nlElem{key: key}
	switch {
	case verb == opDelete || !s.IsMap:
	case dataFields[0] != "verdict":
		el.data, err = appendKey(key[len(key):], dataFields, e.Value)
	default:
		el.verdict, err = parseVerdict(e.Value)
	}
	return append(dst, el), err
}

// encodeRangeElem encodes an endpoint-ranges element "first-last": the
// first key with the data, and the key after the last one flagged as the
// end (none when the range reaches the top of the key space). Keys are big
// endian, as the rule's byteorder conversion makes the numgen value.
func encodeRangeElem(dst []nlElem, scratch []byte, dataFields []string, verb opVerb, e element) ([]nlElem, error) {
	first, last, err := parseRange(e.Key)
	if err != nil {
		return nil, err
	}
	key := binary.BigEndian.AppendUint32(scratch, first)
	el := nlElem{key: key}
	if verb != opDelete {
		if el.data, err = appendKey(key[len(key):], dataFields, e.Value); err != nil {
			return nil, err
		}
	}
	dst = append(dst, el)
	rest := key[len(key):]
	if el.data != nil {
		rest = el.data[len(el.data):]
	}
	if end, ok := intervalEnd(binary.BigEndian.AppendUint32(rest, last)); ok {
		dst = append(dst, end)
	}
	return dst, nil
}

// parseRange reads an interval key "first-last" of 32-bit numbers.
func parseRange(s string) (first, last uint32, err error) {
	a, b, ok := strings.Cut(s, "-")
	x, err1 := strconv.ParseUint(a, 10, 32)
	y, err2 := strconv.ParseUint(b, 10, 32)
	if !ok || err1 != nil || err2 != nil || x > y {
		return 0, 0, fmt.Errorf("bad range %q", s)
	}
	return uint32(x), uint32(y), nil
}

// deref returns *p, or the zero value for nil.
func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// appendKey appends the encoding of text, fields joined by " . ", to out.
func appendKey(out []byte, fields []string, text string) ([]byte, error) {
	rest, more := text, true
	for _, f := range fields {
		if !more {
			return nil, fmt.Errorf("key %q does not match type %v", text, fields)
		}
		var field string
		field, rest, more = strings.Cut(rest, fieldSep)
		switch f {
		case "ipv4_addr", "ipv6_addr":
			a, err := netip.ParseAddr(field)
			if err != nil {
				return nil, err
			}
			if a.Is4() {
				b := a.As4()
				out = append(out, b[:]...)
			} else {
				b := a.As16()
				out = append(out, b[:]...)
			}
		case "inet_proto":
			p, ok := protoNumbers[field]
			if !ok {
				return nil, fmt.Errorf("unknown protocol %q", field)
			}
			out = append(out, p)
		case "numgen":
			v, err := strconv.ParseUint(field, 10, 32)
			if err != nil {
				return nil, err
			}
			out = binary.NativeEndian.AppendUint32(out, uint32(v))
		case "mark":
			v, err := strconv.ParseUint(field, 0, 32)
			if err != nil {
				return nil, err
			}
			out = binary.NativeEndian.AppendUint32(out, uint32(v))
		case "inet_service":
			v, err := strconv.ParseUint(field, 10, 16)
			if err != nil {
				return nil, err
			}
			out = binary.BigEndian.AppendUint16(out, uint16(v))
		default:
			return nil, fmt.Errorf("unknown type %q", f)
		}
		for len(out)%4 != 0 {
			out = append(out, 0)
		}
	}
	if more {
		return nil, fmt.Errorf("key %q does not match type %v", text, fields)
	}
	return out, nil
}

var protoNumbers = map[string]byte{"tcp": unix.IPPROTO_TCP, "udp": unix.IPPROTO_UDP, "sctp": unix.IPPROTO_SCTP}

func parseVerdict(v string) (*expr.Verdict, error) {
	verb, chain, _ := strings.Cut(v, " ")
	switch {
	case verb == "goto" && validChainRef(chain):
		return &expr.Verdict{Kind: expr.VerdictGoto, Chain: chain}, nil
	case verb == "jump" && validChainRef(chain):
		return &expr.Verdict{Kind: expr.VerdictJump, Chain: chain}, nil
	case v == "drop":
		return &expr.Verdict{Kind: expr.VerdictDrop}, nil
	case v == "accept":
		return &expr.Verdict{Kind: expr.VerdictAccept}, nil
	}
	return nil, fmt.Errorf("verdict %q", v)
}

// validChainRef reports whether s can be the chain of a goto or jump.
func validChainRef(s string) bool { return s != "" && !strings.ContainsAny(s, " \t") }
