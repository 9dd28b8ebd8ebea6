package changes

import (
	"reflect"

	"github.com/kproxy/kproxy/internal/objects"
)

// Equality of slim objects ignores ResourceVersion (a write that changed
// nothing kproxy reads is a no-op), but a shared non-empty ResourceVersion
// proves equality without comparing content. nil equals only nil.

// equalObjects applies that rule: strip clears, on a copy, the fields that
// do not count (ResourceVersion at least).
func equalObjects[T any](a, b *T, version func(*T) string, strip func(*T)) bool {
	if a == b {
		return true
	}
	if a == nil || b == nil {
		return false
	}
	if v := version(a); v != "" && v == version(b) {
		return true
	}
	x, y := *a, *b
	strip(&x)
	strip(&y)
	return reflect.DeepEqual(x, y)
}

func equalService(a, b *objects.Service) bool {
	return equalObjects(a, b,
		func(s *objects.Service) string { return s.ResourceVersion },
		func(s *objects.Service) { s.ResourceVersion = "" })
}

func equalSlice(a, b *objects.EndpointSlice) bool {
	return equalObjects(a, b,
		func(s *objects.EndpointSlice) string { return s.ResourceVersion },
		// A new trigger time alone changes nothing to program.
		func(s *objects.EndpointSlice) { s.ResourceVersion, s.TriggerTime = "", "" })
}

// equalSlices compares two name-sorted slice lists.
func equalSlices(a, b []*objects.EndpointSlice) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !equalSlice(a[i], b[i]) {
			return false
		}
	}
	return true
}

func equalNode(a, b *objects.Node) bool {
	return equalObjects(a, b,
		func(n *objects.Node) string { return n.ResourceVersion },
		func(n *objects.Node) { n.ResourceVersion = "" })
}
