package changes

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/objects"
)

func TestTakeChangesPartialAfterFirstSync(t *testing.T) {
	tr := newTestTracker()
	tr.OnService(svc("a", "1", "198.18.128.1"))
	tr.OnService(svc("b", "1", "198.18.128.2"))
	tr.OnSlice(slice("a-1", "a", "1", "198.18.17.1"))

	first := tr.TakeChanges()
	if first.Input.Partial || len(first.Input.Services) != 2 {
		t.Fatalf("before any sync: partial=%v services=%d, want a full input", first.Input.Partial, len(first.Input.Services))
	}
	tr.Done(first, false)
	if again := tr.TakeChanges(); again.Input.Partial {
		t.Fatal("a failed Done made the next Take partial")
	} else {
		tr.Done(again, true)
	}

	tr.OnSlice(slice("a-1", "a", "2", "198.18.17.2"))
	tr.OnServiceDeleted(objects.Key{Namespace: "ns", Name: "b"})
	b := tr.TakeChanges()
	if !b.Input.Partial {
		t.Fatal("after a successful sync: want a partial input")
	}
	if len(b.Input.Services) != 1 || b.Input.Services[objects.Key{Namespace: "ns", Name: "a"}] == nil {
		t.Errorf("partial Services = %v, want only ns/a", b.Input.Services)
	}
	if len(b.Input.Slices) != 1 || len(b.Changed) != 2 {
		t.Errorf("partial Slices = %v, Changed = %v", b.Input.Slices, b.Changed)
	}
	tr.Done(b, true)

	tr.OnNode(&objects.Node{Name: "node-a", ResourceVersion: "5", Labels: map[string]string{"topology.kubernetes.io/zone": "z1"}})
	if nb := tr.TakeChanges(); nb.Input.Partial {
		t.Error("a pending Node change must give a full input (a zone change rebuilds everything)")
	}
}

// TestTakeChangesModelEquivalence runs random event sequences and checks
// that model.Update over partial takes always equals model.Build over the
// full input, whatever fails or succeeds in between.
func TestTakeChangesModelEquivalence(t *testing.T) {
	for seed := range uint64(30) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 7))
			tr := newTestTracker()
			var prev *model.Snapshot
			partials := 0
			for step := range 200 {
				randomEvent(r, tr, step)
				if r.IntN(3) > 0 {
					continue
				}
				b := tr.TakeChanges()
				got, _ := model.Update(prev, b.Input, b.Changed)
				ok := r.IntN(5) > 0
				tr.Done(b, ok)
				if ok {
					prev = got
				}
				full := tr.Take()
				want, _ := model.Build(full.Input)
				tr.Done(full, false)
				if !ok {
					continue
				}
				if b.Input.Partial {
					partials++
				}
				if !sameSnapshot(got, want) {
					t.Fatalf("seed %d step %d: Update over a partial take (partial=%v) differs from Build:\n got %v\nwant %v",
						seed, step, b.Input.Partial, got.V4.Ports, want.V4.Ports)
				}
			}
			if partials == 0 {
				t.Fatal("no partial take was compared")
			}
		})
	}
}

func sameSnapshot(a, b *model.Snapshot) bool {
	return reflect.DeepEqual(a.V4.Ports, b.V4.Ports) && reflect.DeepEqual(a.V6.Ports, b.V6.Ports) &&
		reflect.DeepEqual(a.Node, b.Node)
}

func randomEvent(r *rand.Rand, tr *Tracker, step int) {
	name := fmt.Sprintf("s%d", r.IntN(8))
	rv := fmt.Sprint(step + 2)
	switch r.IntN(10) {
	case 0, 1, 2:
		tr.OnService(svc(name, rv, fmt.Sprintf("198.18.128.%d", r.IntN(200)+1)))
	case 3:
		tr.OnServiceDeleted(objects.Key{Namespace: "ns", Name: name})
	case 4, 5, 6:
		tr.OnSlice(slice(name+"-x", name, rv, fmt.Sprintf("198.18.17.%d", r.IntN(200)+1)))
	case 7:
		tr.OnSliceDeleted(objects.Key{Namespace: "ns", Name: name + "-x"})
	case 8:
		zone := fmt.Sprintf("z%d", r.IntN(2))
		tr.OnNode(&objects.Node{Name: "node-a", ResourceVersion: rv, Labels: map[string]string{"topology.kubernetes.io/zone": zone}})
	default:
		tr.OnSlice(slice(name+"-y", name, rv, fmt.Sprintf("198.18.18.%d", r.IntN(200)+1)))
	}
}
