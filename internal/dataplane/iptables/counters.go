package iptables

import (
	"context"
	"errors"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/nfacct"
	"github.com/kproxy/kproxy/internal/nfnl"
)

// Upstream's iptables mode counts two kinds of packet into nfacct counters
// (the conntrack-INVALID drops, and NodePort packets to 127.0.0.0/8) for
// its kubeproxy_iptables_*_packets_total metrics. The counters are created
// before every full sync, as upstream does, and the rules count into those
// that exist; a kernel without nfacct gets the same rules without the
// match, and the metrics are not served.

// countersRunner tells how to reach the kernel whose counters the rules
// use: only the real execs (this host, or a namespace through `ip netns
// exec`); a fake has none, so that tests create nothing in the kernel.
func countersRunner(ex Exec) (nsRunner, bool) {
	switch e := ex.(type) {
	case OSExec:
		return e, true
	case NetnsExec:
		if _, ok := e.Exec.(OSExec); e.Exec == nil || ok {
			return e, true
		}
	}
	return nil, false
}

// ensureCounters creates the counters where the rules run and records in
// p.counters which the next render may count into: those that exist, when
// the kernel also has the nfacct match. The counters are created even
// without the match, so that the metrics read 0 rather than fail. A failure
// is logged when the state changes (every full sync would repeat it).
func (p *Proxier) ensureCounters(ctx context.Context) {
	run, ok := countersRunner(p.exec)
	if !ok {
		p.counters = Counters{}
		return
	}
	var got Counters
	err := run.InNamespace(func() error {
		var errs []error
		for _, c := range []struct {
			name string
			on   *bool
		}{{nfacct.CTStateInvalidDropped, &got.InvalidDropped}, {nfacct.LocalhostNodePortsAccepted, &got.LocalhostAccepted}} {
			err := nfacct.Ensure(c.name)
			*c.on = err == nil
			errs = append(errs, err)
		}
		if err := p.nfacctMatch(); err != nil {
			got = Counters{}
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	})
	if err != nil && (got != p.counters || !p.countersTried) {
		klog.FromContext(ctx).Error(err, "Failed to prepare nfacct counters; the rules count nothing into them")
	}
	p.counters, p.countersTried = got, true
}

// nfacctMatch tells whether the kernel can run the nfacct match, on the
// nf_tables backend by asking its xtables compatibility (which loads the
// module as iptables-nft would). The legacy backend cannot be asked that
// way: the match is assumed there, as upstream assumes it everywhere.
func (p *Proxier) nfacctMatch() error {
	if p.backend != BackendNFT {
		return nil
	}
	compat := p.compat
	if compat == nil {
		compat = nfnl.CompatSupported
	}
	switch ok, err := compat(unix.NFPROTO_IPV4, "nfacct", 1, false); {
	case err != nil:
		return err
	case !ok:
		return errors.New("the kernel has no nfacct match (xt_nfacct)")
	}
	return nil
}

// deleteCounters removes the counters at cleanup, unless a rule still
// counts into them (ErrInUse: someone else's iptables mode runs). A kernel
// without nfacct has nothing to remove, and that is no failure.
func deleteCounters(ex Exec) error {
	run, ok := countersRunner(ex)
	if !ok {
		return nil
	}
	return run.InNamespace(func() error {
		if nfacct.Supported() != nil {
			return nil // a kernel without nfacct holds no counters
		}
		var errs []error
		for _, name := range []string{nfacct.CTStateInvalidDropped, nfacct.LocalhostNodePortsAccepted} {
			if err := nfacct.Delete(name); err != nil && !errors.Is(err, nfacct.ErrInUse) {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	})
}
