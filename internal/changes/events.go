package changes

import (
	"slices"
	"strings"
	"time"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/objects"
	"github.com/kproxy/kproxy/internal/source"
)

// This file implements source.Handler: each event updates the current
// objects, then re-measures the affected Services against their base.

// OnService records an added or updated Service.
func (t *Tracker) OnService(svc *objects.Service) {
	t.mu.Lock()
	k := svc.Key()
	changed := false
	if !equalService(t.services[k], svc) {
		p := t.pendingFor(k)
		t.writableServices()
		t.services[k] = svc
		changed = t.recheck(k, p)
	}
	t.obs.ServiceChanged(t.svcPending)
	t.mu.Unlock()
	t.notifyIf(changed)
}

// OnServiceDeleted records that Service k is gone.
func (t *Tracker) OnServiceDeleted(k objects.Key) {
	t.mu.Lock()
	changed := false
	if _, ok := t.services[k]; ok {
		p := t.pendingFor(k)
		t.writableServices()
		delete(t.services, k)
		changed = t.recheck(k, p)
	}
	t.obs.ServiceChanged(t.svcPending)
	t.mu.Unlock()
	t.notifyIf(changed)
}

// OnSlice records an added or updated EndpointSlice. A slice that holds no IP
// addresses (FQDN) counts as deleted.
func (t *Tracker) OnSlice(es *objects.EndpointSlice) {
	if es.AddressType != objects.AddressTypeIPv4 && es.AddressType != objects.AddressTypeIPv6 {
		t.OnSliceDeleted(es.Key())
		return
	}
	t.mu.Lock()
	old := t.slices[es.Key()]
	changed := false
	if !equalSlice(old, es) {
		changed = t.putSlice(old, es)
	}
	t.obs.EndpointsChanged(t.epPending)
	t.mu.Unlock()
	t.notifyIf(changed)
}

// OnSliceDeleted records that EndpointSlice k is gone.
func (t *Tracker) OnSliceDeleted(k objects.Key) {
	t.mu.Lock()
	changed := false
	if old := t.slices[k]; old != nil {
		sk := old.ServiceKey()
		p := t.pendingFor(sk)
		t.writableSlices()
		delete(t.slices, k)
		t.setSlices(sk, without(t.bySvc[sk], old.Name))
		p.triggers = nil // as upstream: a deletion voids the Service's trigger times
		changed = t.recheck(sk, p)
	}
	t.obs.EndpointsChanged(t.epPending)
	t.mu.Unlock()
	t.notifyIf(changed)
}

// putSlice stores es, replacing old (nil when new), which may have belonged to
// another Service. It reports whether anything became pending.
func (t *Tracker) putSlice(old, es *objects.EndpointSlice) bool {
	sk := es.ServiceKey()
	p := t.pendingFor(sk)
	var oldP *pendingService
	if old != nil && old.ServiceKey() != sk {
		oldP = t.pendingFor(old.ServiceKey())
	}
	t.writableSlices()
	t.slices[es.Key()] = es
	if oldP != nil {
		t.setSlices(old.ServiceKey(), without(t.bySvc[old.ServiceKey()], old.Name))
	}
	t.setSlices(sk, with(t.bySvc[sk], es))
	if at, ok := t.triggerTime(es); ok {
		fam := model.IPv4
		if es.AddressType == objects.AddressTypeIPv6 {
			fam = model.IPv6
		}
		p.triggers = append(p.triggers, trigger{at: at, gen: t.gen + 1, fam: fam})
	}
	changed := t.recheck(sk, p)
	if oldP != nil {
		changed = t.recheck(old.ServiceKey(), oldP) || changed
	}
	return changed
}

// triggerTime parses es's last-change-trigger-time; only times after the
// Tracker started count.
func (t *Tracker) triggerTime(es *objects.EndpointSlice) (time.Time, bool) {
	if es.TriggerTime == "" {
		return time.Time{}, false
	}
	at, err := time.Parse(time.RFC3339Nano, es.TriggerTime)
	if err != nil {
		t.logger.V(2).Info("Ignoring malformed trigger time", "endpointSlice", es.Key().String(), "value", es.TriggerTime, "err", err)
		return time.Time{}, false
	}
	return at, at.After(t.start)
}

// OnNode records this node's Node object; other nodes are ignored.
func (t *Tracker) OnNode(n *objects.Node) {
	if n.Name != t.nodeName {
		t.logger.V(4).Info("Ignoring another node", "node", n.Name, "want", t.nodeName)
		return
	}
	t.setNode(n)
}

// OnNodeDeleted records that this node's Node object is gone. As upstream
// kube-proxy, kproxy keeps using the Node as last seen: its zone for
// topology, its podCIDRs for detect-local-mode NodeCIDR, and its
// deletion state for /healthz. Upstream's node manager only logs the
// deletion, and a node whose object is deleted is normally going away.
func (t *Tracker) OnNodeDeleted() {
	t.mu.Lock()
	known := t.node != nil
	t.mu.Unlock()
	if known {
		t.logger.Info("This node's Node object was deleted; its last state stays in use, as upstream kube-proxy keeps it", "node", t.nodeName)
	}
}

func (t *Tracker) setNode(n *objects.Node) {
	t.mu.Lock()
	changed := false
	if !equalNode(t.node, n) {
		if !t.nodePending {
			t.nodeBase = t.node
		}
		t.node = n
		t.gen++
		t.nodeGen = t.gen
		t.nodePending = !equalNode(t.nodeBase, n)
		changed = t.nodePending
	}
	t.mu.Unlock()
	t.notifyIf(changed)
}

// OnSynced records that kind has been listed completely.
func (t *Tracker) OnSynced(kind source.Kind) {
	t.mu.Lock()
	was := t.synced[kind]
	t.synced[kind] = true
	t.mu.Unlock()
	t.notifyIf(!was)
}

// pendingFor returns k's pending entry, creating it with the current state
// as base. Callers must recheck it after changing the state.
func (t *Tracker) pendingFor(k objects.Key) *pendingService {
	if p := t.pending[k]; p != nil {
		return p
	}
	p := &pendingService{baseSvc: t.services[k], baseSlices: t.bySvc[k]}
	t.pending[k] = p
	return p
}

// recheck measures Service k against its base after an event: the entry is
// dropped when everything is back to the base. It reports whether k is
// pending.
func (t *Tracker) recheck(k objects.Key, p *pendingService) bool {
	t.gen++
	p.gen = t.gen
	t.count(p, -1)
	p.svcDiff = !equalService(p.baseSvc, t.services[k])
	p.slicesDiff = !equalSlices(p.baseSlices, t.bySvc[k])
	if !p.svcDiff && !p.slicesDiff {
		delete(t.pending, k)
		return false
	}
	t.count(p, +1)
	return true
}

// dropPending forgets k's entry after a successful sync.
func (t *Tracker) dropPending(k objects.Key, p *pendingService) {
	t.count(p, -1)
	delete(t.pending, k)
}

func (t *Tracker) count(p *pendingService, d int) {
	if p.svcDiff {
		t.svcPending += d
	}
	if p.slicesDiff {
		t.epPending += d
	}
}

// setSlices replaces Service k's slice list (removing the key when empty).
// The maps must be writable.
func (t *Tracker) setSlices(k objects.Key, list []*objects.EndpointSlice) {
	if len(list) == 0 {
		delete(t.bySvc, k)
		return
	}
	t.bySvc[k] = list
}

func (t *Tracker) notifyIf(changed bool) {
	if changed {
		t.notify()
	}
}

// with returns a new list: list with es added or replacing the slice of the
// same name, sorted by name.
func with(list []*objects.EndpointSlice, es *objects.EndpointSlice) []*objects.EndpointSlice {
	i, found := slices.BinarySearchFunc(list, es.Name, byName)
	out := make([]*objects.EndpointSlice, 0, len(list)+1)
	out = append(out, list[:i]...)
	out = append(out, es)
	if found {
		i++
	}
	return append(out, list[i:]...)
}

// without returns a new list: list without the slice called name.
func without(list []*objects.EndpointSlice, name string) []*objects.EndpointSlice {
	i, found := slices.BinarySearchFunc(list, name, byName)
	if !found {
		return list
	}
	out := make([]*objects.EndpointSlice, 0, len(list)-1)
	out = append(out, list[:i]...)
	return append(out, list[i+1:]...)
}

func byName(es *objects.EndpointSlice, name string) int { return strings.Compare(es.Name, name) }
