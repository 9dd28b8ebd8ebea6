package api

import (
	"bufio"
	"bytes"
	"fmt"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/cache"

	"github.com/kproxy/kproxy/internal/objects"
)

// encodeProto encodes obj as the API server does for a protobuf client.
func encodeProto(t testing.TB, obj runtime.Object, gv schema.GroupVersion) []byte {
	t.Helper()
	ps := protobuf.NewSerializer(scheme.Scheme, scheme.Scheme)
	data, err := runtime.Encode(scheme.Codecs.EncoderForVersion(ps, gv), obj)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// slimList is what a list decoded whole becomes once the informer's
// transform has slimmed every item: what a streamed list must equal.
func slimList(typed runtime.Object, transform cache.TransformFunc) (*entryList, error) {
	lm, err := meta.ListAccessor(typed)
	if err != nil {
		return nil, err
	}
	out := &entryList{ListMeta: metav1.ListMeta{
		ResourceVersion: lm.GetResourceVersion(), Continue: lm.GetContinue(), RemainingItemCount: lm.GetRemainingItemCount(),
	}}
	err = meta.EachListItem(typed, func(o runtime.Object) error {
		e, err := transform(o)
		if err != nil {
			return err
		}
		out.Items = append(out.Items, e.(runtime.Object))
		return nil
	})
	return out, err
}

func serviceList(n int) *corev1.ServiceList {
	l := &corev1.ServiceList{ListMeta: metav1.ListMeta{ResourceVersion: "42", Continue: "next"}}
	for i := range n {
		svc := service(fmt.Sprintf("s%d", i), fmt.Sprintf("198.18.128.%d", i%250+1))
		svc.ResourceVersion = fmt.Sprint(i + 1)
		svc.Annotations = map[string]string{"big": strings.Repeat("x", i*100)}
		l.Items = append(l.Items, *svc)
	}
	l.Items = append(l.Items, *service("headless", "None"))
	return l
}

// The streamed protobuf decode yields what the whole decode plus the
// transform yields.
func TestDecodeProtoListMatchesFullDecode(t *testing.T) {
	for _, n := range []int{0, 1, 300} {
		list := serviceList(n)
		data := encodeProto(t, list, corev1.SchemeGroupVersion)
		got, err := decodeProtoList(bufio.NewReader(bytes.NewReader(data)), decodeService)
		if err != nil {
			t.Fatalf("%d items: %v", n, err)
		}
		want, err := slimList(list, slimService)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%d items: streamed list differs from the full decode:\n got %+v\nwant %+v", n, got.ListMeta, want.ListMeta)
		}
		if len(got.Items) != n+1 || got.ResourceVersion != "42" || got.Continue != "next" {
			t.Errorf("%d items: got %d items, meta %+v", n, len(got.Items), got.ListMeta)
		}
	}
}

func TestDecodeProtoListSlices(t *testing.T) {
	list := &discoveryv1.EndpointSliceList{ListMeta: metav1.ListMeta{ResourceVersion: "7"},
		Items: []discoveryv1.EndpointSlice{*endpointSlice("a-1", "a"), *endpointSlice("h-1", "h", objects.LabelHeadless)}}
	data := encodeProto(t, list, discoveryv1.SchemeGroupVersion)
	got, err := decodeProtoList(bufio.NewReader(bytes.NewReader(data)), decodeSlice)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := slimList(list, slimSlice)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if len(got.Items) != 2 || got.Items[0].(*entry).obj == nil || got.Items[1].(*entry).obj != nil {
		t.Errorf("want the proxied slice slim and the headless one a marker, got %+v", got.Items)
	}
}

// A truncated or empty body is an error, never a shorter list.
func TestDecodeProtoListErrors(t *testing.T) {
	data := encodeProto(t, serviceList(20), corev1.SchemeGroupVersion)
	for _, cut := range []int{len(protoMagic) + 1, len(data) / 2, len(data) - 1} {
		if _, err := decodeProtoList(bufio.NewReader(bytes.NewReader(data[:cut])), decodeService); err == nil {
			t.Errorf("a body cut at %d of %d decoded", cut, len(data))
		}
	}
	if _, err := decodeProtoList(bufio.NewReader(bytes.NewReader(protoMagic)), decodeService); err == nil {
		t.Errorf("an empty envelope decoded")
	}
}

// FuzzDecodeProtoList: any body either decodes or fails; it never panics
// or allocates past maxItemBytes for one item.
func FuzzDecodeProtoList(f *testing.F) {
	f.Add(encodeProto(f, serviceList(3), corev1.SchemeGroupVersion))
	f.Add(encodeProto(f, &discoveryv1.EndpointSliceList{Items: []discoveryv1.EndpointSlice{*endpointSlice("a-1", "a")}}, discoveryv1.SchemeGroupVersion))
	f.Add(append([]byte(nil), protoMagic...))
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, dec := range []itemDecoder{decodeService, decodeSlice} {
			l, err := decodeProtoList(bufio.NewReader(bytes.NewReader(data)), dec)
			if err == nil && l == nil {
				t.Fatal("no error and no list")
			}
		}
	})
}
