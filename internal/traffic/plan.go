package traffic

import (
	"github.com/kproxy/kproxy/internal/model"
)

// familyState is what one family's table holds, as this process wrote it.
type familyState struct {
	// prev is the snapshot the table follows; nil until the table was
	// (re)created.
	prev *model.FamilySnapshot
	// owner is the counter each element key points at. Two ports may claim
	// one key (two Services with the same external IP and port, which the
	// API allows): the one that claimed it first keeps it.
	owner map[key]string
}

// plan returns the ops that take the table from s.prev to next and records
// next as done; the caller forgets s (reset) when applying them fails.
// Service ports that a snapshot shares with the previous one are
// unchanged (model.Update shares them), so a change costs a walk over the
// port pointers and the ops of the changed ports only.
func (s *familyState) plan(next *model.FamilySnapshot) []op {
	var dels, adds []op
	if s.prev == nil {
		s.owner = map[key]string{}
		dels = []op{{kind: opReset}}
		s.prev = &model.FamilySnapshot{}
	}
	prev := s.prev.Ports
	var ports []*model.ServicePort
	if next != nil {
		ports = next.Ports
	}
	var added []*model.ServicePort
	var changed [][2]*model.ServicePort
	i, j := 0, 0
	for i < len(prev) || j < len(ports) {
		switch {
		case j == len(ports) || i < len(prev) && prev[i].ID.Less(ports[j].ID):
			dels = s.release(dels, prev[i], nil)
			dels = append(dels, op{kind: opDelCounter, counter: CounterName(prev[i].ID)})
			i++
		case i == len(prev) || ports[j].ID.Less(prev[i].ID):
			added = append(added, ports[j])
			j++
		default:
			if prev[i] != ports[j] {
				dels = s.release(dels, prev[i], ports[j])
				changed = append(changed, [2]*model.ServicePort{prev[i], ports[j]})
			}
			i++
			j++
		}
	}
	for _, sp := range added {
		adds = append(adds, op{kind: opAddCounter, counter: CounterName(sp.ID)})
		adds = s.claim(adds, nil, sp)
	}
	for _, c := range changed {
		adds = s.claim(adds, c[0], c[1])
	}
	s.prev = next
	if next == nil {
		s.prev = &model.FamilySnapshot{}
	}
	return append(dels, adds...)
}

// release deletes the elements of old that next (nil: none) does not
// have, where old holds them.
func (s *familyState) release(ops []op, old, next *model.ServicePort) []op {
	name := CounterName(old.ID)
	keep := keySet(next)
	for _, k := range keysOf(old) {
		if _, ok := keep[k]; ok || s.owner[k] != name {
			continue
		}
		delete(s.owner, k)
		ops = append(ops, op{kind: opDelElem, counter: name, key: k})
	}
	return ops
}

// claim adds the elements of next that old (nil: none) did not have and
// no other port holds.
func (s *familyState) claim(ops []op, old, next *model.ServicePort) []op {
	name := CounterName(next.ID)
	had := keySet(old)
	for _, k := range keysOf(next) {
		if _, ok := had[k]; ok && s.owner[k] == name {
			continue
		}
		if _, taken := s.owner[k]; taken {
			continue
		}
		s.owner[k] = name
		ops = append(ops, op{kind: opAddElem, counter: name, key: k})
	}
	return ops
}

func keySet(sp *model.ServicePort) map[key]struct{} {
	if sp == nil {
		return nil
	}
	ks := keysOf(sp)
	m := make(map[key]struct{}, len(ks))
	for _, k := range ks {
		m[k] = struct{}{}
	}
	return m
}
