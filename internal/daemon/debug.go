package daemon

import (
	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/explain"
	"github.com/kproxy/kproxy/internal/inspect"
	"github.com/kproxy/kproxy/internal/model"
)

// debugServer is the debug endpoint (--debug-bind-address) and the observer
// that feeds it: kproxy inspect reads the state, kproxy explain
// --debug-address has a request answered from the snapshot last programmed,
// with this daemon's dataplane configuration.
func (d *daemon) debugServer(addr string) (Server, Observer) {
	cfg, mode := d.dpCfg, d.mode
	rec := inspect.NewRecorder(d.nodeName, mode, d.fams, func(snap *model.Snapshot, req explain.Request) (*explain.Answer, error) {
		return explain.Explain(explain.Input{Snapshot: snap, Config: cfg, Mode: mode}, req)
	})
	if oc, ok := d.dp.(dataplane.ObjectCounter); ok {
		rec.CountObjects(oc.PortObjects)
	}
	return &inspect.Server{Addr: addr, Recorder: rec}, debugObserver{rec}
}

// debugObserver feeds an inspect.Recorder from the sync loop; it is also a
// ChangeObserver, for the pending counts.
type debugObserver struct{ rec *inspect.Recorder }

func (debugObserver) Started([]model.Family) {}
func (debugObserver) Queued([]model.Family)  {}
func (o debugObserver) Synced(r SyncReport) {
	s := inspect.Sync{Time: r.Start, Duration: r.Duration, Full: r.Full, Reason: r.Reason, Changed: r.Pending}
	if r.Err != nil {
		s.Error = r.Err.Error()
	} else if r.KernelOps >= 0 {
		s.KernelOps = &r.KernelOps
	}
	o.rec.Synced(s, r.Snapshot)
}
func (debugObserver) ServiceChanged(int)   {}
func (debugObserver) EndpointsChanged(int) {}
func (o debugObserver) ChangesPending(services, endpoints int) {
	o.rec.Pending(services, endpoints)
}
