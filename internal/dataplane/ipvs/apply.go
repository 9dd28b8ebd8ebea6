package ipvs

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"syscall"

	libipvs "github.com/moby/ipvs"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/model"
)

// IPVS service flags (include/uapi/linux/ip_vs.h).
const (
	flagPersistent = 0x1
	flagHashed     = 0x2 // set by the kernel on every service it holds
	// flagMHFallback (IP_VS_SVC_F_SCHED1 under the mh scheduler): a client
	// whose bucket's real server is unavailable (weight 0 while it drains,
	// as kproxy and upstream keep a server that goes) is sent to another
	// instead of refused.
	flagMHFallback = 0x8
	// flagMHPort (IP_VS_SVC_F_SCHED2 under mh): the hash takes the
	// client's port too, so each connection lands anywhere. Upstream sets
	// it for --ipvs-scheduler mh (its FlagSourceHash).
	flagMHPort = 0x10
)

var protoNums = map[model.Protocol]uint16{model.TCP: syscall.IPPROTO_TCP, model.UDP: syscall.IPPROTO_UDP, model.SCTP: syscall.IPPROTO_SCTP}

// keyOf is the key of a kernel virtual server; ok is false for firewall-
// mark services and protocols kproxy does not program.
func keyOf(s *libipvs.Service) (vsKey, bool) {
	a, ok := netip.AddrFromSlice(s.Address)
	if !ok || s.FWMark != 0 {
		return vsKey{}, false
	}
	for p, n := range protoNums {
		if n == s.Protocol {
			return vsKey{addr: a.Unmap(), proto: p, port: s.Port}, true
		}
	}
	return vsKey{}, false
}

// service is the kernel form of a desired virtual server.
func service(vs *virtualServer) *libipvs.Service {
	s := &libipvs.Service{
		Address: vs.key.addr.AsSlice(), Protocol: protoNums[vs.key.proto], Port: vs.key.port,
		SchedName: vs.scheduler, AddressFamily: syscall.AF_INET, Netmask: 0xffffffff,
	}
	if vs.key.addr.Is6() {
		s.AddressFamily, s.Netmask = syscall.AF_INET6, 128
	}
	if vs.timeout > 0 {
		s.Flags, s.Timeout = flagPersistent, vs.timeout
	}
	flag, _ := vs.mhFlag()
	s.Flags |= flag
	return s
}

// mhFlag is the virtual server's mh scheduler flag and its ipvsadm name
// (0 and "" under another scheduler).
func (vs *virtualServer) mhFlag() (uint32, string) {
	switch {
	case vs.scheduler != "mh":
		return 0, ""
	case vs.mhPort:
		return flagMHPort, "mh-port"
	default:
		return flagMHFallback, "mh-fallback"
	}
}

// sameService reports whether the kernel's service has what vs asks for.
func sameService(k *libipvs.Service, vs *virtualServer) bool {
	want := service(vs)
	const mine = flagPersistent | flagMHFallback | flagMHPort
	return k.SchedName == want.SchedName && k.Flags&mine == want.Flags&mine &&
		(want.Flags&flagPersistent == 0 || k.Timeout == want.Timeout)
}

func destination(a netip.AddrPort, weight int) *libipvs.Destination {
	d := &libipvs.Destination{Address: a.Addr().AsSlice(), Port: a.Port(), Weight: weight,
		ConnectionFlags: libipvs.ConnectionFlagMasq, AddressFamily: syscall.AF_INET}
	if a.Addr().Is6() {
		d.AddressFamily = syscall.AF_INET6
	}
	return d
}

// apply makes the kernel hold want, in an order that never leaves a live
// frontend without what it needs: set members first (the masquerade
// rules match on them), then the iptables rules, the addresses, the
// virtual and real servers, and only then what goes away.
//
// The ip sets and iptables rules are the node's: their failure fails the
// sync. A Service's own kernel objects (its addresses on kube-ipvs0, its
// virtual and real servers) fail alone, as upstream's: the failure is
// logged, the rest is programmed, and since every sync renders every
// Service, the next (at the latest syncPeriod later) tries again. So a
// Service the kernel refuses (an annotation naming a scheduler this kernel
// lacks) neither fails the node's syncs nor keeps it unhealthy.
func (p *Proxier) apply(ctx context.Context, want []*desired, full bool) error {
	members := merge(want)
	if add := setRestore(members, p.members, true); add != "" {
		if err := p.k.IPSetRestore(add); err != nil {
			return fmt.Errorf("adding ip set members: %w", err)
		}
	}
	p.recordMembers(want, true)
	for _, d := range want {
		if err := p.applyRules(d, full); err != nil {
			return err
		}
	}
	var failed []error // a Service's kernel objects
	wantBound := map[netip.Addr]bool{}
	for _, d := range want {
		for a := range d.bound {
			wantBound[a] = true
			if !p.bound[a] {
				if err := p.k.AddDummyAddr(a); err != nil {
					failed = append(failed, fmt.Errorf("binding %s to %s: %w", a, DummyDevice, err))
					continue
				}
				p.bound[a] = true
			}
		}
	}
	wantServers := map[vsKey]bool{}
	for _, d := range want {
		for _, vs := range d.sortedServers() {
			wantServers[vs.key] = true
			failed = append(failed, p.applyServer(vs))
		}
	}
	failed = append(failed, p.deleteServers(ctx, wantServers))
	for a := range p.bound {
		if !wantBound[a] && p.handles(model.FamilyOf(a)) {
			if err := p.k.DelDummyAddr(a); err != nil {
				failed = append(failed, fmt.Errorf("unbinding %s from %s: %w", a, DummyDevice, err))
				continue
			}
			delete(p.bound, a)
		}
	}
	logFailed(ctx, failed)
	if del := setRestore(members, p.members, false); del != "" {
		if err := p.k.IPSetRestore(del); err != nil {
			return fmt.Errorf("deleting ip set members: %w", err)
		}
		p.recordMembers(want, false)
	}
	return nil
}

// logFailed logs each failure of a Service's kernel objects (nil entries
// are successes), one line each so that each names its Service.
func logFailed(ctx context.Context, failed []error) {
	logger := klog.FromContext(ctx)
	for _, err := range failed {
		if err == nil {
			continue
		}
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			logFailed(ctx, j.Unwrap())
			continue
		}
		logger.Error(err, "Programming a Service's IPVS state failed; retrying at the next sync")
	}
}

// handles reports whether family f is one this Proxier programs.
func (p *Proxier) handles(f model.Family) bool { return slices.Contains(p.cfg.Families, f) }

// applyRules writes the family's iptables rules when they changed and, on
// full syncs, makes sure the built-in chains jump to them.
func (p *Proxier) applyRules(d *desired, full bool) error {
	if p.rules[d.fam] != d.rules {
		if err := p.k.IPTablesRestore(d.fam, d.rules); err != nil {
			return fmt.Errorf("writing %s iptables rules: %w", d.fam, err)
		}
		p.rules[d.fam] = d.rules
	}
	if !full {
		return nil
	}
	for _, j := range jumps {
		if err := p.k.EnsureJump(d.fam, j); err != nil {
			return fmt.Errorf("adding the %s jump to %s: %w", j.chain, j.rule, err)
		}
	}
	return nil
}

// applyServer creates or updates one virtual server and its real servers.
// A real server that goes is deleted once it has no connections left
// (graceful termination): until then it stays with weight 0, so new
// connections go elsewhere and established ones finish. UDP real servers
// go at once (stale UDP flows are the conntrack cleaner's).
func (p *Proxier) applyServer(vs *virtualServer) error {
	ks := p.servers[vs.key]
	if ks == nil {
		s := service(vs)
		if err := p.k.NewService(s); err != nil {
			return fmt.Errorf("creating IPVS virtual server %s (%s): %w", vs.key, vs.owner, err)
		}
		ks = &kernelServer{svc: s, dests: map[netip.AddrPort]*libipvs.Destination{}}
		p.servers[vs.key] = ks
	} else if !sameService(ks.svc, vs) {
		s := service(vs)
		if err := p.k.UpdateService(s); err != nil {
			return fmt.Errorf("updating IPVS virtual server %s (%s): %w", vs.key, vs.owner, err)
		}
		ks.svc = s
	}
	var errs []error
	for _, r := range vs.reals {
		d := ks.dests[r]
		switch {
		case d == nil:
			d = destination(r, 1)
			if err := p.k.NewDestination(ks.svc, d); err != nil {
				errs = append(errs, fmt.Errorf("adding real server %s to %s (%s): %w", r, vs.key, vs.owner, err))
				continue
			}
			ks.dests[r] = d
		case d.Weight != 1:
			d = destination(r, 1)
			if err := p.k.UpdateDestination(ks.svc, d); err != nil {
				errs = append(errs, fmt.Errorf("restoring the weight of %s in %s (%s): %w", r, vs.key, vs.owner, err))
				continue
			}
			ks.dests[r] = d
		}
	}
	errs = append(errs, p.retire(ks, vs))
	return errors.Join(errs...)
}

// retire handles the kernel's real servers of ks that vs no longer has.
func (p *Proxier) retire(ks *kernelServer, vs *virtualServer) error {
	var gone []netip.AddrPort
	for r := range ks.dests {
		if _, ok := slices.BinarySearchFunc(vs.reals, r, netip.AddrPort.Compare); !ok {
			gone = append(gone, r)
		}
	}
	if len(gone) == 0 {
		return nil
	}
	// Fresh connection counts for the ones that may be draining.
	if dests, err := p.k.Destinations(ks.svc); err == nil {
		fresh := destMap(dests)
		for _, r := range gone {
			if d := fresh[r]; d != nil {
				ks.dests[r] = d
			} else {
				delete(ks.dests, r)
			}
		}
	}
	var errs []error
	for _, r := range gone {
		d := ks.dests[r]
		if d == nil {
			continue
		}
		// UDP and SCTP real servers go at once, as upstream's (a flow still
		// on one ends at its next packet: expire_nodest_conn); TCP ones
		// drain at weight 0 first.
		if vs.key.proto != model.TCP || d.ActiveConnections+d.InactiveConnections == 0 {
			if err := p.k.DelDestination(ks.svc, d); err != nil && !errors.Is(err, syscall.ENOENT) {
				errs = append(errs, fmt.Errorf("deleting real server %s of %s (%s): %w", r, vs.key, vs.owner, err))
				continue
			}
			delete(ks.dests, r)
			continue
		}
		if d.Weight != 0 {
			q := destination(r, 0)
			if err := p.k.UpdateDestination(ks.svc, q); err != nil {
				errs = append(errs, fmt.Errorf("quiescing real server %s of %s (%s): %w", r, vs.key, vs.owner, err))
				continue
			}
			q.ActiveConnections, q.InactiveConnections = d.ActiveConnections, d.InactiveConnections
			ks.dests[r] = q
		}
	}
	return errors.Join(errs...)
}

// deleteServers deletes the kernel's virtual servers of this Proxier's
// families that are not wanted, but those in excludeCIDRs.
func (p *Proxier) deleteServers(ctx context.Context, want map[vsKey]bool) error {
	var errs []error
	for k, ks := range p.servers {
		if want[k] || !p.handles(model.FamilyOf(k.addr)) || p.excluded(k.addr) {
			continue
		}
		if err := p.k.DelService(ks.svc); err != nil && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("deleting IPVS virtual server %s: %w", k, err))
			continue
		}
		klog.FromContext(ctx).V(4).Info("Deleted IPVS virtual server", "server", k)
		delete(p.servers, k)
	}
	return errors.Join(errs...)
}

// merge joins the families' set members under their full set names.
func merge(want []*desired) map[string]map[string]bool {
	out := map[string]map[string]bool{}
	for _, d := range want {
		for name, ms := range d.sets {
			out[familyName(name, d.fam)] = ms
		}
	}
	return out
}

// setRestore is the `ipset restore -exist` input that adds (add) or
// deletes (!add) the difference between want and have; adding also
// creates the sets. "" when there is nothing to do.
func setRestore(want, have map[string]map[string]bool, add bool) string {
	var b strings.Builder
	for _, s := range setSpecs {
		for _, f := range []model.Family{model.IPv4, model.IPv6} {
			name := familyName(s.name, f)
			ms, ok := want[name]
			if !ok {
				continue
			}
			if add && have[name] == nil {
				fmt.Fprintf(&b, "create %s %s %s\n", name, s.typ, s.createArgs(f))
			}
			for _, m := range sortedMembers(ms, have[name], add) {
				verb := "add"
				if !add {
					verb = "del"
				}
				fmt.Fprintf(&b, "%s %s %s\n", verb, name, m)
			}
		}
	}
	return b.String()
}

// sortedMembers returns, sorted, the members of want not in have (add) or
// of have not in want (!add).
func sortedMembers(want, have map[string]bool, add bool) []string {
	from, not := want, have
	if !add {
		from, not = have, want
	}
	var out []string
	for m := range from {
		if !not[m] {
			out = append(out, m)
		}
	}
	slices.Sort(out)
	return out
}

// recordMembers updates the mirror of the sets after an add (the wanted
// members are there) or a delete (only they are).
func (p *Proxier) recordMembers(want []*desired, add bool) {
	for name, ms := range merge(want) {
		have := p.members[name]
		if have == nil {
			have = map[string]bool{}
			p.members[name] = have
		}
		if add {
			for m := range ms {
				have[m] = true
			}
			continue
		}
		for m := range have {
			if !ms[m] {
				delete(have, m)
			}
		}
	}
}
