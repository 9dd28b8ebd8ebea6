package daemon

import (
	"reflect"
	"testing"
)

type recordingObserver struct{ events []string }

func (r *recordingObserver) ServiceChanged(p int)   { r.events = append(r.events, "svc", itoa(p)) }
func (r *recordingObserver) EndpointsChanged(p int) { r.events = append(r.events, "eps", itoa(p)) }
func (r *recordingObserver) ChangesPending(s, e int) {
	r.events = append(r.events, "pending", itoa(s), itoa(e))
}

func itoa(i int) string { return string(rune('0' + i)) }

// TestLateObserverReplays checks that change events seen before the metrics
// exist are counted, not lost.
func TestLateObserverReplays(t *testing.T) {
	l := &lateObserver{}
	l.ServiceChanged(1)
	l.ServiceChanged(2)
	l.EndpointsChanged(1)
	l.ChangesPending(2, 1)
	r := &recordingObserver{}
	l.set(r)
	l.EndpointsChanged(3)
	want := []string{"svc", "2", "svc", "2", "eps", "1", "pending", "2", "1", "eps", "3"}
	if !reflect.DeepEqual(r.events, want) {
		t.Fatalf("events %v, want %v", r.events, want)
	}
}
