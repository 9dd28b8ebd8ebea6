// Package iptables is kproxy's iptables dataplane (--proxy-mode iptables,
// the default mode). It renders a model.Snapshot into upstream kube-proxy's
// chain layout with a pure function and writes only the chains that
// changed: on the nf_tables backend as nf_tables netlink transactions
// encoded as iptables-nft would (netlink.go; on where writer.go finds it
// safe: a proven iptables-nft version and kernel support),
// on the legacy backend, for missing jumps from built-in chains, and for
// what netlink.go does not translate (rule deletions), with
// iptables-restore --noflush.
package iptables

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/nfnl"
)

// Proxier is the iptables Dataplane. Calls are serialised by a mutex.
type Proxier struct {
	cfg       dataplane.Config
	exec      Exec
	sysctl    Sysctl
	localhost bool
	backend   Backend // "" until detected
	netlink   bool    // write over netlink on nf_tables (default true)
	unproven  bool    // ... whatever iptables-nft's version (WithUnprovenNetlink)
	// writer is how rules are written (WriterNetlink, WriterRestore), and
	// writerWhy why not over netlink; chosen at the first sync.
	writer, writerWhy string
	writerChosen      bool
	// compat asks the kernel for an xtables module (nil:
	// nfnl.CompatSupported; tests fake it).
	compat func(fam byte, name string, rev uint32, target bool) (bool, error)
	// writes counts the transactions written over netlink and with
	// iptables-restore (tests read it).
	writes struct{ netlink, restore atomic.Int64 }
	// pool lends netlink batches the chunks of sent ones while a sync
	// writes chains ahead (nil otherwise, so that nothing stays held).
	pool *nfnl.Pool

	mu      sync.Mutex
	liberal bool
	// counters are the nfacct counters the rules count into, decided
	// before each full sync (counters.go).
	counters      Counters
	countersTried bool
	fams          map[model.Family]*famState
}

// LastSyncFull implements dataplane.FullReporter: whether the last Sync
// was full in some family (famState.full).
func (p *Proxier) LastSyncFull() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, st := range p.fams {
		if st.full {
			return true
		}
	}
	return false
}

var (
	_ dataplane.Dataplane = (*Proxier)(nil)
	_ dataplane.DryRunner = (*Proxier)(nil)
)

// Option customises a Proxier.
type Option func(*Proxier)

// WithExec sets how iptables programs run (default OSExec).
func WithExec(e Exec) Option { return func(p *Proxier) { p.exec = e } }

// WithSysctl sets how kernel parameters are read and written (default
// ProcSysctl).
func WithSysctl(s Sysctl) Option { return func(p *Proxier) { p.sysctl = s } }

// WithBackend forces the iptables backend instead of detecting it.
func WithBackend(b Backend) Option { return func(p *Proxier) { p.backend = b } }

// WithLocalhostNodePorts sets iptables.localhostNodePorts (default true, as
// upstream): NodePorts answer on 127.0.0.1 (IPv4) with route_localnet=1.
func WithLocalhostNodePorts(on bool) Option { return func(p *Proxier) { p.localhost = on } }

// WithNetlink sets whether writes on the nf_tables backend go straight
// over netlink (default true) or always through iptables-restore.
func WithNetlink(on bool) Option { return func(p *Proxier) { p.netlink = on } }

// WithUnprovenNetlink lets the netlink writer run with an iptables-nft
// version it was not proven against (to prove one: writer.go).
func WithUnprovenNetlink() Option { return func(p *Proxier) { p.unproven = true } }

// New returns an iptables dataplane for cfg. It has no side effects: the
// kernel is first touched by Sync, Drifted or Cleanup.
func New(cfg dataplane.Config, opts ...Option) (*Proxier, error) {
	if cfg.MasqueradeBit < 0 || cfg.MasqueradeBit > 31 {
		return nil, fmt.Errorf("masqueradeBit %d is not in 0-31", cfg.MasqueradeBit)
	}
	if len(cfg.Families) == 0 {
		cfg.Families = []model.Family{model.IPv4}
	}
	p := &Proxier{cfg: cfg, exec: OSExec{}, sysctl: ProcSysctl{}, localhost: !cfg.NoLocalhostNodePorts, netlink: !cfg.NoIPTablesNetlink, fams: map[model.Family]*famState{}}
	for _, o := range opts {
		o(p)
	}
	return p, nil
}

// Name implements dataplane.Dataplane.
func (p *Proxier) Name() string { return "iptables" }

func (p *Proxier) params() Params {
	return Params{Config: p.cfg, LocalhostNodePorts: p.localhost, ConntrackLiberal: p.liberal, Counters: p.counters}
}

// Sync implements dataplane.Dataplane: per family, a full sync (the first,
// after a failure, on a Node change or when req.Full) or a partial one of
// the changed Services' chains. Writes go over netlink or through
// iptables-restore as restore (apply.go) decides; a failed family makes
// its next sync full.
func (p *Proxier) Sync(ctx context.Context, snap *model.Snapshot, req dataplane.SyncRequest) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.backend == "" {
		p.backend = DetectBackend(ctx, p.exec)
		klog.FromContext(ctx).Info("Using iptables backend", "backend", p.backend)
		if err := cleanupBackend(ctx, p.exec, p.backend.other(), true); err != nil {
			klog.FromContext(ctx).Error(err, "Could not remove rules from the other iptables backend", "backend", p.backend.other())
		}
	}
	if !p.writerChosen {
		p.chooseWriter(ctx)
	}
	var errs []error
	for _, f := range p.cfg.Families {
		st := p.fams[f]
		if st == nil {
			st = &famState{fam: f}
			p.fams[f] = st
		}
		full := req.Full || req.NodeChanged || !st.valid
		st.full = false
		st.writtenMu.Lock()
		st.written = map[string]int{}
		st.writtenMu.Unlock()
		var err error
		if full {
			err = p.fullSync(ctx, st, snap)
		} else {
			err = p.partialSync(ctx, st, snap, req.Changed)
		}
		if err != nil {
			st.valid = false // the next sync is full
			errs = append(errs, fmt.Errorf("%s iptables sync (full=%v): %w", f, full, err))
		}
	}
	return errors.Join(errs...)
}

// RuleCounts implements dataplane.RuleCounter: per family and table
// (nat, filter), the rules kproxy owns and those the last sync wrote.
func (p *Proxier) RuleCounts() []dataplane.RuleCount {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []dataplane.RuleCount
	for _, f := range p.cfg.Families {
		st := p.fams[f]
		if st == nil || !st.valid {
			continue
		}
		total, written := st.ruleCounts()
		for _, t := range []string{tableFilter, tableNAT} {
			out = append(out, dataplane.RuleCount{Family: f, Table: t, Total: total[t], LastSync: written[t]})
		}
	}
	return out
}

// Init implements dataplane.Initializer: route_localnet is set (when
// localhost NodePorts are on) before the first sync, and a failure stops
// the proxy, as upstream's iptables proxier fails to start.
func (p *Proxier) Init(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.prepareSysctls(ctx)
}

// prepareSysctls sets route_localnet when localhost NodePorts are on and
// reads nf_conntrack_tcp_be_liberal; done at Init and before each full
// sync (someone may have reset it).
func (p *Proxier) prepareSysctls(ctx context.Context) error {
	if LocalhostNodePortsActive(p.params()) && hasFamily(p.cfg.Families, model.IPv4) {
		if v, err := p.sysctl.Get(sysctlRouteLocalnet); err != nil || v != 1 {
			klog.FromContext(ctx).Info("Setting route_localnet=1 to allow node-ports on localhost; to change this either disable iptables.localhostNodePorts (--iptables-localhost-nodeports) or set nodePortAddresses (--nodeport-addresses) to filter loopback addresses")
			if err := p.sysctl.Set(sysctlRouteLocalnet, 1); err != nil {
				return fmt.Errorf("setting %s: %w", sysctlRouteLocalnet, err)
			}
		}
	}
	v, err := p.sysctl.Get(sysctlTCPBeLiberal)
	p.liberal = err == nil && v != 0
	return nil
}

func hasFamily(fs []model.Family, f model.Family) bool {
	for _, x := range fs {
		if x == f {
			return true
		}
	}
	return false
}

// Drifted implements dataplane.Dataplane: mangle, nat and filter must each
// still hold their canary mark (canary.go), which a flush of the table
// removes.
func (p *Proxier) Drifted(ctx context.Context) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, f := range p.cfg.Families {
		st := p.fams[f]
		if st == nil || !st.valid {
			continue
		}
		for _, table := range []string{tableMangle, tableNAT, tableFilter} {
			if !p.canaryOK(ctx, f, table) {
				klog.FromContext(ctx).Info("iptables canary gone; the next full sync repairs the rules", "family", f, "table", table)
				st.valid = false
				return true, nil
			}
		}
	}
	return false, nil
}

// Cleanup implements dataplane.Dataplane: it removes kproxy's and upstream
// kube-proxy's iptables chains and jumps in both backends and families,
// then the nfacct counters their rules counted into.
func (p *Proxier) Cleanup(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fams = map[model.Family]*famState{}
	err := errors.Join(cleanupBackend(ctx, p.exec, BackendNFT, false), cleanupBackend(ctx, p.exec, BackendLegacy, false))
	if err != nil {
		return err // the rules may still count into the counters
	}
	return deleteCounters(p.exec)
}

// Render implements dataplane.DryRunner: the iptables-restore input that
// creates every family's rules from scratch, one block per family.
func (p *Proxier) Render(w io.Writer, snap *model.Snapshot) error {
	for _, f := range p.cfg.Families {
		rs := Render(p.params(), snap.Family(f), snap.Node)
		if _, err := fmt.Fprintf(w, "# %s (%s)\n%s", f, tool(f), RestoreText(rs)); err != nil {
			return err
		}
	}
	return nil
}

func tool(f model.Family) string {
	if f == model.IPv6 {
		return "ip6tables-restore --noflush"
	}
	return "iptables-restore --noflush"
}

// RestoreText is the iptables-restore --noflush input creating rs.
func RestoreText(rs *Ruleset) string {
	return restoreText(rulesetWrites(rs)...)
}

// rulesetWrites is a whole ruleset as restore sections.
func rulesetWrites(rs *Ruleset) []*tableWrite {
	ws := []*tableWrite{{table: tableMangle, chains: rs.Mangle}, {table: tableFilter, chains: rs.Filter}, {table: tableNAT, chains: rs.NAT}}
	for _, j := range rs.Jumps {
		for _, w := range ws {
			if w.table == j.Table {
				w.inserts = append(w.inserts, j)
			}
		}
	}
	return ws
}
