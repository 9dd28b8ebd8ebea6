package traffic

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/nfnl"
)

// Reconciler keeps the families' tables in step with the snapshots the
// dataplane programmed. Update only hands the snapshot over; Run, in its
// own goroutine, writes the difference since the last one it wrote, so
// the sync loop waits for nothing.
type Reconciler struct {
	fams   []model.Family
	logger klog.Logger
	send   func(f model.Family, w func(writer)) error
	latest chan *model.Snapshot
	state  map[model.Family]*familyState
}

// NewReconciler returns a reconciler of the tables of fams. It touches
// nothing until Run.
func NewReconciler(fams []model.Family, logger klog.Logger) *Reconciler {
	return &Reconciler{fams: fams, logger: logger, send: sendBatch, latest: make(chan *model.Snapshot, 1),
		state: map[model.Family]*familyState{}}
}

// Update hands over the snapshot last programmed; an earlier one not yet
// written is dropped. It never blocks.
func (r *Reconciler) Update(snap *model.Snapshot) {
	for {
		select {
		case r.latest <- snap:
			return
		default:
		}
		select {
		case <-r.latest:
		default:
		}
	}
}

// Run writes the snapshots handed over until ctx is done, then deletes the
// tables: the counters are only read while kproxy runs, and an upstream
// kube-proxy that replaces it knows nothing of them. A failed write is
// logged and the table rebuilt from the next snapshot.
func (r *Reconciler) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			if err := r.deleteTables(); err != nil {
				r.logger.Error(err, "Deleting the traffic counter tables failed")
			}
			return
		case snap := <-r.latest:
			r.apply(snap)
		}
	}
}

// apply writes the difference to snap in every family.
func (r *Reconciler) apply(snap *model.Snapshot) {
	for _, f := range r.fams {
		st := r.state[f]
		if st == nil {
			st = &familyState{}
			r.state[f] = st
		}
		ops := st.plan(snap.Family(f))
		if len(ops) == 0 {
			continue
		}
		if err := r.send(f, func(w writer) { w.write(ops) }); err != nil {
			r.logger.Error(err, "Updating the traffic counters failed; rebuilding the table", "family", f.String())
			r.state[f] = &familyState{}
			// Retried with the next snapshot; rebuild from this one now.
			if err := r.send(f, func(w writer) { w.write(r.state[f].plan(snap.Family(f))) }); err != nil {
				r.logger.Error(err, "Rebuilding the traffic counter table failed", "family", f.String())
				r.state[f] = &familyState{}
			}
		}
	}
}

func (r *Reconciler) deleteTables() error {
	var errs []error
	for _, f := range r.fams {
		errs = append(errs, r.send(f, func(w writer) { w.deleteTable() }))
	}
	return errors.Join(errs...)
}

// sendBatch sends what write writes as one batch of family f in the
// calling thread's network namespace.
func sendBatch(f model.Family, write func(writer)) error {
	b := nfnl.NewBatch(nfFamily(f), nil, 4096)
	write(writer{Batch: b, fam: f})
	if err := b.Send(); err != nil {
		return fmt.Errorf("%s table %s: %w", f, Table, err)
	}
	return nil
}

// Cleanup deletes the tables of fams, when they exist (kproxy --cleanup,
// and a start without --service-traffic-metrics), in the calling thread's
// network namespace.
func Cleanup(fams []model.Family) error {
	var errs []error
	for _, f := range fams {
		errs = append(errs, sendBatch(f, func(w writer) { w.deleteTable() }))
	}
	return errors.Join(errs...)
}
