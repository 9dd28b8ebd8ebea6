package metrics

import (
	"time"

	"github.com/kproxy/kproxy/internal/model"
)

// SyncResult is one sync attempt of one IP family, as the sync loop saw it.
type SyncResult struct {
	Family model.Family
	// Full is true for a full resync, false for a partial one.
	Full     bool
	Duration time.Duration
	// End is when the attempt finished.
	End time.Time
	// Programmed is when the rules were in the kernel, before the conntrack
	// cleanup; the network programming latency and the last-sync timestamp
	// are taken then, as upstream does. Zero: End.
	Programmed time.Time
	// Err is nil when the dataplane was programmed.
	Err error
	// Snapshot is this family's programmed state; nil when Err is set.
	Snapshot *model.FamilySnapshot
	// TriggerTimes are the last-change-trigger-times of this family's
	// changes that the sync programmed; zero times are skipped.
	TriggerTimes []time.Time
}

// ObserveSync records one sync attempt: its duration always; on failure the
// mode's failure counter (nftables: nftables_sync_failures_total; iptables
// and ipvs: iptables_restore_failures_total, and in iptables mode for a
// partial sync iptables_partial_restore_failures_total); on success the last-sync
// timestamp, the network programming latency of each trigger time and the
// services without local endpoints.
func (m *Metrics) ObserveSync(r SyncResult) {
	if m == nil {
		return
	}
	m.SyncDuration(r.Family, r.Full, r.Duration)
	if r.Err != nil {
		m.syncFailed(r.Family, r.Full)
		return
	}
	programmed := r.Programmed
	if programmed.IsZero() {
		programmed = r.End
	}
	m.SyncSucceeded(r.Family, programmed)
	for _, t := range r.TriggerTimes {
		if !t.IsZero() {
			m.NetworkProgrammed(r.Family, programmed.Sub(t))
		}
	}
	if r.Snapshot != nil {
		internal, external := r.Snapshot.NoLocalEndpoints()
		if m.mode == ModeIPVS {
			// Upstream's IPVS mode counts Services, its other modes
			// Service ports.
			internal, external = r.Snapshot.NoLocalEndpointServices()
		}
		m.NoLocalEndpoints(r.Family, internal, external)
	}
}

func (m *Metrics) syncFailed(f model.Family, full bool) {
	switch m.mode {
	case ModeNFTables:
		m.NFTablesSyncFailed(f)
	case ModeIPTables, ModeIPVS:
		m.IPTablesRestoreFailed(f)
	}
	if m.mode == ModeIPTables && !full {
		// As upstream's iptables mode: every failed partial sync counts
		// (the next sync is a full one).
		m.IPTablesPartialRestoreFailed(f)
	}
}
