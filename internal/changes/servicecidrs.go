package changes

import (
	"slices"
	"strings"

	"github.com/kproxy/kproxy/internal/objects"
)

// The ServiceCIDRs are tracked as one unit, like the Node: the current list
// (sorted by name, replaced on every change, never changed in place), its
// state at the last successful sync (the base), and whether the two differ.

// OnServiceCIDR records an added or updated ServiceCIDR.
func (t *Tracker) OnServiceCIDR(c *objects.ServiceCIDR) {
	t.mu.Lock()
	i, found := slices.BinarySearchFunc(t.cidrs, c.Name, byCIDRName)
	changed := false
	if !found || !equalServiceCIDR(t.cidrs[i], c) {
		next := slices.Clone(t.cidrs)
		if found {
			next[i] = c
		} else {
			next = slices.Insert(next, i, c)
		}
		changed = t.setServiceCIDRs(next)
	}
	t.mu.Unlock()
	t.notifyIf(changed)
}

// OnServiceCIDRDeleted records that the ServiceCIDR called name is gone.
func (t *Tracker) OnServiceCIDRDeleted(name string) {
	t.mu.Lock()
	changed := false
	if i, found := slices.BinarySearchFunc(t.cidrs, name, byCIDRName); found {
		changed = t.setServiceCIDRs(slices.Delete(slices.Clone(t.cidrs), i, i+1))
	}
	t.mu.Unlock()
	t.notifyIf(changed)
}

// setServiceCIDRs makes list current and reports whether the ServiceCIDRs are
// now pending (they differ from the base).
func (t *Tracker) setServiceCIDRs(list []*objects.ServiceCIDR) bool {
	if !t.cidrsPending {
		t.cidrsBase = t.cidrs
	}
	if len(list) == 0 {
		list = nil
	}
	t.cidrs = list
	t.gen++
	t.cidrsGen = t.gen
	t.cidrsPending = !equalServiceCIDRs(t.cidrsBase, list)
	return t.cidrsPending
}

// rebaseServiceCIDRs runs in a successful Done: b's ServiceCIDRs are
// programmed; whatever came later stays pending against them.
func (t *Tracker) rebaseServiceCIDRs(b *Batch) {
	if t.cidrsPending && t.cidrsGen <= b.gen {
		t.cidrsPending = false
		return
	}
	if !b.ServiceCIDRsChanged && !t.cidrsPending {
		return
	}
	t.cidrsBase = b.Input.ServiceCIDRs
	t.cidrsPending = !equalServiceCIDRs(t.cidrsBase, t.cidrs)
}

func byCIDRName(c *objects.ServiceCIDR, name string) int { return strings.Compare(c.Name, name) }

func equalServiceCIDR(a, b *objects.ServiceCIDR) bool {
	return equalObjects(a, b,
		func(c *objects.ServiceCIDR) string { return c.ResourceVersion },
		func(c *objects.ServiceCIDR) { c.ResourceVersion = "" })
}

// equalServiceCIDRs compares two name-sorted lists.
func equalServiceCIDRs(a, b []*objects.ServiceCIDR) bool {
	return slices.EqualFunc(a, b, equalServiceCIDR)
}
