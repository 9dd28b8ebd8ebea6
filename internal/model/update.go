package model

import (
	"sort"

	"github.com/kproxy/kproxy/internal/objects"
)

// newFamilySnapshot indexes ports, which must be sorted by ID.
func newFamilySnapshot(f Family, ports []*ServicePort) *FamilySnapshot {
	if len(ports) == 0 {
		ports = nil
	}
	return &FamilySnapshot{Family: f, Ports: ports}
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
	return &FamilySnapshot{Family: fs.Family, Ports: ports}
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
