package changes

import (
	"reflect"

	"github.com/kproxy/kproxy/internal/objects"
)

// Equality of slim objects ignores ResourceVersion (a write that changed
// nothing kproxy reads is a no-op), but a shared non-empty ResourceVersion
// proves equality without comparing content. nil equals only nil.

func equalService(a, b *objects.Service) bool {
	if a == b {
		return true
	}
	if a == nil || b == nil {
		return false
	}
	if a.ResourceVersion != "" && a.ResourceVersion == b.ResourceVersion {
		return true
	}
	x, y := *a, *b
	x.ResourceVersion, y.ResourceVersion = "", ""
	return reflect.DeepEqual(x, y)
}

func equalSlice(a, b *objects.EndpointSlice) bool {
	if a == b {
		return true
	}
	if a == nil || b == nil {
		return false
	}
	if a.ResourceVersion != "" && a.ResourceVersion == b.ResourceVersion {
		return true
	}
	x, y := *a, *b
	x.ResourceVersion, y.ResourceVersion = "", ""
	// A new trigger time alone changes nothing to program.
	x.TriggerTime, y.TriggerTime = "", ""
	return reflect.DeepEqual(x, y)
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
	if a == b {
		return true
	}
	if a == nil || b == nil {
		return false
	}
	if a.ResourceVersion != "" && a.ResourceVersion == b.ResourceVersion {
		return true
	}
	x, y := *a, *b
	x.ResourceVersion, y.ResourceVersion = "", ""
	return reflect.DeepEqual(x, y)
}
