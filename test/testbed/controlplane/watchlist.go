package controlplane

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
)

// EtcdServesWatchList reports whether kube-apiserver v1.36 serves
// watch-list requests in front of etcd of version v ("3.6.8"). It needs
// etcd's progress notifications (its RequestWatchProgress storage
// feature), which it uses only from etcd 3.4.31 in the 3.4 line and 3.5.13
// on (k8s.io/apiserver/pkg/storage/feature); without them it answers a
// watch-list request with an error event and clients list instead.
func EtcdServesWatchList(v string) bool {
	var n [3]int
	parts := strings.SplitN(strings.TrimPrefix(v, "v"), ".", 3)
	if len(parts) != 3 {
		return false
	}
	for i, p := range parts {
		p, _, _ = strings.Cut(p, "-")
		x, err := strconv.Atoi(p)
		if err != nil {
			return false
		}
		n[i] = x
	}
	switch {
	case n[0] != 3:
		return n[0] > 3
	case n[1] == 4:
		return n[2] >= 31
	case n[1] == 5:
		return n[2] >= 13
	default:
		return n[1] > 5
	}
}

// ServesWatchList sends the API server a watch-list request for
// EndpointSlices, as client-go's reflectors do before any LIST (a watch
// with sendInitialEvents=true, resourceVersionMatch=NotOlderThan and
// bookmarks), and reports whether it was served: the initial objects and
// then the bookmark that ends them. When the server refuses, reason is the
// message of its error event.
func (cp *ControlPlane) ServesWatchList(ctx context.Context) (served bool, reason string, err error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	w, err := cp.Client.DiscoveryV1().EndpointSlices("").Watch(ctx, metav1.ListOptions{
		SendInitialEvents:    ptr.To(true),
		ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan,
		AllowWatchBookmarks:  true,
	})
	if err != nil {
		return false, "", fmt.Errorf("controlplane: watch-list request: %w", err)
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return false, "", fmt.Errorf("controlplane: watch-list request: no end of the initial events: %w", ctx.Err())
		case ev, ok := <-w.ResultChan():
			if !ok {
				return false, "", fmt.Errorf("controlplane: watch-list request: the watch ended before the initial events did")
			}
			switch ev.Type {
			case watch.Error:
				if st, ok := ev.Object.(*metav1.Status); ok {
					return false, st.Message, nil
				}
				return false, fmt.Sprint(ev.Object), nil
			case watch.Bookmark:
				if m, ok := ev.Object.(metav1.Object); ok && m.GetAnnotations()[metav1.InitialEventsAnnotationKey] == "true" {
					return true, "", nil
				}
			}
		}
	}
}

// Metrics returns the API server's /metrics (Prometheus text), read as the
// admin.
func (cp *ControlPlane) Metrics(ctx context.Context) (string, error) {
	b, err := cp.Client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return "", fmt.Errorf("controlplane: GET /metrics: %w", err)
	}
	return string(b), nil
}
