package api

import (
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

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

// An entry is a metav1.Object, so the informer's key and index functions read
// it without allocating (they run several times per object: an
// ObjectMetaAccessor that built an ObjectMeta per call allocated 15 MB during
// a 10k Services cold start). It has only a namespace, a name and a resource
// version; everything else reads as empty, and setting it changes nothing.

var _ metav1.Object = (*entry)(nil)

func (e *entry) GetNamespace() string                          { return e.namespace }
func (e *entry) SetNamespace(ns string)                        { e.namespace = ns }
func (e *entry) GetName() string                               { return e.name }
func (e *entry) SetName(name string)                           { e.name = name }
func (e *entry) GetResourceVersion() string                    { return e.resourceVersion }
func (e *entry) SetResourceVersion(v string)                   { e.resourceVersion = v }
func (e *entry) GetGenerateName() string                       { return "" }
func (e *entry) SetGenerateName(string)                        {}
func (e *entry) GetUID() types.UID                             { return "" }
func (e *entry) SetUID(types.UID)                              {}
func (e *entry) GetGeneration() int64                          { return 0 }
func (e *entry) SetGeneration(int64)                           {}
func (e *entry) GetSelfLink() string                           { return "" }
func (e *entry) SetSelfLink(string)                            {}
func (e *entry) GetCreationTimestamp() metav1.Time             { return metav1.Time{} }
func (e *entry) SetCreationTimestamp(metav1.Time)              {}
func (e *entry) GetDeletionTimestamp() *metav1.Time            { return nil }
func (e *entry) SetDeletionTimestamp(*metav1.Time)             {}
func (e *entry) GetDeletionGracePeriodSeconds() *int64         { return nil }
func (e *entry) SetDeletionGracePeriodSeconds(*int64)          {}
func (e *entry) GetLabels() map[string]string                  { return nil }
func (e *entry) SetLabels(map[string]string)                   {}
func (e *entry) GetAnnotations() map[string]string             { return nil }
func (e *entry) SetAnnotations(map[string]string)              {}
func (e *entry) GetFinalizers() []string                       { return nil }
func (e *entry) SetFinalizers([]string)                        {}
func (e *entry) GetOwnerReferences() []metav1.OwnerReference   { return nil }
func (e *entry) SetOwnerReferences([]metav1.OwnerReference)    {}
func (e *entry) GetManagedFields() []metav1.ManagedFieldsEntry { return nil }
func (e *entry) SetManagedFields([]metav1.ManagedFieldsEntry)  {}

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
