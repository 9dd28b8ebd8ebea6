package api

import (
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/objects"
)

// entry is what the informer caches hold instead of API objects: the key and
// resource version the informer machinery needs, and the slim object, or nil
// for an object kproxy does not proxy (a headless or ExternalName Service, a
// Service another proxy owns, a slice of a headless Service, another Node).
// Keeping a marker instead of dropping the object lets a Service that stops
// being proxied arrive as an update, which the handler turns into a deletion.
type entry struct {
	namespace, name, resourceVersion string
	obj                              any // *objects.Service, *objects.EndpointSlice, *objects.Node, *objects.ServiceCIDR or nil
}

// GetObjectMeta lets the informer's key and index functions read the entry.
func (e *entry) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Namespace: e.namespace, Name: e.name, ResourceVersion: e.resourceVersion}
}

func (e *entry) key() objects.Key { return objects.Key{Namespace: e.namespace, Name: e.name} }

// The transforms run before an object is cached. They must be idempotent:
// an entry passes through unchanged, and so does anything unexpected (the
// handler reports it).

func slimService(obj any) (any, error) {
	svc, ok := obj.(*corev1.Service)
	if !ok {
		return obj, nil
	}
	e := &entry{namespace: svc.Namespace, name: svc.Name, resourceVersion: svc.ResourceVersion}
	if objects.ServiceProxied(svc) {
		e.obj = objects.FromService(svc)
	}
	return e, nil
}

func slimSlice(obj any) (any, error) {
	es, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return obj, nil
	}
	e := &entry{namespace: es.Namespace, name: es.Name, resourceVersion: es.ResourceVersion}
	if objects.SliceProxied(es) {
		e.obj = objects.FromEndpointSlice(es)
	}
	return e, nil
}

func (s *Source) slimNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	e := &entry{name: n.Name, resourceVersion: n.ResourceVersion}
	if n.Name == s.nodeName {
		e.obj = objects.FromNode(n)
	}
	return e, nil
}

func slimServiceCIDR(obj any) (any, error) {
	c, ok := obj.(*networkingv1.ServiceCIDR)
	if !ok {
		return obj, nil
	}
	return &entry{name: c.Name, resourceVersion: c.ResourceVersion, obj: objects.FromServiceCIDR(c)}, nil
}
