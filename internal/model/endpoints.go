package model

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"unique"

	"github.com/kproxy/kproxy/internal/objects"
)

// candidate is an endpoint read from a slice, before deduplication.
type candidate struct {
	ep    Endpoint
	slice int // index of its slice in the family's sorted slices
}

// portGroup gathers the endpoints of one slice port name and protocol.
type portGroup struct {
	key   portKey
	cands []candidate
	eps   []*Endpoint // deduplicated and sorted
}

// endpointReader turns the slices of one Service into endpoints per port.
// It reuses its buffers from one Service to the next: what it returns is
// valid until its next call.
type endpointReader struct {
	// node is this node's name (zero when it has none): a handle, so
	// that telling a local endpoint is a pointer comparison.
	node     unique.Handle[string]
	byFam    [2][]*objects.EndpointSlice
	base     []Endpoint
	groups   []portGroup
	sPorts   []portSpec
	localIPs []netip.Addr
}

// split sorts the slices filed under the Service key into families, each
// sorted by name so that duplicates resolve the same way on every build.
func (r *endpointReader) split(key objects.Key, in []*objects.EndpointSlice, list *[]Problem) {
	r.byFam[0], r.byFam[1] = r.byFam[0][:0], r.byFam[1][:0]
	for _, s := range in {
		if s == nil {
			continue
		}
		probs := &problemList{kind: "EndpointSlice", key: s.Key(), list: list}
		if s.ServiceKey() != key {
			probs.add("metadata.labels", "belongs to Service "+s.ServiceKey().String()+", not "+key.String())
			continue
		}
		switch s.AddressType {
		case objects.AddressTypeIPv4:
			r.byFam[0] = append(r.byFam[0], s)
		case objects.AddressTypeIPv6:
			r.byFam[1] = append(r.byFam[1], s)
		case "FQDN":
		default:
			probs.add("addressType", "unknown address type "+quote(s.AddressType))
		}
	}
	for _, fs := range r.byFam {
		if len(fs) > 1 {
			slices.SortStableFunc(fs, func(a, b *objects.EndpointSlice) int {
				return strings.Compare(a.Name, b.Name)
			})
		}
	}
}

// read returns the endpoints of family f per slice port, and upstream's
// health-check count: distinct IPs of ready endpoints on this node.
func (r *endpointReader) read(f Family, list *[]Problem) (groups []portGroup, localReady int) {
	r.groups = r.groups[:0]
	fs := r.byFam[famIdx(f)]
	for i, s := range fs {
		r.addSlice(f, i, s, &problemList{kind: "EndpointSlice", key: s.Key(), list: list})
	}
	total := 0
	for i := range r.groups {
		total += len(r.groups[i].cands)
	}
	arena := make([]Endpoint, 0, total)
	ptrs := make([]*Endpoint, 0, total)
	for i := range r.groups {
		g := &r.groups[i]
		start := len(ptrs)
		arena, ptrs = dedup(g, fs, arena, ptrs, list)
		g.eps = ptrs[start:len(ptrs):len(ptrs)]
		if len(g.eps) == 0 {
			g.eps = nil
		}
	}
	return r.groups, r.countLocalReady(ptrs)
}

// addSlice adds the endpoints of slice s (index i) to the port groups.
func (r *endpointReader) addSlice(f Family, i int, s *objects.EndpointSlice, probs *problemList) {
	r.sPorts = r.sPorts[:0]
	for j, p := range s.Ports {
		if ps, ok := slicePort(j, p, probs); ok {
			r.sPorts = append(r.sPorts, ps)
		}
	}
	if len(r.sPorts) == 0 {
		return
	}
	r.base = r.base[:0]
	for j := range s.Endpoints {
		if ep, ok := r.endpoint(f, j, s, probs); ok {
			r.base = append(r.base, ep)
		}
	}
	for _, ps := range r.sPorts {
		g := r.group(ps.key)
		for _, ep := range r.base {
			ep.Port = ps.port
			g.cands = append(g.cands, candidate{ep: ep, slice: i})
		}
	}
}

// slicePort validates entry j of a slice's ports; upstream skips port 0.
func slicePort(j int, p objects.EndpointPort, probs *problemList) (portSpec, bool) {
	field := "ports[" + strconv.Itoa(j) + "]"
	proto, ok := parseProtocol(p.Protocol)
	if !ok {
		probs.add(field+".protocol", "unknown protocol "+quote(p.Protocol))
		return portSpec{}, false
	}
	if p.Port <= 0 || p.Port > 65535 {
		probs.add(field+".port", "port "+strconv.Itoa(int(p.Port))+" out of range 1-65535")
		return portSpec{}, false
	}
	return portSpec{key: portKey{p.Name, proto}, port: uint16(p.Port)}, true
}

// endpoint reads entry j of slice s's endpoints (its first address only),
// applying upstream's defaults to the conditions.
func (r *endpointReader) endpoint(f Family, j int, s *objects.EndpointSlice, probs *problemList) (Endpoint, bool) {
	e := &s.Endpoints[j]
	field := "endpoints[" + strconv.Itoa(j) + "].addresses"
	if !e.HasAddress {
		probs.add(field, "no address")
		return Endpoint{}, false
	}
	a := e.Addr
	if !a.IsValid() {
		if text, ok := s.BadAddresses[j]; ok {
			probs.add(field, "invalid IP address "+quote(text))
		} else {
			probs.add(field, "invalid IP address")
		}
		return Endpoint{}, false
	}
	if FamilyOf(a) != f {
		probs.add(field, a.String()+" is not an "+f.String()+" address")
		return Endpoint{}, false
	}
	return Endpoint{
		IP:          a,
		Ready:       e.Ready.Or(true),
		Serving:     e.Serving.Or(true),
		Terminating: e.Terminating.Or(false),
		IsLocal:     r.node != (unique.Handle[string]{}) && e.Node == r.node,
		Hints:       e.Hints,
	}, true
}

// group returns the port group of key, adding it when new. Services have
// few ports: a linear search beats a map.
func (r *endpointReader) group(key portKey) *portGroup {
	for i := range r.groups {
		if r.groups[i].key == key {
			return &r.groups[i]
		}
	}
	if len(r.groups) < cap(r.groups) {
		r.groups = r.groups[:len(r.groups)+1]
		g := &r.groups[len(r.groups)-1]
		g.key, g.cands, g.eps = key, g.cands[:0], nil
		return g
	}
	r.groups = append(r.groups, portGroup{key: key})
	return &r.groups[len(r.groups)-1]
}

// dedup sorts a group's candidates by address and port and keeps one per
// address and port, by upstream's rule applied in slice-name order: a later
// duplicate replaces an earlier one unless it is terminating. The survivors
// are appended to arena, with pointers to them to ptrs.
func dedup(g *portGroup, fs []*objects.EndpointSlice, arena []Endpoint, ptrs []*Endpoint, list *[]Problem) ([]Endpoint, []*Endpoint) {
	slices.SortStableFunc(g.cands, func(a, b candidate) int {
		return a.ep.AddrPort().Compare(b.ep.AddrPort())
	})
	for i := 0; i < len(g.cands); {
		win, j := i, i+1
		for ; j < len(g.cands) && g.cands[j].ep.AddrPort() == g.cands[i].ep.AddrPort(); j++ {
			if !g.cands[j].ep.Terminating {
				win = j
			}
		}
		for k := i; k < j; k++ {
			if k != win {
				reportDuplicate(g, fs, &g.cands[k], &g.cands[win], list)
			}
		}
		arena = append(arena, g.cands[win].ep)
		ptrs = append(ptrs, &arena[len(arena)-1])
		i = j
	}
	return arena, ptrs
}

func reportDuplicate(g *portGroup, fs []*objects.EndpointSlice, dropped, kept *candidate, list *[]Problem) {
	probs := &problemList{kind: "EndpointSlice", key: fs[dropped.slice].Key(), list: list}
	probs.add("endpoints", "duplicate endpoint "+dropped.ep.String()+" for port "+quote(g.key.name)+
		" (kept the one from slice "+fs[kept.slice].Name+")")
}

// countLocalReady counts the distinct IPs of ready endpoints on this node.
func (r *endpointReader) countLocalReady(eps []*Endpoint) int {
	r.localIPs = r.localIPs[:0]
	for _, ep := range eps {
		if ep.Ready && ep.IsLocal {
			r.localIPs = append(r.localIPs, ep.IP)
		}
	}
	if len(r.localIPs) > 1 {
		slices.SortFunc(r.localIPs, netip.Addr.Compare)
		r.localIPs = slices.Compact(r.localIPs)
	}
	return len(r.localIPs)
}

// endpointsFor returns the endpoints of the group matching key, or nil.
func endpointsFor(groups []portGroup, key portKey) []*Endpoint {
	for i := range groups {
		if groups[i].key == key {
			return groups[i].eps
		}
	}
	return nil
}
