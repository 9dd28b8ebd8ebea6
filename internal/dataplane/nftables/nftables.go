// Package nftables is kproxy's nftables dataplane (--proxy-mode nftables;
// the default mode is iptables, as upstream's): it renders a model.Snapshot
// into one nftables table per IP family and keeps the kernel in step with it
// by sending only the difference, in one transaction per family.
package nftables

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"sync"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"sigs.k8s.io/knftables"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/model"
)

// DefaultTableName is the table kproxy programs when Config.TableName is
// empty: upstream kube-proxy's own, in families ip and ip6. Sharing the
// name is what makes a rollback to upstream clean. Upstream started in
// iptables or ipvs mode deletes the kube-proxy tables before anything else;
// started in nftables mode it takes the table over: it deletes and
// recreates the base chains (kproxy's have upstream's names, hooks and
// priorities), flushes the fixed chains it shares with kproxy, and flushes
// then deletes every chain with a "/" in its name that it does not use
// (all of kproxy's per-Service chains). The sets and maps whose names it
// shares with kproxy have the same definitions as upstream's; kproxy's
// others stay behind unreferenced, and go with the table in upstream's
// cleanup. A table of any other name would outlive a rollback, hooked in.
const DefaultTableName = "kube-proxy"

// legacyTable is the table older kproxy versions programmed: deleted once
// kproxy's own table is in place, and by Cleanup.
const legacyTable = "kproxy"

// tableComment is the comment of the tables kproxy creates. An existing
// table keeps its comment when kproxy takes it over in place.
const tableComment = "kproxy service proxy rules"

// Proxier is the nftables Dataplane. It is safe for use by one runner
// goroutine at a time (calls are serialised by a mutex).
type Proxier struct {
	cfg   dataplane.Config
	table string
	nft   NFTFactory
	// netlink selects the real kernel over netlink (nlKernel); WithNFT
	// replaces it with a knftables implementation.
	netlink bool
	clock   clock.PassiveClock

	mu   sync.Mutex
	fams map[model.Family]*famState
	// gen tracks the ruleset generation for Drifted (netlink only).
	gen *genTracker
	// mon is the nftables monitor Drifted reads (netlink only; opened by
	// the first Drifted, in the calling thread's network namespace).
	mon *monitorHandle
	// othersGone is set once the tables of other names (otherTables) were
	// removed.
	othersGone bool
}

var (
	_ dataplane.Dataplane = (*Proxier)(nil)
	_ dataplane.DryRunner = (*Proxier)(nil)
)

// Option customises a Proxier.
type Option func(*Proxier)

// WithNFT makes the Proxier program tables through knftables interfaces
// opened by f instead of its own netlink batches (the default, which never
// runs the nft binary). Tests pass a function returning knftables.NewFake.
func WithNFT(f NFTFactory) Option { return func(p *Proxier) { p.nft, p.netlink = f, false } }

// WithClock sets the clock used to age stale chains (default: real clock).
func WithClock(c clock.PassiveClock) Option { return func(p *Proxier) { p.clock = c } }

// New returns an nftables dataplane for cfg. It has no side effects: the
// kernel is first touched by Sync, Drifted or Cleanup.
func New(cfg dataplane.Config, opts ...Option) (*Proxier, error) {
	if cfg.MasqueradeBit < 0 || cfg.MasqueradeBit > 31 {
		return nil, fmt.Errorf("masqueradeBit %d is not in 0-31", cfg.MasqueradeBit)
	}
	p := &Proxier{cfg: cfg, table: cfg.TableName, netlink: true, gen: &genTracker{}, clock: clock.RealClock{}, fams: map[model.Family]*famState{}}
	if p.table == "" {
		p.table = DefaultTableName
	}
	if len(p.cfg.Families) == 0 {
		p.cfg.Families = []model.Family{model.IPv4}
	}
	for _, o := range opts {
		o(p)
	}
	return p, nil
}

// Name implements dataplane.Dataplane.
func (p *Proxier) Name() string { return "nftables" }

func nftFamily(f model.Family) knftables.Family {
	if f == model.IPv6 {
		return knftables.IPv6Family
	}
	return knftables.IPv4Family
}

// family returns the state of one family, opening its kernel handle lazily.
func (p *Proxier) family(f model.Family) (*famState, error) {
	if st := p.fams[f]; st != nil {
		return st, nil
	}
	var k kernel
	if p.netlink {
		k = newNLKernel(f, p.table, p.gen)
	} else {
		nft, err := p.nft(nftFamily(f), p.table)
		if err != nil {
			return nil, fmt.Errorf("opening nftables %s table %q: %w", nftFamily(f), p.table, err)
		}
		k = &knftKernel{nft: nft}
	}
	st := newFamState(f, k)
	p.fams[f] = st
	return st, nil
}

// Sync implements dataplane.Dataplane: one transaction per family.
func (p *Proxier) Sync(ctx context.Context, snap *model.Snapshot, req dataplane.SyncRequest) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for _, f := range p.cfg.Families {
		st, err := p.family(f)
		if err == nil {
			err = st.sync(ctx, p.cfg, snap.Family(f), snap.Node, req, p.clock.Now())
		}
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	p.removeOtherTables(ctx)
	return nil
}

// LastSyncOps returns the changes (rules and elements added, objects
// flushed or deleted; not the declarations of what exists) the last Sync
// sent to the kernel, over its families (dataplane.OpCounter).
func (p *Proxier) LastSyncOps() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, st := range p.fams {
		if st != nil {
			n += st.lastOps
		}
	}
	return n
}

// LastSyncFull implements dataplane.FullReporter: whether the last Sync
// was full in some family.
func (p *Proxier) LastSyncFull() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, st := range p.fams {
		if st != nil && st.lastFull {
			return true
		}
	}
	return false
}

// LastSyncCleanupFailed implements dataplane.CleanupReporter: the
// families whose deletion of stale chains and sets failed in the last Sync.
func (p *Proxier) LastSyncCleanupFailed() []model.Family {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []model.Family
	for _, f := range p.cfg.Families {
		if st := p.fams[f]; st != nil && st.cleanupFailed {
			out = append(out, f)
		}
	}
	return out
}

// SetServiceCIDRs replaces Config.ServiceCIDRs, the cluster's service IP
// ranges (both families mixed; from the ServiceCIDR objects, as upstream's
// OnServiceCIDRsChanged receives them). New connections to an address in
// them that is not an allocated ClusterIP are dropped. It does not touch
// the kernel: the change lands with the next Sync of any kind (an
// incremental one rewrites only the ranges' set, atomically with whatever
// else it sends), so the caller should trigger a sync after a change.
// Upstream applies a change only at its next full sync.
func (p *Proxier) SetServiceCIDRs(cidrs []netip.Prefix) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cfg.ServiceCIDRs = slices.Clone(cidrs)
}

// otherTables are the tables, besides the one kproxy programs, that hold
// service proxy rules: older kproxy versions' and upstream's (when
// Config.TableName is not upstream's name).
func (p *Proxier) otherTables() []string {
	var out []string
	for _, t := range []string{legacyTable, DefaultTableName} {
		if t != p.table {
			out = append(out, t)
		}
	}
	return out
}

// removeOtherTables deletes otherTables once kproxy's own table is in
// place, so that a node switching proxies never lacks rules.
func (p *Proxier) removeOtherTables(ctx context.Context) {
	if p.othersGone {
		return
	}
	var errs []error
	for _, f := range p.cfg.Families {
		for _, t := range p.otherTables() {
			errs = append(errs, p.deleteTable(ctx, f, t))
		}
	}
	if err := errors.Join(errs...); err != nil {
		klog.FromContext(ctx).Error(err, "Removing other nftables service proxy tables failed; retrying at the next sync")
		return
	}
	p.othersGone = true
}

// Drifted implements dataplane.Dataplane. Over netlink it reads the
// ruleset generation and the pending notifications of an nftables monitor
// socket (both ~0.1 ms): any change to kproxy's tables committed by someone
// else (a table, chain or map deleted or flushed, one Service chain
// flushed, a rule added) is drift, and names what to repair. Only when the
// monitor may have missed something (just opened, or its buffer overran)
// and the generation moved does it fall back to asking for each fixed
// chain by name and counting the rules of two canary chains (~4 ms at 10k
// Services). It never lists the table.
func (p *Proxier) Drifted(ctx context.Context) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.netlink {
		return p.checkByName(ctx)
	}
	cur, err := rulesetGeneration()
	if err != nil {
		return false, fmt.Errorf("reading the nftables generation: %w", err)
	}
	rep, watched := p.watch(ctx)
	if p.reportTouched(ctx, rep) {
		return true, nil
	}
	if watched || (cur == p.gen.verified && cur != 0) {
		p.gen.verified = cur
		return false, nil
	}
	drifted, err := p.checkByName(ctx)
	if err == nil && !drifted {
		p.gen.verified = cur
	}
	return drifted, err
}

// watch reads the monitor, opening it on first use. watched is true when
// it has seen every commit since it was last read.
func (p *Proxier) watch(ctx context.Context) (rep monitorReport, watched bool) {
	if p.mon == nil {
		h, err := openMonitor()
		if err != nil {
			klog.FromContext(ctx).V(2).Info("No nftables monitor; drift is checked by name only", "err", err)
			return rep, false
		}
		p.mon = h
		rep, _ = p.mon.m.read(p.table) // whatever is queued already
		return rep, false
	}
	rep, err := p.mon.m.read(p.table)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Reading nftables notifications failed; reopening the monitor")
		p.mon = nil
		return rep, false
	}
	return rep, !rep.lost
}

// reportTouched marks the synced families whose tables someone else
// changed for repair by the next full sync, and reports whether any was.
func (p *Proxier) reportTouched(ctx context.Context, rep monitorReport) bool {
	drifted := false
	for _, f := range p.cfg.Families {
		st := p.fams[f]
		names := rep.touched[f]
		if st == nil || st.cur == nil || len(names) == 0 {
			continue
		}
		drifted = true
		st.suspect(names)
		klog.FromContext(ctx).Info("nftables table changed behind kproxy's back; the next full sync repairs it",
			"family", f, "table", p.table, "objects", sortedNames(names, 5))
	}
	return drifted
}

// checkByName checks every synced family by name (see famState.drifted).
func (p *Proxier) checkByName(ctx context.Context) (bool, error) {
	for _, f := range p.cfg.Families {
		st := p.fams[f]
		if st == nil || !st.valid {
			continue // never synced: nothing to drift from
		}
		drifted, err := st.drifted(ctx)
		if err != nil {
			return false, fmt.Errorf("checking %s nftables table: %w", f, err)
		}
		if drifted {
			klog.FromContext(ctx).Info("nftables table changed behind kproxy's back; the next full sync repairs it", "family", f, "table", p.table)
			st.distrust = true
			return true, nil
		}
	}
	return false, nil
}

// drifted checks one family's table by asking for each fixed chain by name
// and counting the rules of two canary chains, never listing the table.
func (st *famState) drifted(ctx context.Context) (bool, error) {
	names := make([]string, len(st.cur.Chains))
	for i, c := range st.cur.Chains {
		names[i] = c.Name
	}
	missing, err := st.kern.MissingChain(ctx, names)
	if err != nil || missing != "" {
		return missing != "", err
	}
	for _, canary := range []string{chainNATPrerouting, chainServices} {
		n, err := st.kern.RuleCount(ctx, canary)
		if err != nil {
			return false, err
		}
		if n == 0 {
			return true, nil
		}
	}
	return false, nil
}

// Cleanup implements dataplane.Dataplane: it deletes kproxy's tables, older
// kproxy versions' and upstream kube-proxy's nftables tables in both
// families. iptables leftovers are the iptables backend's job.
func (p *Proxier) Cleanup(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for _, f := range []model.Family{model.IPv4, model.IPv6} {
		for _, table := range append([]string{p.table}, p.otherTables()...) {
			errs = append(errs, p.deleteTable(ctx, f, table))
		}
		delete(p.fams, f)
	}
	return errors.Join(errs...)
}

func (p *Proxier) deleteTable(ctx context.Context, f model.Family, table string) error {
	if p.netlink {
		if err := newNetlinkReader(f, table).deleteTable(table); err != nil {
			return fmt.Errorf("deleting nftables table %s %s: %w", nftFamily(f), table, err)
		}
		return nil
	}
	nft, err := p.nft(nftFamily(f), table)
	if err != nil {
		klog.FromContext(ctx).V(2).Info("nftables not usable; nothing to clean up", "family", f, "err", err)
		return nil
	}
	tx := nft.NewTransaction()
	tx.Delete(&knftables.Table{})
	if err := nft.Run(ctx, tx); err != nil && !knftables.IsNotFound(err) {
		return fmt.Errorf("deleting nftables table %s %s: %w", nftFamily(f), table, err)
	}
	return nil
}

// Render implements dataplane.DryRunner: the nft -f text that creates the
// desired tables of every configured family from scratch.
func (p *Proxier) Render(w io.Writer, snap *model.Snapshot) error {
	for _, f := range p.cfg.Families {
		d := render(p.cfg, snap.Family(f), snap.Node)
		if _, err := io.WriteString(w, renderText(d, p.table)); err != nil {
			return err
		}
	}
	return nil
}

// renderText is the nft -f text creating d from an empty table.
func renderText(d *desired, table string) string {
	st := &famState{fam: d.Family, kernelMirror: emptyMirror()}
	var t txn
	st.fullOps(d, &t)
	tx := knftables.NewFake(nftFamily(d.Family), table).NewTransaction()
	for o := range t.ops().all {
		if o.verb == opAdd {
			tx.Add(o.object())
		}
	}
	return tx.String()
}
