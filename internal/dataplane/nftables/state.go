package nftables

import (
	"crypto/sha256"
	"encoding/base32"
	"strings"
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
// (content-addressed names) and elements of the shared maps.
type portState struct {
	Chains []*chain
	Elems  []element
	// Blocks are the slotAlloc keys of the endpoints-map blocks it uses.
	Blocks []string
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
	h := sha256.New()
	h.Write([]byte(human))
	var buf [256]byte
	for _, c := range content {
		h.Write([]byte{0})
		h.Write(c.appendText(buf[:0]))
	}
	sum := base32.StdEncoding.EncodeToString(h.Sum(nil))
	name := prefix + "-" + sum[:10] + "-" + human
	if len(name) > knftables.NameLengthMax-1 {
		name = name[:knftables.NameLengthMax-4] + "..."
	}
	return name
}

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
