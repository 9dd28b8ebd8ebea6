package api

import (
	"context"
	"fmt"
	"hash/fnv"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/objects"
)

// eventQueue bounds the Events waiting to be written; more are dropped
// (the log line the daemon writes for each problem stays).
const eventQueue = 100

// eventTimeout bounds one Event write.
const eventTimeout = 10 * time.Second

// Events writes Warning Events about Services (core/v1, so that `kubectl
// describe service` lists them), from one goroutine started with the
// first Event: a slow or unreachable API server never holds up a sync.
// Each node reports what it skips, as kubelets do; an Event's name is a
// hash of the Service, node, reason and message, so a restarted kproxy
// does not write the same Event again.
type Events struct {
	c    *Client
	node string
	// instance is the reporting instance of the Events kproxy writes as
	// kube-proxy: "kube-proxy-" and the host's name (not the node name),
	// as upstream's event recorder names it.
	instance string
	logger   klog.Logger
	queue    chan *corev1.Event
	start    chan struct{}
}

// NewEvents returns an Event writer reporting as node.
func NewEvents(c *Client, node string, logger klog.Logger) *Events {
	host, err := os.Hostname()
	if err != nil {
		host = node
	}
	e := &Events{c: c, node: node, instance: nodeEventController + "-" + host, logger: logger,
		queue: make(chan *corev1.Event, eventQueue), start: make(chan struct{}, 1)}
	e.start <- struct{}{}
	return e
}

// ServiceWarning queues a Warning Event on the Service key (uid its
// metadata.uid) with reason (CamelCase) and message.
func (e *Events) ServiceWarning(key objects.Key, uid, reason, message string) {
	now := metav1.Now()
	e.enqueue(&corev1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: hashedName(key, uid, e.node, reason, message), Namespace: key.Namespace},
		InvolvedObject: corev1.ObjectReference{
			Kind: "Service", APIVersion: "v1", Namespace: key.Namespace, Name: key.Name, UID: types.UID(uid),
		},
		Reason: reason, Message: message, Type: corev1.EventTypeWarning,
		Source:         corev1.EventSource{Component: "kproxy", Host: e.node},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
		ReportingController: "kproxy", ReportingInstance: e.node,
	})
}

// ProxyServiceWarning queues a Warning Event on the Service key about what
// this node's proxy could not do for it, as upstream's kube-proxy records
// one (a health-check node port it could not open: reason
// FailedToStartServiceHealthcheck, action Listen): reported by kube-proxy,
// and named by a hash of the Service, node, reason and message, so that a
// failure repeated at every sync is one Event.
func (e *Events) ProxyServiceWarning(key objects.Key, reason, action, message string) {
	now := time.Now()
	e.enqueue(&corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: hashedName(key, e.node, reason, message), Namespace: key.Namespace},
		InvolvedObject: corev1.ObjectReference{Kind: "Service", APIVersion: "v1", Namespace: key.Namespace, Name: key.Name},
		Reason:         reason, Message: message, Type: corev1.EventTypeWarning, Action: action,
		EventTime:           metav1.NewMicroTime(now),
		ReportingController: nodeEventController, ReportingInstance: e.instance,
	})
}

// hashedName names a Service's Event by the Service and a hash of key and
// parts, so that the same Event written again is the same object.
func hashedName(key objects.Key, parts ...string) string {
	h := fnv.New64a()
	fmt.Fprint(h, key)
	for _, p := range parts {
		fmt.Fprintf(h, "\x00%s", p)
	}
	return fmt.Sprintf("%s.%016x", key.Name, h.Sum64())
}

// enqueue queues ev without blocking, starting the writer with the first.
func (e *Events) enqueue(ev *corev1.Event) {
	select {
	case <-e.start:
		go e.run()
	default:
	}
	select {
	case e.queue <- ev:
	default:
		e.logger.V(2).Info("Event queue full; dropping an Event", "kind", ev.InvolvedObject.Kind,
			"object", ev.InvolvedObject.Namespace+"/"+ev.InvolvedObject.Name, "reason", ev.Reason)
	}
}

// NodeEvent queues an Event on this node's Node, as upstream's kube-proxy
// records its start ("Starting", action "StartKubeProxy") and its servers'
// failures: in the default namespace, reported by kube-proxy, named
// uniquely (each start is its own Event).
func (e *Events) NodeEvent(eventType, reason, action, message string) {
	now := time.Now()
	e.enqueue(&corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", e.node, now.UnixNano()), Namespace: metav1.NamespaceDefault},
		InvolvedObject: corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: e.node},
		Reason:         reason, Message: message, Type: eventType, Action: action,
		EventTime:           metav1.NewMicroTime(now),
		ReportingController: nodeEventController, ReportingInstance: e.instance,
	})
}

// nodeEventController is who reports the Node's Events: kube-proxy, as
// tools that look for a node's proxy starting expect.
const nodeEventController = "kube-proxy"

func (e *Events) run() {
	for ev := range e.queue {
		ctx, cancel := context.WithTimeout(context.Background(), eventTimeout)
		err := e.c.core.Post().Namespace(ev.Namespace).Resource("events").Body(ev).Do(ctx).Error()
		cancel()
		if err != nil && !apierrors.IsAlreadyExists(err) {
			e.logger.Info("Could not write an Event", "kind", ev.InvolvedObject.Kind, "object", ev.InvolvedObject.Namespace+"/"+ev.InvolvedObject.Name, "reason", ev.Reason, "err", err)
		}
	}
}
