//go:build e2e

package bench

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// bareWatcher watches the probe EndpointSlice the way any API client would
// and notes when each resourceVersion arrives: the floor under every
// proxy's change latency (API server write, etcd, watch delivery), so that
// the report can tell the proxy's own share from the API server's.
type bareWatcher struct {
	mu      sync.Mutex
	arrived map[string]time.Time
	cancel  context.CancelFunc
	done    chan struct{}
}

// watchProbeSlice starts watching the probe slice from resourceVersion rv.
func watchProbeSlice(ctx context.Context, c kubernetes.Interface, rv string) (*bareWatcher, error) {
	ctx, cancel := context.WithCancel(ctx)
	w, err := c.DiscoveryV1().EndpointSlices(benchNS).Watch(ctx, metav1.ListOptions{
		FieldSelector: "metadata.name=probe-1", ResourceVersion: rv,
	})
	if err != nil {
		cancel()
		return nil, err
	}
	b := &bareWatcher{arrived: map[string]time.Time{}, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(b.done)
		defer w.Stop()
		for ev := range w.ResultChan() {
			now := time.Now()
			if ev.Type != watch.Modified && ev.Type != watch.Added {
				continue
			}
			obj, err := meta.Accessor(ev.Object)
			if err != nil {
				continue
			}
			b.mu.Lock()
			b.arrived[obj.GetResourceVersion()] = now
			b.mu.Unlock()
		}
	}()
	return b, nil
}

// arrival returns when resourceVersion rv reached the watcher, waiting up
// to bound for it.
func (b *bareWatcher) arrival(rv string, bound time.Duration) (time.Time, bool) {
	deadline := time.Now().Add(bound)
	for {
		b.mu.Lock()
		t, ok := b.arrived[rv]
		b.mu.Unlock()
		if ok || time.Now().After(deadline) {
			return t, ok
		}
		time.Sleep(time.Millisecond)
	}
}

func (b *bareWatcher) stop() {
	b.cancel()
	<-b.done
}
