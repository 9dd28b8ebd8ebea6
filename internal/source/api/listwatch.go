package api

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	apiwatch "k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
)

// listWatch lists and watches one resource of rc's API group. With an item
// decoder (Services and EndpointSlices) a protobuf list response is decoded
// item by item and each item slimmed at once (stream.go); any other response
// (JSON, or a kind without a decoder: the Node, the ServiceCIDRs) is decoded
// whole, as client-go's typed clients do, and the informer's transform slims
// it. Whether the informers list at all is client-go's WatchListClient gate
// (features.go): with it on, against an API server that serves watch-list,
// the initial objects arrive as watch events and list is not called.
type listWatch struct {
	rc       rest.Interface
	resource string
	items    itemDecoder
}

func (l listWatch) list(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
	if l.items == nil {
		return l.request(&opts).Do(ctx).Get()
	}
	body, err := l.request(&opts).Stream(ctx)
	if err != nil {
		return nil, err
	}
	defer body.Close()
	r := bufio.NewReaderSize(body, 64<<10)
	if head, err := r.Peek(len(protoMagic)); err == nil && bytes.Equal(head, protoMagic) {
		out, err := decodeProtoList(r, l.items)
		if err != nil {
			return nil, fmt.Errorf("decoding the %s list: %w", l.resource, err)
		}
		return out, nil
	}
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("reading the %s list: %w", l.resource, err)
	}
	return runtime.Decode(apiCodecs.UniversalDeserializer(), data)
}

func (l listWatch) watch(ctx context.Context, opts metav1.ListOptions) (apiwatch.Interface, error) {
	opts.Watch = true
	return l.request(&opts).Watch(ctx)
}

// request is a GET of l's resource with opts, bounded by opts' timeout as
// client-go's typed clients bound theirs.
func (l listWatch) request(opts *metav1.ListOptions) *rest.Request {
	req := l.rc.Get().Resource(l.resource).VersionedParams(opts, paramCodec)
	if opts.TimeoutSeconds != nil {
		req = req.Timeout(time.Duration(*opts.TimeoutSeconds) * time.Second)
	}
	return req
}
