package nftables

import (
	"cmp"
	"context"
	"fmt"
	"runtime/debug"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"
	"sigs.k8s.io/knftables"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/model"
)

// elemRef is one desired element of a shared set or map and how many
// service ports want it.
type elemRef struct {
	e *element // in the portState that rendered it (immutable)
	n int
}

// famState is what the backend knows about one family's table: the render
// it last applied (desiredState) and what it believes the kernel holds
// (kernelMirror). A sync diffs the next render against both: fullsync.go
// (every port), incremental.go (the changed ports), txn.go (the
// transaction it sends), mirror.go (reading the kernel, stale objects).
type famState struct {
	fam  model.Family
	kern kernel
	// replace makes the next full sync replace the whole table in its one
	// transaction (delete it, then write everything), set when the table
	// holds per-Service chains kproxy did not make (upstream kube-proxy's,
	// whose references kproxy's stale deletion does not know) or after a
	// full sync failed (a definition kproxy cannot take over in place).
	// The replacement is atomic, so traffic sees the old rules or the new
	// ones, never neither; it is never staged.
	replace bool
	// lastOps counts the changes the last sync sent (opList.changes);
	// lastFull is whether that sync was full.
	lastOps  int
	lastFull bool
	// cleanupFailed is whether the sync's deletion of stale objects
	// failed (kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total).
	cleanupFailed bool
	now           time.Time // start of the current sync
	// affinityGone are affinity ids whose endpoints left, and affinityAll
	// asks to sweep every id no port has: sweepAffinity's work.
	affinityGone map[uint32]bool
	affinityAll  bool

	desiredState
	kernelMirror
}

// desiredState is the render last applied, per port, and the union of the
// ports' elements.
type desiredState struct {
	r     *renderer
	slots *slotAlloc // endpoints-map blocks, kept across syncs
	cur   *desired
	// last is the snapshot cur was rendered from: which ServicePort each
	// port of cur is, and a Service's ports, without maps of its own (two
	// maps keyed by port ID were ~3.7 MB at 10k Services). A failed sync
	// makes the next one full, which renders every port of its snapshot.
	last *model.FamilySnapshot
	// want is the refcounted union of the ports' elements, per set (but
	// for the endpoint-ranges maps, whose blocks are the ports' Fills, and
	// the hairpin set, counted in hairpins).
	want     map[string]map[string]elemRef
	hairpins map[hairpinKey]int32
}

// kernelMirror is what kproxy believes the kernel's table holds.
type kernelMirror struct {
	// valid is false until the kernel was read (or after a failed apply);
	// the next sync is then full and re-reads the kernel.
	valid bool
	// distrust makes the next full sync rewrite every chain, not only the
	// missing ones (after drift: chains may have been flushed).
	distrust bool
	// suspects are port chains someone else changed: the next full sync
	// (which re-reads the kernel) rewrites them.
	suspects map[string]bool
	// kChains, kSets mirror the kernel's port chains and port sets. kElems
	// holds the shared-set elements read from the kernel (key -> value),
	// only until the next successful commit: from then on the kernel holds
	// exactly want, so keeping a second copy of 100k+ elements is waste.
	kChains map[string]bool
	kSets   map[string]bool
	kElems  map[string]map[string]string
	// kRanges holds the endpoint-ranges maps' elements read from the
	// kernel, like kElems (and set when it is).
	kRanges map[string][]kernelRange
	// kMaps are the endpoint-ranges maps in the kernel.
	kMaps map[string]bool
	stale map[string]time.Time // port chains and sets to delete
}

// sharedSets are the sets and maps whose elements come from service ports.
var sharedSets = makeSharedSets()

func makeSharedSets() []*set {
	var out []*set
	for _, s := range (&renderer{addrType: "ipv4_addr", ipX: "ip"}).knownSets() {
		if !isConfigSet(s.Name) && !isDynamicSet(s.Name) {
			out = append(out, s)
		}
	}
	return out
}

// sharedMaps names the shared sets that are maps.
var sharedMaps = makeSharedMaps()

func makeSharedMaps() map[string]bool {
	out := map[string]bool{}
	for _, s := range sharedSets {
		out[s.Name] = s.IsMap
	}
	return out
}

// isMapName reports whether a shared set is a map.
func isMapName(name string) bool { return sharedMaps[name] }

func newFamState(fam model.Family, k kernel) *famState {
	return &famState{fam: fam, kern: k, kernelMirror: kernelMirror{stale: map[string]time.Time{}, kMaps: map[string]bool{}}}
}

// sync makes the kernel match fs. full re-renders everything; otherwise only
// ports whose ServicePort changed (by pointer) or whose Service is in changed.
func (st *famState) sync(ctx context.Context, cfg dataplane.Config, fs *model.FamilySnapshot, node model.NodeInfo, req dataplane.SyncRequest, now time.Time) error {
	logger := klog.FromContext(ctx)
	st.now = now
	st.cleanupFailed = false
	st.deleteStale(ctx)
	full := req.Full || req.NodeChanged || !st.valid || st.cur == nil
	st.lastFull = full
	var t txn
	var err error
	if full {
		err = st.readIfUnsure(ctx)
	}
	switch {
	case err != nil:
	case full && len(fs.Ports) >= stageMinPorts && !st.replace:
		logger.V(4).Info("Applying a full sync in stages", "family", st.fam, "ports", len(fs.Ports))
		err = st.syncStaged(ctx, cfg, fs, node, &t)
	default:
		if full {
			st.renderFull(cfg, fs, node, &t, nil)
		} else {
			st.prepareIncremental(fs, req, &t)
			st.refreshServiceCIDRs(cfg, &t)
		}
		st.lastOps = t.ops().changes()
		logger.V(4).Info("Applying nftables changes", "family", st.fam, "full", full, "operations", t.ops().len(), "changes", st.lastOps, "replace", st.replace)
		err = st.kern.Apply(ctx, t.ops())
	}
	if st.r != nil && len(st.r.full) > 0 {
		logger.Info("No room left in an endpoint-ranges map; these Service ports pick endpoints with plain rules (their endpoint changes are rule changes)",
			"family", st.fam, "ports", st.r.full[:min(10, len(st.r.full))], "count", len(st.r.full))
		st.r.full = nil
	}
	if err != nil {
		st.valid = false
		if full && !st.replace {
			logger.Info("A full sync failed; the next one replaces the table", "family", st.fam)
			st.replace = true
		}
		return fmt.Errorf("syncing %s nftables table: %w", st.fam, err)
	}
	st.commit(&t)
	st.affinityAll = st.affinityAll || full
	if err := st.sweepAffinity(ctx); err != nil {
		logger.Error(err, "Deleting the session affinity of endpoints that left failed; retrying at the next sync", "family", st.fam)
	}
	return nil
}

// syncStaged is a full sync whose new port chains go to the kernel in
// stages while the rest is still being rendered: rendering and diffing run
// in a goroutine of their own, the kernel reads (which must happen in the
// calling goroutine's network namespace) before it starts.
func (st *famState) syncStaged(ctx context.Context, cfg dataplane.Config, fs *model.FamilySnapshot, node model.NodeInfo, t *txn) error {
	stages := make(chan func() opList, stageQueue)
	stop, done := make(chan struct{}), make(chan struct{})
	var renderErr error
	var ops atomic.Int64 // stages are made in ApplyStages' encoding goroutine
	defer func() { st.lastOps = int(ops.Load()) }()
	go func() {
		defer close(done)
		defer close(stages)
		renderErr = catch("rendering the full sync", func() {
			st.renderFull(cfg, fs, node, t, func(stage func() opList) bool {
				counted := func() opList {
					l := stage()
					ops.Add(int64(l.changes()))
					return l
				}
				select {
				case stages <- counted:
					return true
				case <-stop:
					return false
				}
			})
		})
	}()
	err := st.kern.ApplyStages(ctx, stages)
	close(stop)
	<-done
	// A rendering that panicked closed the stages early: what was
	// applied is only some unreachable chains, and the sync failed.
	return cmp.Or(renderErr, err)
}

// catch runs f and turns a panic into an error carrying its stack: in a
// goroutine of a sync, a bug must fail that sync (which the runner
// retries, as it does when the sync itself panics), not end the process.
func catch(what string, f func()) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%s panicked: %v\n%s", what, p, debug.Stack())
		}
	}()
	f()
	return nil
}

// commit records a successful transaction in the kernel mirror.
func (st *famState) commit(t *txn) {
	st.valid, st.distrust, st.suspects, st.replace = true, false, nil, false
	for _, o := range t.chains {
		if c, ok := o.obj.(*knftables.Chain); ok && isPortObject(c.Name) {
			st.kChains[c.Name] = true
		}
	}
	for _, c := range t.fresh {
		st.kChains[c.Name] = true
	}
	for name := range t.maps {
		st.kMaps[name] = true
	}
	for _, ps := range t.rendered {
		forgetRules(ps.Chains)
	}
	// The kernel now holds exactly want in every shared set.
	st.kElems, st.kRanges = nil, nil
}
