package nftables

import (
	"cmp"
	"crypto/sha256"
	"encoding/base32"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/kproxy/kproxy/internal/model"
)

// desired is the complete kernel state kproxy wants for one family's table.
// It is produced by render (pure) and consumed by the apply step.
type desired struct {
	Family model.Family
	// Sets are the table's fixed sets and maps, in creation order.
	Sets []*set
	// Chains are the fixed base and helper chains, in creation order. Their
	// names never change; their rules depend on the configuration only.
	Chains []*chain
	// Elems are elements of fixed sets that come from the configuration.
	Elems []element
	// Ports holds what each service port adds to the table.
	Ports map[model.PortID]*portState
}

// portState is what one service port contributes: its own chains
// (content-addressed names), elements of the shared sets and maps, and
// its policy chains' blocks of the endpoint-ranges maps.
type portState struct {
	Chains []*chain
	Elems  []element
	Fills  []fill
	// Hairpin are the port's local endpoints (protocol HairpinProto):
	// each is an element of the hairpin set, which ports share
	// (famState.hairpins counts them, by hairpinKey).
	Hairpin      []*model.Endpoint
	HairpinProto uint8
	// Affinity are the ids the port's endpoints have in the affinity set
	// (ClientIP affinity only), sorted: sweepAffinity deletes the elements
	// of those that go.
	Affinity []uint32
}

// hairpinKeys yields the hairpin set keys of ps's local endpoints.
func (ps *portState) hairpinKeys(yield func(hairpinKey) bool) {
	for _, ep := range ps.Hairpin {
		if !yield(hairpinKey{ip: ep.IP, port: ep.Port, proto: ps.HairpinProto}) {
			return
		}
	}
}

// hairpinKey is an element "ip . ip . proto . port" of the hairpin set,
// without its text. Ports hold their local endpoints instead (8 bytes
// each): a sync at 10k Services × 100 endpoints holds half a million, of
// a few tens of thousands of distinct keys.
type hairpinKey struct {
	ip    netip.Addr
	port  uint16
	proto uint8 // IPPROTO_*
}

// element is k in text form.
func (k hairpinKey) element() element {
	ip := k.ip.String()
	return element{Set: setHairpin, Key: ip + fieldSep + ip + fieldSep + protoNames[k.proto] + fieldSep + strconv.Itoa(int(k.port))}
}

// compare orders keys by address, then protocol, then port.
func (k hairpinKey) compare(o hairpinKey) int {
	return cmp.Or(k.ip.Compare(o.ip), cmp.Compare(k.proto, o.proto), cmp.Compare(k.port, o.port))
}

// fill is a policy chain's block of an endpoint-ranges map and what it
// holds, in key order. A block has one owner, so its elements are diffed
// per port (diffFill) and never counted in famState.want.
type fill struct {
	key   string // the slotAlloc key
	b     block
	elems []rangeElem
}

// rangeElem is one element of an endpoint-ranges map: keys lo..hi of a
// block go to ep's address and port. It holds no text (16 bytes): a sync
// at 10k Services × 100 endpoints holds a million of them, which as
// element strings indexed in want took ~210 bytes each.
type rangeElem struct {
	lo, hi uint32
	ep     *model.Endpoint
}

// element is e in the text form of the other elements (dry runs, traces,
// the knftables fake, comparing with a kernel read).
func (f *fill) element(i int) element {
	e := f.elems[i]
	return element{Set: f.b.shard, Key: rangeKey(e.lo, e.hi), Value: addrPort(e.ep.IP, e.ep.Port)}
}

// rangeKey is the interval key "lo-hi".
func rangeKey(lo, hi uint32) string {
	var buf [24]byte
	b := append(strconv.AppendUint(buf[:0], uint64(lo), 10), '-')
	return string(strconv.AppendUint(b, uint64(hi), 10))
}

// sameTarget reports whether two range elements map the same keys to the
// same address and port.
func (e rangeElem) sameTarget(o rangeElem) bool {
	return e.lo == o.lo && e.hi == o.hi && e.ep.IP == o.ep.IP && e.ep.Port == o.ep.Port
}

// allElems is every element ps contributes in text form, the fills'
// included (traces, verify, tests; not the sync's path).
func (ps *portState) allElems() []element {
	out := slices.Clone(ps.Elems)
	for i := range ps.Fills {
		f := &ps.Fills[i]
		for j := range f.elems {
			out = append(out, f.element(j))
		}
	}
	for k := range ps.hairpinKeys {
		out = append(out, k.element())
	}
	return out
}

// elemCount is how many elements ps contributes.
func (ps *portState) elemCount() int {
	n := len(ps.Elems) + len(ps.Hairpin)
	for _, f := range ps.Fills {
		n += len(f.elems)
	}
	return n
}

// chain is a chain and its complete rule list.
type chain struct {
	Name  string
	Base  *baseSpec // nil for a regular chain
	Rules []rule
}

// baseSpec attaches a chain to a netfilter hook.
type baseSpec struct {
	Type     knftables.BaseChainType
	Hook     knftables.BaseChainHook
	Priority knftables.BaseChainPriority
}

// set is a set or (when IsMap) a map definition.
type set struct {
	Name    string
	IsMap   bool
	Type    string
	TypeOf  string // used instead of Type when set
	Flags   []knftables.SetFlag
	Timeout time.Duration
	// Size bounds the elements of a dynamic set (0: no bound).
	Size    uint64
	Comment string
}

// element is one element of a set (Value "") or map, in nft's text form:
// Key and Value are their fields joined by " . " (a verdict is one field,
// "goto X"). One string each rather than a slice of fields: a full sync
// at 10k Services holds 250k elements.
type element struct {
	Set   string
	Key   string
	Value string
}

// fieldSep separates the fields of a concatenated key or value.
const fieldSep = " . "

// object returns the knftables form of the element.
func (e element) object(isMap bool) *knftables.Element {
	el := &knftables.Element{Key: strings.Split(e.Key, fieldSep)}
	if e.Value != "" {
		el.Value = strings.Split(e.Value, fieldSep)
	}
	if isMap {
		el.Map = e.Set
	} else {
		el.Set = e.Set
	}
	return el
}

func (c *chain) object() *knftables.Chain {
	kc := &knftables.Chain{Name: c.Name}
	if c.Base != nil {
		kc.Type = knftables.PtrTo(c.Base.Type)
		kc.Hook = knftables.PtrTo(c.Base.Hook)
		kc.Priority = knftables.PtrTo(c.Base.Priority)
	}
	return kc
}

func (s *set) object() knftables.Object {
	var timeout *time.Duration
	if s.Timeout > 0 {
		timeout = knftables.PtrTo(s.Timeout)
	}
	var comment *string
	if s.Comment != "" {
		comment = knftables.PtrTo(s.Comment)
	}
	var size *uint64
	if s.Size > 0 {
		size = knftables.PtrTo(s.Size)
	}
	if s.IsMap {
		return &knftables.Map{Name: s.Name, Type: s.Type, TypeOf: s.TypeOf, Flags: s.Flags, Timeout: timeout, Size: size, Comment: comment}
	}
	return &knftables.Set{Name: s.Name, Type: s.Type, TypeOf: s.TypeOf, Flags: s.Flags, Timeout: timeout, Size: size, Comment: comment}
}

// fields returns the wire types of the key and data of a set or map.
func (s *set) fields() (key, data []string) {
	if s.TypeOf != "" { // the endpoints map: numgen -> address . port
		addr := "ipv4_addr"
		if strings.Contains(s.TypeOf, "ip6 ") {
			addr = "ipv6_addr"
		}
		return []string{"numgen"}, []string{addr, "inet_service"}
	}
	k, d, _ := strings.Cut(s.Type, " : ")
	key = strings.Split(k, " . ")
	if d != "" {
		data = strings.Split(d, " . ")
	}
	return key, data
}

// contentName returns prefix-HASH-human, where HASH covers human and every
// part of content, so that a name identifies the object's whole content: a
// chain whose rules change gets a new name. The result fits nftables' limit.
func contentName(prefix, human string, content ...rule) string {
	bp := nameBufs.Get().(*[]byte)
	buf := append((*bp)[:0], human...)
	for _, c := range content {
		buf = c.appendText(append(buf, 0))
	}
	sum := sha256.Sum256(buf)
	*bp = buf
	nameBufs.Put(bp)
	var enc [56]byte // base32 of 32 bytes, padded
	base32.StdEncoding.Encode(enc[:], sum[:])
	name := prefix + "-" + string(enc[:10]) + "-" + human
	if len(name) > knftables.NameLengthMax-1 {
		name = name[:knftables.NameLengthMax-4] + "..."
	}
	return name
}

// nameBufs holds the buffers contentName hashes a chain's text in: a
// render names every chain of every port, and with a buffer, hash state and
// encoding of its own per name a cold sync at 10k Services × 10 endpoints
// allocated 49.7 MB where it now allocates 45.1 (BenchmarkColdSync10k with
// KPROXY_SCALE_AFFINITY=1, this change alone).
var nameBufs = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// isPortObject reports whether a chain or set name was made by contentName
// for a service port (fixed names never contain a slash).
func isPortObject(name string) bool { return strings.Contains(name, "/") }

// portChainPrefixes are the prefixes contentName is given for port chains.
var portChainPrefixes = []string{"svc-", "loc-", "ext-", "fw-"}

// isForeignChain reports whether a chain of the table is a per-Service
// chain kproxy did not make: upstream kube-proxy's (service-, local-,
// external-, endpoint-, firewall-…) when kproxy takes over its table.
func isForeignChain(name string) bool {
	if !isPortObject(name) {
		return false
	}
	for _, p := range portChainPrefixes {
		if strings.HasPrefix(name, p) {
			return false
		}
	}
	return true
}
