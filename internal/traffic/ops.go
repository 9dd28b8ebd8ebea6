// Package traffic keeps the per-Service traffic counters of
// --service-traffic-metrics: a small nftables table per IP family that
// counts, without any verdict of its own, the packets, bytes and new
// connections of every Service port, and reads them back in one netlink
// dump per family at scrape time.
package traffic

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"

	"github.com/kproxy/kproxy/internal/model"
)

// Table is the name of the table in the ip and ip6 families.
const Table = "kproxy-traffic"

// Map names. The frontend maps are keyed by the connection's original
// destination address, protocol and port (ClusterIP, external IPs,
// load-balancer ingress IPs); the NodePort maps by protocol and port only.
const (
	mapFrontends    = "frontends"
	mapFrontendsNew = "frontends-new"
	mapNodePorts    = "nodeports"
	mapNodePortsNew = "nodeports-new"
)

// newSuffix ends the name of a port's new-connection counter.
const newSuffix = "/new"

// CounterName is the name of the counter object of a service port's
// packets and bytes: namespace/name/port/protocol. Namespaces, names and
// port names never hold a "/", so ParseCounterName reads it back; a scrape
// needs no state besides the kernel's.
func CounterName(id model.PortID) string {
	return id.Namespace + "/" + id.Name + "/" + id.Port + "/" + string(id.Protocol)
}

// ParseCounterName returns the port a counter belongs to and whether it
// counts new connections (else packets and bytes); ok is false for a
// name CounterName does not make.
func ParseCounterName(s string) (id model.PortID, isNew, ok bool) {
	s, isNew = strings.CutSuffix(s, newSuffix)
	parts := strings.Split(s, "/")
	if len(parts) != 4 || parts[0] == "" || parts[1] == "" || parts[3] == "" {
		return model.PortID{}, false, false
	}
	return model.PortID{Namespace: parts[0], Name: parts[1], Port: parts[2], Protocol: model.Protocol(parts[3])}, isNew, true
}

// opKind is what one op does.
type opKind uint8

const (
	opReset      opKind = iota // (re)create the empty table with its maps and chains
	opAddCounter               // add the two counters of a port
	opDelCounter               // delete them
	opAddElem                  // add a key -> counter element to a map (and its -new twin)
	opDelElem                  // delete a key from a map (and its -new twin)
)

// op is one change of a family's table, in the order it must be applied.
type op struct {
	kind    opKind
	counter string // CounterName of the port
	key     key    // for elements
}

// key is one element key: a frontend (addr valid) or a NodePort.
type key struct {
	addr  netip.Addr
	proto model.Protocol
	port  uint16
}

// mapName is the map key belongs in (the packet and byte counters; the
// new-connection map is its name + "-new").
func (k key) mapName() string {
	if k.addr.IsValid() {
		return mapFrontends
	}
	return mapNodePorts
}

func (k key) String() string {
	s := fmt.Sprintf("%s . %d", strings.ToLower(string(k.proto)), k.port)
	if k.addr.IsValid() {
		s = k.addr.String() + " . " + s
	}
	return s
}

// bytes is the key as the kernel compares it: each field of the
// concatenation in its own 4-byte register (the address in 4 or 16 bytes,
// the protocol number in one, the port in two, network order).
func (k key) bytes() []byte {
	var b []byte
	if k.addr.IsValid() {
		b = k.addr.AsSlice()
	}
	b = append(b, protoNumber(k.proto), 0, 0, 0)
	b = binary.BigEndian.AppendUint16(b, k.port)
	return append(b, 0, 0)
}

// protoNumber is the IP protocol number of a Service protocol.
func protoNumber(p model.Protocol) byte {
	switch p {
	case model.UDP:
		return 17
	case model.SCTP:
		return 132
	}
	return 6
}

func (o op) String() string {
	switch o.kind {
	case opReset:
		return "reset table"
	case opAddCounter:
		return "add counters " + o.counter
	case opDelCounter:
		return "delete counters " + o.counter
	case opAddElem:
		return fmt.Sprintf("add element %s { %s : %s }", o.key.mapName(), o.key, o.counter)
	case opDelElem:
		return fmt.Sprintf("delete element %s { %s }", o.key.mapName(), o.key)
	}
	return "?"
}

// keysOf lists the element keys of a service port: its ClusterIP, external
// IPs and load-balancer IPs at the port, and its NodePort.
func keysOf(sp *model.ServicePort) []key {
	var out []key
	add := func(a netip.Addr) {
		if a.IsValid() {
			out = append(out, key{addr: a.Unmap(), proto: sp.Protocol, port: sp.Port})
		}
	}
	add(sp.ClusterIP)
	for _, a := range sp.ExternalIPs {
		add(a)
	}
	for _, a := range sp.LoadBalancerIPs {
		add(a)
	}
	if sp.NodePort != 0 {
		out = append(out, key{proto: sp.Protocol, port: sp.NodePort})
	}
	return out
}
