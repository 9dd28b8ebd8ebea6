package api

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	apiwatch "k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
)

// listWatch lists and watches one resource of rc's API group as client-go's
// typed clients do: a list decodes the whole response into the typed list,
// and the informer's transform slims each item before it is cached. Against
// an API server that serves watch-list (kube-apiserver v1.34+ in front of
// etcd 3.4.31+ or 3.5.13+) client-go's reflector never calls list: the
// initial objects arrive as watch events.
type listWatch struct {
	rc       rest.Interface
	resource string
}

func (l listWatch) list(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
	return l.request(&opts).Do(ctx).Get()
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
