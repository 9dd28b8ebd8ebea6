package nftables

import (
	"context"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/dataplane/dptest"
	"github.com/kproxy/kproxy/internal/model"
)

// withStages makes every full sync of at least minPorts ports stage its new
// chains in transactions of about ops operations, for one test.
func withStages(t *testing.T, minPorts, ops int) {
	oldMin, oldOps := stageMinPorts, stageOps
	stageMinPorts, stageOps = minPorts, ops
	t.Cleanup(func() { stageMinPorts, stageOps = oldMin, oldOps })
}

// recordingNFT keeps the text of every transaction run, and fails the
// failAt-th (1-based; 0 never).
type recordingNFT struct {
	knftables.Interface
	txs    []string
	failAt int
}

func (r *recordingNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	r.txs = append(r.txs, tx.String())
	if len(r.txs) == r.failAt {
		return failErr{}
	}
	return r.Interface.Run(ctx, tx)
}

func newRecordingEnv(t *testing.T) (*applyEnv, map[knftables.Family]*recordingNFT) {
	e := newApplyEnv(t)
	return e, e.recordingRestart()
}

// recordingRestart replaces the Proxier, keeping the kernel, with one whose
// transactions on kproxy's tables are recorded.
func (e *applyEnv) recordingRestart() map[knftables.Family]*recordingNFT {
	recs := map[knftables.Family]*recordingNFT{}
	p, err := New(e.cfg, WithClock(e.clock), WithNFT(func(f knftables.Family, table string) (knftables.Interface, error) {
		inner, err := e.k.open(f, table)
		if err != nil || table != DefaultTableName {
			return inner, err
		}
		recs[f] = &recordingNFT{Interface: inner}
		return recs[f], nil
	}))
	if err != nil {
		e.t.Fatal(err)
	}
	e.p = p
	return recs
}

// A staged cold sync leaves the same table as one transaction would. Every
// stage but the last only adds the table, sets, empty fixed chains, and
// port chains with their rules: nothing a packet can reach before the last
// one, which holds every element, fixed rule, flush and deletion, and no
// new port chain.
func TestApplyStagedColdSync(t *testing.T) {
	withStages(t, 1, 10)
	e, recs := newRecordingEnv(t)
	snap := featureSnapshot()
	e.sync(snap, dataplane.SyncRequest{Full: true})
	e.checkKernel(snap)
	for _, f := range e.cfg.Families {
		txs := recs[nftFamily(f)].txs
		if want := map[model.Family]int{model.IPv4: 3, model.IPv6: 2}[f]; len(txs) < want {
			t.Fatalf("%s: %d transactions, want the sync staged into several", f, len(txs))
		}
		last := txs[len(txs)-1]
		staged := 0
		for i, tx := range txs[:len(txs)-1] {
			prefix := string(nftFamily(f)) + " " + DefaultTableName + " "
			for _, line := range strings.Split(strings.TrimSpace(tx), "\n") {
				rule, isRule := strings.CutPrefix(line, "add rule "+prefix)
				ok := strings.HasPrefix(line, "add table ") || strings.HasPrefix(line, "add set ") ||
					strings.HasPrefix(line, "add map ") || strings.HasPrefix(line, "add chain ") ||
					(isRule && isPortObject(strings.Fields(rule)[0]))
				if !ok {
					t.Errorf("%s: stage %d does more than add unreachable objects: %q", f, i, line)
				}
				if name, isChain := strings.CutPrefix(line, "add chain "+prefix); isChain && isPortObject(name) {
					staged++
					if strings.Contains(last, "add chain "+prefix+name+"\n") {
						t.Errorf("%s: chain %s staged and added again in the final transaction", f, name)
					}
				}
			}
		}
		if staged == 0 {
			t.Errorf("%s: no port chain was staged", f)
		}
		if !strings.Contains(last, "add element") || !strings.Contains(last, "add rule "+string(nftFamily(f))+" "+DefaultTableName+" nat-prerouting") {
			t.Errorf("%s: the final transaction lacks the elements or fixed rules:\n%s", f, last)
		}
	}
}

// A restart with everything in the kernel stages nothing: one transaction.
func TestApplyStagedRestartReuses(t *testing.T) {
	withStages(t, 1, 10)
	e := newApplyEnv(t)
	snap := featureSnapshot()
	e.sync(snap, dataplane.SyncRequest{Full: true})
	recs := e.recordingRestart()
	e.sync(snap, dataplane.SyncRequest{Full: true})
	e.checkKernel(snap)
	for f, r := range recs {
		if len(r.txs) != 1 {
			t.Errorf("%s: restart sent %d transactions, want 1", f, len(r.txs))
		}
	}
}

// A restart that finds a new Service stages only that Service's chains.
func TestApplyStagedRestartWithNewService(t *testing.T) {
	withStages(t, 1, 10)
	e := newApplyEnv(t)
	snap := featureSnapshot()
	e.sync(snap, dataplane.SyncRequest{Full: true})
	next := dptest.Snapshot(append(slices.Clone(snap.V4.Ports), dptest.Svc("zz", "new", "198.19.0.99", 80,
		dptest.WithEPs(dptest.EP("198.18.65.10", 8080, false), dptest.EP("198.18.65.11", 8080, false))))...)
	next.Node = snap.Node
	e.cfg.Families = []model.Family{model.IPv4}
	recs := e.recordingRestart()
	e.sync(next, dataplane.SyncRequest{Full: true})
	e.checkKernel(next)
	txs := recs[knftables.IPv4Family].txs
	if len(txs) != 2 || strings.Count(txs[0], "add chain ip kube-proxy svc-") != 1 || !strings.Contains(txs[0], "add chain ip kube-proxy svc-") ||
		!strings.Contains(txs[0], "zz/new") || strings.Contains(txs[0], "add element") ||
		strings.Count(txs[1], "add element ip kube-proxy "+mapEndpoints) != 2 || strings.Contains(txs[1], "add chain ip kube-proxy svc-") {
		t.Errorf("want one stage with the new Service's chain, then the rest:\n%s", strings.Join(txs, "\n----\n"))
	}
}

// A stage the kernel refuses fails the sync; the next sync is full, re-reads
// the kernel (which holds the stages before the failure) and converges.
func TestApplyStagedFailure(t *testing.T) {
	withStages(t, 1, 10)
	for _, failAt := range []int{1, 2, 3} {
		e, recs := newRecordingEnv(t)
		snap := featureSnapshot()
		// The first Sync opens the families' kernels; fail IPv4's.
		e.p.fams = map[model.Family]*famState{}
		if _, err := e.p.family(model.IPv4); err != nil {
			t.Fatal(err)
		}
		recs[knftables.IPv4Family].failAt = failAt
		if err := e.p.Sync(context.Background(), snap, dataplane.SyncRequest{Full: true}); err == nil {
			t.Fatalf("failAt %d: Sync succeeded despite a refused stage", failAt)
		}
		e.sync(snap, dataplane.SyncRequest{})
		e.checkKernel(snap)
	}
}

// Staging is only for large syncs: a small full sync stays one transaction.
func TestApplySmallSyncNotStaged(t *testing.T) {
	withStages(t, 1000, 10)
	e, recs := newRecordingEnv(t)
	e.sync(dptest.Snapshot(dptest.Svc("ns", "one", "198.19.0.30", 80, dptest.WithEPs(dptest.EP("198.18.65.10", 8080, false)))), dataplane.SyncRequest{Full: true})
	if n := len(recs[knftables.IPv4Family].txs); n != 1 {
		t.Errorf("%d transactions, want 1", n)
	}
}

// Port chains keep no rule text once written: after a staged cold sync, an
// incremental change, a restart and the repair of a flushed chain (which
// writes that chain again from a fresh rendering), nothing in the
// Proxier's state holds rules, and the kernel matches the rendering.
func TestApplyForgetsWrittenRules(t *testing.T) {
	withStages(t, 1, 10)
	e := newApplyEnv(t)
	noRules := func(when string) {
		t.Helper()
		for _, f := range e.cfg.Families {
			for id, ps := range e.p.fams[f].cur.Ports {
				for _, c := range ps.Chains {
					if len(c.Rules) > 0 {
						t.Fatalf("%s: %s: %s chain %s keeps %d rules", when, f, id, c.Name, len(c.Rules))
					}
				}
			}
		}
	}
	snap := scaleSnapshot(20, 3)
	e.sync(snap, dataplane.SyncRequest{Full: true})
	e.checkKernel(snap)
	noRules("cold sync")
	snap = withChangedEndpoint(snap, 4, 1)
	e.sync(snap, changed(snap, 4))
	e.checkKernel(snap)
	noRules("incremental sync")
	e.restart()
	e.sync(snap, dataplane.SyncRequest{Full: true})
	e.checkKernel(snap)
	noRules("restart")
	victim := e.p.fams[model.IPv4].cur.Ports[snap.V4.Ports[7].ID].Chains[0].Name
	tx := e.k.fake(model.IPv4).NewTransaction()
	tx.Flush(&knftables.Chain{Name: victim})
	if err := e.k.fake(model.IPv4).Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	e.p.fams[model.IPv4].suspect(map[string]bool{victim: true})
	e.sync(snap, dataplane.SyncRequest{})
	e.checkKernel(snap)
	noRules("repair")
}

// A bug that panics while a staged sync renders (here: a nil port, which
// the model never makes) fails that sync with the panic as its error,
// instead of ending the process from the rendering goroutine; chains
// already staged are unreachable, and the next sync converges.
func TestApplyStagedRenderPanicFailsTheSync(t *testing.T) {
	withStages(t, 1, 10)
	e := newApplyEnv(t)
	snap := scaleSnapshot(40, 3)
	bad := *snap
	v4 := *snap.V4
	v4.Ports = slices.Clone(v4.Ports)
	v4.Ports[30] = nil
	bad.V4 = &v4
	err := e.p.Sync(context.Background(), &bad, dataplane.SyncRequest{Full: true})
	if err == nil || !strings.Contains(err.Error(), "rendering the full sync panicked") {
		t.Fatalf("Sync = %v, want the rendering's panic as an error", err)
	}
	e.sync(snap, dataplane.SyncRequest{Full: true})
	e.checkKernel(snap)
}

// The same for a stage that panics while it is made or encoded (in
// nlKernel's encoding goroutine): ApplyStages returns it as an error,
// before sending anything.
func TestNetlinkStagePanicIsAnError(t *testing.T) {
	k := newNLKernel(model.IPv4, DefaultTableName, &genTracker{})
	stages := make(chan func() opList, 1)
	stages <- func() opList { panic("bad stage") }
	close(stages)
	err := k.ApplyStages(context.Background(), stages)
	if err == nil || !strings.Contains(err.Error(), "encoding a stage panicked: bad stage") {
		t.Fatalf("ApplyStages = %v, want the stage's panic as an error", err)
	}
	if k.batches != 0 {
		t.Errorf("%d batches sent", k.batches)
	}
}
