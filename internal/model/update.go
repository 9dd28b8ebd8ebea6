package model

import (
	"sort"

	"github.com/kproxy/kproxy/internal/objects"
)

// NewFamilySnapshot makes the snapshot of family f with ports, which must be
// sorted by ID, and their tally.
func NewFamilySnapshot(f Family, ports []*ServicePort) *FamilySnapshot {
	if len(ports) == 0 {
		ports = nil
	}
	return &FamilySnapshot{Family: f, Ports: ports, tally: tallyOf(ports)}
}

// replace returns fs with the ports of the Services keys (sorted) replaced
// by fresh (sorted by ID, only ports of those Services). It returns fs
// itself when nothing changes; else it copies Ports and shares
// every ServicePort.
func (fs *FamilySnapshot) replace(keys []objects.Key, fresh []*ServicePort) *FamilySnapshot {
	spans := make([][2]int, len(keys))
	removed := 0
	for i, k := range keys {
		spans[i] = fs.span(k)
		removed += spans[i][1] - spans[i][0]
	}
	if removed == 0 && len(fresh) == 0 {
		return fs
	}
	ports := make([]*ServicePort, 0, len(fs.Ports)-removed+len(fresh))
	cursor, next := 0, 0
	for i, k := range keys {
		lo, hi := spans[i][0], spans[i][1]
		ports = append(ports, fs.Ports[cursor:lo]...)
		for ; next < len(fresh) && fresh[next].ID.Service() == k; next++ {
			ports = append(ports, fresh[next])
		}
		cursor = hi
	}
	ports = append(ports, fs.Ports[cursor:]...)
	if len(ports) == 0 {
		ports = nil
	}
	return &FamilySnapshot{Family: fs.Family, Ports: ports, tally: fs.tally.replace(fs.Ports, spans, fresh)}
}

// replace returns t, the tally of ports, with the ports in spans taken out
// and fresh counted, the health-checked ports kept in order. Its cost is
// that of the changed ports and the health-checked ones, not of all.
func (t portTally) replace(ports []*ServicePort, spans [][2]int, fresh []*ServicePort) portTally {
	goneLists := make([][]*ServicePort, len(spans))
	for i, sp := range spans {
		goneLists[i] = ports[sp[0]:sp[1]]
	}
	gone, added := tallyOf(goneLists...), tallyOf(fresh)
	// spans and fresh hold whole Services, so their Service counts are
	// exact too.
	out := portTally{
		noLocalInternal: t.noLocalInternal.replace(gone.noLocalInternal, added.noLocalInternal),
		noLocalExternal: t.noLocalExternal.replace(gone.noLocalExternal, added.noLocalExternal),
		healthChecked:   t.healthChecked,
	}
	if len(gone.healthChecked) > 0 || len(added.healthChecked) > 0 {
		// Merge: the kept ones in order, the fresh ones (sorted) at their
		// place.
		// gone's are a sorted subsequence of t's.
		kept := make([]*ServicePort, 0, len(t.healthChecked))
		g := gone.healthChecked
		for _, p := range t.healthChecked {
			if len(g) > 0 && g[0] == p {
				g = g[1:]
				continue
			}
			kept = append(kept, p)
		}
		out.healthChecked = mergePorts(kept, added.healthChecked)
	}
	return out
}

// mergePorts merges a and b, both sorted by ID.
func mergePorts(a, b []*ServicePort) []*ServicePort {
	if len(a)+len(b) == 0 {
		return nil
	}
	out := make([]*ServicePort, 0, len(a)+len(b))
	for len(a) > 0 && len(b) > 0 {
		if b[0].ID.Less(a[0].ID) {
			out, b = append(out, b[0]), b[1:]
		} else {
			out, a = append(out, a[0]), a[1:]
		}
	}
	return append(append(out, a...), b...)
}

// span returns the range of fs.Ports that belongs to the Service key.
func (fs *FamilySnapshot) span(key objects.Key) [2]int {
	lo := sort.Search(len(fs.Ports), func(i int) bool {
		return fs.Ports[i].ID.Service().Compare(key) >= 0
	})
	hi := lo
	for hi < len(fs.Ports) && fs.Ports[hi].ID.Service() == key {
		hi++
	}
	return [2]int{lo, hi}
}
