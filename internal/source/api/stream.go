package api

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"

	"google.golang.org/protobuf/encoding/protowire"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Streamed lists. client-go's typed List reads a whole response into one
// buffer and decodes every object of it into one big typed list before the
// informer's transform slims them: at 10k Services x 100 endpoints that is a
// million full endpoints alive at once. A streamed list decodes a protobuf
// response one item at a time, slims each item at once and drops the full
// object before the next one is read, so its memory is that of the slim
// entries, as a watch-list's is.

// protoMagic starts every Kubernetes protobuf message (runtime.Unknown
// envelope).
var protoMagic = []byte("k8s\x00")

// Field numbers of the messages a protobuf list response is made of.
const (
	unknownRawField             = 2 // runtime.Unknown.raw
	unknownContentEncodingField = 3 // runtime.Unknown.contentEncoding
	listMetadataField           = 1 // <Kind>List.metadata
	listItemsField              = 2 // <Kind>List.items
)

// maxItemBytes bounds one list item: a corrupt length must not make the
// decoder allocate gigabytes (the API server limits objects to ~1.5 MiB).
const maxItemBytes = 64 << 20

// entryList is what a streamed list returns to the reflector: the list's
// metadata and its items already slim.
type entryList struct {
	metav1.ListMeta
	Items []runtime.Object
}

func (l *entryList) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

func (l *entryList) DeepCopyObject() runtime.Object {
	c := *l
	l.ListMeta.DeepCopyInto(&c.ListMeta)
	c.Items = slices.Clone(l.Items)
	return &c
}

// entries implement runtime.Object so that a streamed list can hold them.
// They are never changed after the transform made them, so a shallow copy is
// a deep one.

func (e *entry) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

func (e *entry) DeepCopyObject() runtime.Object {
	c := *e
	return &c
}

// itemDecoder unmarshals one protobuf-encoded list item and returns its slim
// entry.
type itemDecoder func(data []byte) (any, error)

// decodeProtoList reads a protobuf list response (the runtime.Unknown
// envelope after the magic) from r, decoding items one by one.
func decodeProtoList(r *bufio.Reader, item itemDecoder) (*entryList, error) {
	if _, err := r.Discard(len(protoMagic)); err != nil {
		return nil, err
	}
	pr := &protoReader{r: r}
	var out *entryList
	for {
		field, n, err := pr.bytesField()
		if errors.Is(err, io.EOF) && pr.n == 0 {
			break
		}
		if err != nil {
			return nil, err
		}
		switch field {
		case unknownRawField:
			if out, err = decodeListMessage(pr, n, item); err != nil {
				return nil, err
			}
		case unknownContentEncodingField:
			if n > 0 {
				return nil, errors.New("list response has a content encoding")
			}
		default:
			if err := pr.skip(n); err != nil {
				return nil, err
			}
		}
		pr.n = 0
	}
	if out == nil {
		return nil, errors.New("list response without a list")
	}
	return out, nil
}

// decodeListMessage reads a <Kind>List message of size bytes from pr.
func decodeListMessage(pr *protoReader, size int, item itemDecoder) (*entryList, error) {
	out := &entryList{}
	var buf []byte
	for end := pr.n + size; pr.n < end; {
		field, n, err := pr.bytesField()
		if err != nil {
			return nil, unexpectedEOF(err)
		}
		if n > maxItemBytes || pr.n+n > end {
			return nil, fmt.Errorf("list field %d of %d bytes overruns the list", field, n)
		}
		switch field {
		case listMetadataField, listItemsField:
			buf = slices.Grow(buf[:0], n)[:n]
			if err := pr.full(buf); err != nil {
				return nil, err
			}
		default:
			if err := pr.skip(n); err != nil {
				return nil, err
			}
			continue
		}
		if field == listMetadataField {
			if err := out.ListMeta.Unmarshal(buf); err != nil {
				return nil, fmt.Errorf("list metadata: %w", err)
			}
			continue
		}
		e, err := item(buf)
		if err != nil {
			return nil, err
		}
		out.Items = append(out.Items, e.(runtime.Object))
	}
	return out, nil
}

// protoReader reads protobuf fields from a stream, counting the bytes it
// consumed in n.
type protoReader struct {
	r *bufio.Reader
	n int
}

func (p *protoReader) ReadByte() (byte, error) {
	b, err := p.r.ReadByte()
	if err == nil {
		p.n++
	}
	return b, err
}

// bytesField reads the next field and, for a length-delimited one, its
// length; other wire types are skipped. io.EOF means the stream ended
// cleanly before a field.
func (p *protoReader) bytesField() (field int, n int, err error) {
	for {
		tag, err := binary.ReadUvarint(p)
		if err != nil {
			return 0, 0, err
		}
		field, wire := int(tag>>3), protowire.Type(tag&7)
		switch wire {
		case protowire.BytesType:
			l, err := binary.ReadUvarint(p)
			if err != nil {
				return 0, 0, unexpectedEOF(err)
			}
			if l > 1<<40 {
				return 0, 0, fmt.Errorf("field %d length %d", field, l)
			}
			return field, int(l), nil
		case protowire.VarintType:
			if _, err := binary.ReadUvarint(p); err != nil {
				return 0, 0, unexpectedEOF(err)
			}
		case protowire.Fixed64Type:
			err = p.skip(8)
		case protowire.Fixed32Type:
			err = p.skip(4)
		default:
			return 0, 0, fmt.Errorf("field %d has unsupported wire type %d", field, wire)
		}
		if err != nil {
			return 0, 0, err
		}
	}
}

func (p *protoReader) skip(n int) error {
	d, err := p.r.Discard(n)
	p.n += d
	return unexpectedEOF(err)
}

func (p *protoReader) full(buf []byte) error {
	d, err := io.ReadFull(p.r, buf)
	p.n += d
	return unexpectedEOF(err)
}

// unexpectedEOF turns an end of stream inside a message into an error.
func unexpectedEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// decodeService and decodeSlice are the item decoders of Services and
// EndpointSlices: the generated protobuf decode, then the slim transform.

func decodeService(data []byte) (any, error) {
	svc := &corev1.Service{}
	if err := svc.Unmarshal(data); err != nil {
		return nil, fmt.Errorf("decoding a Service: %w", err)
	}
	return slimService(svc)
}

func decodeSlice(data []byte) (any, error) {
	es := &discoveryv1.EndpointSlice{}
	if err := es.Unmarshal(data); err != nil {
		return nil, fmt.Errorf("decoding an EndpointSlice: %w", err)
	}
	return slimSlice(es)
}
