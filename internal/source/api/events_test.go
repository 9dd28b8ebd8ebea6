package api

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/objects"
)

// TestProxyServiceWarning: a health-check port that cannot be opened is a
// Warning on the Service as upstream's kube-proxy records it (reported by
// kube-proxy, action Listen, an event time), and the same failure at every
// sync is one Event name.
func TestProxyServiceWarning(t *testing.T) {
	var mu sync.Mutex
	var got []corev1.Event
	var paths []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var ev corev1.Event
		if err := json.Unmarshal(body, &ev); err != nil {
			t.Errorf("%s %s: %v", r.Method, r.URL.Path, err)
		}
		mu.Lock()
		got, paths = append(got, ev), append(paths, r.Method+" "+r.URL.Path)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(body)
	}))
	t.Cleanup(srv.Close)
	c, err := clientFor(&rest.Config{Host: srv.URL, ContentConfig: rest.ContentConfig{ContentType: "application/json"}})
	if err != nil {
		t.Fatal(err)
	}
	e := NewEvents(c, "node-a", klog.Background())
	key := objects.Key{Namespace: "ns", Name: "lb"}
	msg := `node node-a failed to start healthcheck "ns/lb" on port 30000: address already in use`
	e.ProxyServiceWarning(key, "FailedToStartServiceHealthcheck", "Listen", msg)
	e.ProxyServiceWarning(key, "FailedToStartServiceHealthcheck", "Listen", msg)
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d Events written, want 2", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	ev := got[0]
	if paths[0] != "POST /api/v1/namespaces/ns/events" {
		t.Errorf("written with %s", paths[0])
	}
	want := corev1.ObjectReference{Kind: "Service", APIVersion: "v1", Namespace: "ns", Name: "lb"}
	if ev.InvolvedObject != want {
		t.Errorf("involvedObject = %+v, want %+v", ev.InvolvedObject, want)
	}
	if ev.Type != corev1.EventTypeWarning || ev.Reason != "FailedToStartServiceHealthcheck" || ev.Action != "Listen" || ev.Message != msg {
		t.Errorf("type/reason/action/message = %q/%q/%q/%q", ev.Type, ev.Reason, ev.Action, ev.Message)
	}
	host, _ := os.Hostname()
	if ev.ReportingController != "kube-proxy" || ev.ReportingInstance != "kube-proxy-"+host || ev.EventTime.IsZero() {
		t.Errorf("reporting %q/%q, event time %v", ev.ReportingController, ev.ReportingInstance, ev.EventTime)
	}
	if got[1].Name != ev.Name || ev.Namespace != "ns" {
		t.Errorf("names %q and %q in %q: a repeated failure must be one Event", ev.Name, got[1].Name, ev.Namespace)
	}
}
