package api

import (
	"fmt"

	"k8s.io/client-go/tools/cache"

	"github.com/kproxy/kproxy/internal/objects"
)

// The informer event handlers receive entries (see slim.go) and forward them
// to the source.Handler.

func (s *Source) serviceHandler() cache.ResourceEventHandler {
	put := func(obj any, update bool) {
		e := s.entryOf(obj)
		switch o := e.obj.(type) {
		case *objects.Service:
			s.h.OnService(o)
		case nil:
			if update {
				s.h.OnServiceDeleted(e.key())
			}
		}
	}
	return handlerFuncs(put, func(e *entry) { s.h.OnServiceDeleted(e.key()) })
}

func (s *Source) sliceHandler() cache.ResourceEventHandler {
	put := func(obj any, update bool) {
		e := s.entryOf(obj)
		switch o := e.obj.(type) {
		case *objects.EndpointSlice:
			s.h.OnSlice(o)
		case nil:
			if update {
				s.h.OnSliceDeleted(e.key())
			}
		}
	}
	return handlerFuncs(put, func(e *entry) { s.h.OnSliceDeleted(e.key()) })
}

func (s *Source) nodeHandler() cache.ResourceEventHandler {
	put := func(obj any, _ bool) {
		if n, ok := s.entryOf(obj).obj.(*objects.Node); ok {
			s.h.OnNode(n)
		}
	}
	del := func(e *entry) {
		if e.name == s.nodeName {
			s.h.OnNodeDeleted()
		}
	}
	return handlerFuncs(put, del)
}

func (s *Source) serviceCIDRHandler() cache.ResourceEventHandler {
	put := func(obj any, _ bool) {
		if c, ok := s.entryOf(obj).obj.(*objects.ServiceCIDR); ok {
			s.h.OnServiceCIDR(c)
		}
	}
	return handlerFuncs(put, func(e *entry) { s.h.OnServiceCIDRDeleted(e.name) })
}

// handlerFuncs builds informer callbacks: adds and updates go to put (an
// entry without an object matters only as an update: the object stopped
// being proxied), and deletions (also those seen only as a tombstone) to del.
func handlerFuncs(put func(obj any, update bool), del func(*entry)) cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { put(obj, false) },
		UpdateFunc: func(_, obj any) { put(obj, true) },
		DeleteFunc: func(obj any) {
			if e, ok := deletedEntry(obj); ok {
				del(e)
			}
		},
	}
}

// entryOf returns obj as an entry; anything else (which the transforms never
// produce) is logged and becomes an empty entry that changes nothing.
func (s *Source) entryOf(obj any) *entry {
	if e, ok := obj.(*entry); ok {
		return e
	}
	s.logger.Error(fmt.Errorf("unexpected object type %T", obj), "Ignoring informer event")
	return &entry{obj: struct{}{}}
}

// deletedEntry finds the key of a deleted object, which may come wrapped in a
// tombstone when the watch missed the deletion.
func deletedEntry(obj any) (*entry, bool) {
	switch o := obj.(type) {
	case *entry:
		return o, true
	case cache.DeletedFinalStateUnknown:
		if e, ok := o.Obj.(*entry); ok {
			return e, true
		}
		ns, name, err := cache.SplitMetaNamespaceKey(o.Key)
		if err != nil {
			return nil, false
		}
		return &entry{namespace: ns, name: name}, true
	}
	return nil, false
}
