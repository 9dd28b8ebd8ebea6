package api

import (
	"reflect"
	"testing"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/kproxy/kproxy/internal/objects"
)

// viaObject is what the informer cached before decodeSliceWire: the
// generated Unmarshal, then slimSlice.
func viaObject(data []byte) (any, error) {
	es := &discoveryv1.EndpointSlice{}
	if err := es.Unmarshal(data); err != nil {
		return nil, err
	}
	return slimSlice(es)
}

// fullSlice has every field kproxy reads, and many it does not.
func fullSlice() *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: "web-abcde", Namespace: "shop", ResourceVersion: "4711", UID: "u-1", Generation: 3,
			GenerateName: "web-", CreationTimestamp: metav1.Unix(1700000000, 0),
			Labels: map[string]string{
				objects.LabelServiceName:                 "web",
				"endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
			},
			Annotations:     map[string]string{objects.AnnotationTriggerTime: "2026-11-23T16:00:00Z", "other": "x"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: "web", UID: "s-1", Controller: ptr.To(true)}},
			Finalizers:      []string{"f"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate,
				APIVersion: "discovery.k8s.io/v1", FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(`{"f:endpoints":{}}`)}},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{
			{
				Addresses:          []string{"198.18.17.10", "198.18.17.11"},
				Conditions:         discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
				Hostname:           ptr.To("pod-a"),
				TargetRef:          &corev1.ObjectReference{Kind: "Pod", Namespace: "shop", Name: "pod-a", UID: "p-1"},
				DeprecatedTopology: map[string]string{"a": "b"},
				NodeName:           ptr.To("node1"),
				Zone:               ptr.To("zone-a"),
				Hints: &discoveryv1.EndpointHints{
					ForZones: []discoveryv1.ForZone{{Name: "zone-a"}, {Name: "zone-b"}},
					ForNodes: []discoveryv1.ForNode{{Name: "node1"}},
				},
			},
			{Addresses: []string{"198.18.18.10"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false)}},
			{Addresses: []string{"198.18.18.11"}, Hints: &discoveryv1.EndpointHints{}},
			{},
		},
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](8080), AppProtocol: ptr.To("http")},
			{Name: ptr.To(""), Protocol: ptr.To(corev1.ProtocolUDP), Port: ptr.To[int32](53)},
			{},
		},
	}
}

// A list's decoder decodes as decodeSliceWire does, and two slices of one
// list share their repeated strings; the slice's own names are not kept.
func TestSliceDecoderInterns(t *testing.T) {
	data, err := fullSlice().Marshal()
	if err != nil {
		t.Fatal(err)
	}
	want, err := decodeSliceWire(data)
	if err != nil {
		t.Fatal(err)
	}
	dec := newSliceDecoder()
	var got [2]*objects.EndpointSlice
	for i := range got {
		e, err := dec(data)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(e, want) {
			t.Fatalf("decoded =\n%#v\nwant\n%#v", e, want)
		}
		got[i] = e.(*entry).obj.(*objects.EndpointSlice)
	}
	same := func(a, b string) bool { return unsafe.StringData(a) == unsafe.StringData(b) }
	a, b := got[0], got[1]
	ea, eb := a.Endpoints[0], b.Endpoints[0]
	for what, shared := range map[string]bool{
		"node name":     same(ea.NodeName, eb.NodeName),
		"zone hint":     same(ea.Hints.Zones[0], eb.Hints.Zones[0]),
		"port name":     same(a.Ports[0].Name, b.Ports[0].Name),
		"protocol":      same(a.Ports[0].Protocol, b.Ports[0].Protocol),
		"address type":  same(a.AddressType, b.AddressType),
		"slice name":    !same(a.Name, b.Name),
		"first address": !same(ea.Address, eb.Address),
	} {
		if !shared {
			t.Errorf("%s: interned wrongly", what)
		}
	}
}

func TestDecodeSliceWire(t *testing.T) {
	tests := map[string]func(*discoveryv1.EndpointSlice){
		"full":               func(*discoveryv1.EndpointSlice) {},
		"headless":           func(es *discoveryv1.EndpointSlice) { es.Labels[objects.LabelHeadless] = "" },
		"no service label":   func(es *discoveryv1.EndpointSlice) { delete(es.Labels, objects.LabelServiceName) },
		"FQDN":               func(es *discoveryv1.EndpointSlice) { es.AddressType = discoveryv1.AddressTypeFQDN },
		"IPv6":               func(es *discoveryv1.EndpointSlice) { es.AddressType = discoveryv1.AddressTypeIPv6 },
		"no endpoints":       func(es *discoveryv1.EndpointSlice) { es.Endpoints = nil },
		"no ports":           func(es *discoveryv1.EndpointSlice) { es.Ports = nil },
		"no annotations":     func(es *discoveryv1.EndpointSlice) { es.Annotations = nil },
		"empty service name": func(es *discoveryv1.EndpointSlice) { es.Labels[objects.LabelServiceName] = "" },
	}
	for name, mutate := range tests {
		t.Run(name, func(t *testing.T) {
			es := fullSlice()
			mutate(es)
			data, err := es.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			want, err := viaObject(data)
			if err != nil {
				t.Fatal(err)
			}
			got, err := decodeSliceWire(data)
			if err != nil {
				t.Fatalf("decodeSliceWire: %v", err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("decodeSliceWire =\n%#v\nwant\n%#v", got, want)
			}
			// The cache keeps the lists: no room left over by append.
			if es, ok := got.(*entry).obj.(*objects.EndpointSlice); ok {
				if cap(es.Endpoints) != len(es.Endpoints) || cap(es.Ports) != len(es.Ports) {
					t.Errorf("endpoints %d of capacity %d, ports %d of capacity %d", len(es.Endpoints), cap(es.Endpoints), len(es.Ports), cap(es.Ports))
				}
			}
		})
	}
}

func TestDecodeSliceWireErrors(t *testing.T) {
	data, err := fullSlice().Marshal()
	if err != nil {
		t.Fatal(err)
	}
	for cut := 1; cut < len(data); cut += 7 {
		if _, err := viaObject(data[:cut]); err == nil {
			continue // a cut at a field boundary is a valid, shorter slice
		}
		if _, err := decodeSliceWire(data[:cut]); err == nil {
			t.Errorf("a slice cut at %d of %d bytes decoded without error", cut, len(data))
		}
	}
	// A known field with the wrong wire type: addressType (4) as a varint.
	const varint = 0 // wire type
	if _, err := decodeSliceWire([]byte{4<<3 | varint, 1}); err == nil {
		t.Error("addressType as a varint decoded without error")
	}
}

// FuzzDecodeSliceWire builds slices from the fuzzer's values, encodes them
// as the API server does and checks that the direct decoding gives the
// entry the generated Unmarshal and slimSlice give.
func FuzzDecodeSliceWire(f *testing.F) {
	f.Add("web", "web-1", "IPv4", "198.18.17.10", uint8(7), "node1", "zone-a", "zone-a", "http", int32(8080), "TCP", "2026-11-23T16:00:00Z", uint8(3), false)
	f.Add("", "x", "IPv6", "fd00::1", uint8(0), "", "", "", "", int32(0), "", "", uint8(0), true)
	f.Fuzz(func(t *testing.T, svc, name, addrType, addr string, conds uint8, node, zone, hint, portName string, port int32, proto, trigger string, n uint8, headless bool) {
		es := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: "ns", ResourceVersion: "1", Labels: map[string]string{objects.LabelServiceName: svc}},
			AddressType: discoveryv1.AddressType(addrType),
		}
		if headless {
			es.Labels[objects.LabelHeadless] = ""
		}
		if trigger != "" {
			es.Annotations = map[string]string{objects.AnnotationTriggerTime: trigger}
		}
		cond := func(bit uint8) *bool { // two bits: absent, true, false
			switch (conds >> bit) & 3 {
			case 1:
				return ptr.To(true)
			case 2:
				return ptr.To(false)
			}
			return nil
		}
		for i := range int(n % 5) {
			ep := discoveryv1.Endpoint{
				Addresses:  []string{addr},
				Conditions: discoveryv1.EndpointConditions{Ready: cond(0), Serving: cond(2), Terminating: cond(4)},
			}
			if i%2 == 0 {
				ep.NodeName, ep.Zone = ptr.To(node), ptr.To(zone)
				ep.Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: hint}}}
			}
			es.Endpoints = append(es.Endpoints, ep)
			es.Ports = append(es.Ports, discoveryv1.EndpointPort{Name: ptr.To(portName), Port: ptr.To(port + int32(i)), Protocol: ptr.To(corev1.Protocol(proto))})
		}
		data, err := es.Marshal()
		if err != nil {
			t.Skip()
		}
		want, err := viaObject(data)
		if err != nil {
			t.Fatalf("Unmarshal of a marshalled slice: %v", err)
		}
		got, err := decodeSliceWire(data)
		if err != nil {
			t.Fatalf("decodeSliceWire: %v", err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("decodeSliceWire =\n%#v\nwant\n%#v", got, want)
		}
	})
}

// FuzzDecodeSliceWireBytes feeds arbitrary bytes: no panic, and whenever
// both decoders accept the input they agree.
func FuzzDecodeSliceWireBytes(f *testing.F) {
	data, err := fullSlice().Marshal()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(data)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := decodeSliceWire(data)
		want, werr := viaObject(data)
		if err != nil || werr != nil {
			return
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("decodeSliceWire =\n%#v\nwant\n%#v", got, want)
		}
	})
}
