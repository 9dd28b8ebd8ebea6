package api

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/kproxy/kproxy/internal/objects"
)

// decodeSliceWire reads one EndpointSlice of a protobuf list straight into
// its cache entry, the same entry slimSlice makes of the decoded object. It
// builds no discoveryv1.EndpointSlice: no managed fields, no label and
// annotation maps, no pointer per condition. At 10k slices of 10 endpoints
// the decoded objects were ~30 MB of garbage during the cold start, and on
// this kind of machine every freshly touched page costs 10-30 us.
//
// Field numbers are those of k8s.io/api/discovery/v1 and meta/v1
// generated.proto. Semantics follow the generated Unmarshal: a repeated
// message field merges, the last scalar wins, map entries default missing
// keys and values to "". Fields kproxy does not read are skipped
// (FuzzDecodeSliceWire checks the result against Unmarshal + slimSlice).
func decodeSliceWire(data []byte) (any, error) { return decodeSlice(data, nil) }

// newSliceDecoder returns the decoder of one list's slices: decodeSliceWire
// that keeps one copy of each node name, hint, port name, protocol
// and address type the list repeats. At 10k slices of 10 endpoints on two
// nodes that is 200k fewer strings (~1 MB) kept; with real node names,
// longer than the tiny allocator's 16 bytes, several times that.
func newSliceDecoder() itemDecoder {
	in := &interner{m: map[string]string{}}
	return func(data []byte) (any, error) { return decodeSlice(data, in) }
}

func decodeSlice(data []byte, in *interner) (any, error) {
	s := sliceWire{in: in}
	if err := s.slice(data); err != nil {
		return nil, fmt.Errorf("decoding an EndpointSlice: %w", err)
	}
	e := &entry{namespace: s.out.Namespace, name: s.out.Name, resourceVersion: s.out.ResourceVersion}
	if objects.SliceFieldsProxied(s.headless, s.out.ServiceName, s.out.AddressType) {
		out := s.out
		e.obj = &out
	}
	return e, nil
}

// sliceWire accumulates one slice while its fields are read.
type sliceWire struct {
	out      objects.EndpointSlice
	headless bool      // the headless label is present
	in       *interner // nil: no interning
}

// maxInterned bounds an interner: past it, strings are no longer shared.
const maxInterned = 1 << 14

// interner hands out one string per distinct value it has seen. A nil
// interner makes a new string each time.
type interner struct{ m map[string]string }

// str is the package's str, through the interner.
func (in *interner) str(typ protowire.Type, v []byte) (string, error) {
	if in == nil || typ != protowire.BytesType {
		return str(typ, v)
	}
	if s, ok := in.m[string(v)]; ok {
		return s, nil
	}
	s := string(v)
	if len(in.m) < maxInterned {
		in.m[s] = s
	}
	return s, nil
}

var errWireType = errors.New("unexpected wire type")

// eachField calls fn for each field of msg with its number, wire type and
// value (bytes: the payload; varint: n). Fields of other wire types are
// consumed whole; fn ignores the numbers it does not read.
func eachField(msg []byte, fn func(num protowire.Number, typ protowire.Type, v []byte, n uint64) error) error {
	for len(msg) > 0 {
		num, typ, tagLen := protowire.ConsumeTag(msg)
		if tagLen < 0 {
			return protowire.ParseError(tagLen)
		}
		msg = msg[tagLen:]
		var val []byte
		var n uint64
		size := 0
		switch typ {
		case protowire.BytesType:
			val, size = protowire.ConsumeBytes(msg)
		case protowire.VarintType:
			n, size = protowire.ConsumeVarint(msg)
		default:
			size = protowire.ConsumeFieldValue(num, typ, msg)
		}
		if size < 0 {
			return protowire.ParseError(size)
		}
		msg = msg[size:]
		if err := fn(num, typ, val, n); err != nil {
			return fmt.Errorf("field %d: %w", num, err)
		}
	}
	return nil
}

// str returns a bytes field as a string, or an error for another wire type.
func str(typ protowire.Type, v []byte) (string, error) {
	if typ != protowire.BytesType {
		return "", errWireType
	}
	return string(v), nil
}

// sub checks that a field is a nested message.
func sub(typ protowire.Type) error {
	if typ != protowire.BytesType {
		return errWireType
	}
	return nil
}

func (s *sliceWire) slice(msg []byte) error {
	// The cache keeps these lists: size them exactly (append's doubling
	// left 16 places for 10 endpoints, 60 % more memory at 10k slices).
	var nEndpoints, nPorts int
	if err := eachField(msg, func(num protowire.Number, _ protowire.Type, _ []byte, _ uint64) error {
		switch num {
		case 2:
			nEndpoints++
		case 3:
			nPorts++
		}
		return nil
	}); err != nil {
		return err
	}
	if nEndpoints > 0 {
		s.out.Endpoints = make([]objects.Endpoint, 0, nEndpoints)
	}
	if nPorts > 0 {
		s.out.Ports = make([]objects.EndpointPort, 0, nPorts)
	}
	return eachField(msg, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		var err error
		switch num {
		case 1: // metadata
			if err = sub(typ); err == nil {
				err = s.meta(v)
			}
		case 2: // endpoints
			if err = sub(typ); err == nil {
				var ep objects.Endpoint
				if err = endpointWire(&ep, v, s.in); err == nil {
					s.out.Endpoints = append(s.out.Endpoints, ep)
				}
			}
		case 3: // ports
			if err = sub(typ); err == nil {
				var p objects.EndpointPort
				if err = portWire(&p, v, s.in); err == nil {
					s.out.Ports = append(s.out.Ports, p)
				}
			}
		case 4: // addressType
			s.out.AddressType, err = s.in.str(typ, v)
		default:
			return nil
		}
		return err
	})
}

// meta reads ObjectMeta: name, namespace, resourceVersion, the labels and
// the annotation kproxy reads.
func (s *sliceWire) meta(msg []byte) error {
	return eachField(msg, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		var err error
		switch num {
		case 1:
			s.out.Name, err = str(typ, v)
		case 3:
			s.out.Namespace, err = str(typ, v)
		case 6:
			s.out.ResourceVersion, err = str(typ, v)
		case 11, 12: // labels, annotations
			if err = sub(typ); err != nil {
				break
			}
			var k, val string
			if k, val, err = mapEntry(v); err != nil {
				break
			}
			switch {
			case num == 11 && k == objects.LabelServiceName:
				s.out.ServiceName = val
			case num == 11 && k == objects.LabelHeadless:
				s.headless = true
			case num == 12 && k == objects.AnnotationTriggerTime:
				s.out.TriggerTime = val
			}
		default:
			return nil
		}
		return err
	})
}

// mapEntry reads a map<string, string> entry.
func mapEntry(msg []byte) (key, value string, err error) {
	err = eachField(msg, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		var err error
		switch num {
		case 1:
			key, err = str(typ, v)
		case 2:
			value, err = str(typ, v)
		default:
			return nil
		}
		return err
	})
	return key, value, err
}

func endpointWire(ep *objects.Endpoint, msg []byte, in *interner) error {
	return eachField(msg, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		var err error
		switch num {
		case 1: // addresses: the first is the one used
			var a string
			if a, err = str(typ, v); err == nil && !ep.HasAddress {
				ep.Address, ep.HasAddress = a, true
			}
		case 2: // conditions
			if err = sub(typ); err == nil {
				err = conditionsWire(ep, v)
			}
		case 6: // nodeName
			ep.NodeName, err = in.str(typ, v)
		case 8: // hints
			if err = sub(typ); err == nil {
				h := ep.Hints
				if h == nil {
					h = &objects.Hints{}
				}
				if err = hintsWire(&h.Zones, &h.Nodes, v, in); err == nil && len(h.Zones)+len(h.Nodes) > 0 {
					ep.Hints = h
				}
			}
		default:
			return nil
		}
		return err
	})
}

func conditionsWire(ep *objects.Endpoint, msg []byte) error {
	return eachField(msg, func(num protowire.Number, typ protowire.Type, _ []byte, n uint64) error {
		var dst *objects.Cond
		switch num {
		case 1:
			dst = &ep.Ready
		case 2:
			dst = &ep.Serving
		case 3:
			dst = &ep.Terminating
		default:
			return nil
		}
		if typ != protowire.VarintType {
			return errWireType
		}
		*dst = objects.CondFalse
		if n != 0 {
			*dst = objects.CondTrue
		}
		return nil
	})
}

// hintsWire reads EndpointHints: forZones and forNodes, each a message
// whose field 1 is the name.
func hintsWire(zones, nodes *[]string, msg []byte, in *interner) error {
	return eachField(msg, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		var dst *[]string
		switch num {
		case 1:
			dst = zones
		case 2:
			dst = nodes
		default:
			return nil
		}
		if err := sub(typ); err != nil {
			return err
		}
		var name string
		err := eachField(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
			if num != 1 {
				return nil
			}
			var err error
			name, err = in.str(typ, v)
			return err
		})
		*dst = append(*dst, name)
		return err
	})
}

func portWire(p *objects.EndpointPort, msg []byte, in *interner) error {
	return eachField(msg, func(num protowire.Number, typ protowire.Type, v []byte, n uint64) error {
		var err error
		switch num {
		case 1:
			p.Name, err = in.str(typ, v)
		case 2:
			p.Protocol, err = in.str(typ, v)
		case 3:
			if typ != protowire.VarintType {
				return errWireType
			}
			p.Port = int32(n)
		default:
			return nil
		}
		return err
	})
}
