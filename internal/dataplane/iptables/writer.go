package iptables

import (
	"context"
	"fmt"
	"regexp"
	"slices"

	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/nfnl"
)

// The netlink writer (netlink.go) writes rules in the encoding iptables-nft
// gives them, so that iptables-nft reads them back (iptables-save, -L,
// upstream's iptables-nft-restore after a rollback). That encoding belongs
// to iptables-nft and may change between its releases: kproxy writes over
// netlink only on a node whose iptables-nft is a version the writer was
// proven against, and whose kernel has every xtables match and target the
// writer uses. Otherwise, and with the writer turned off, rules go through
// iptables-restore.
//
// Proving a version: install it, run
//
//	sudo go test -run 'TestPrivilegedNetlinkMatchesIPTables|TestPrivilegedVerifyMatrix' ./internal/dataplane/iptables/
//
// (the first writes the feature rulesets both ways, unproven versions
// included, and compares iptables-nft-save's output; the second traces
// the policy matrix through what iptables-save reads back), and add the
// version below.

// ProvenVersions are the iptables-nft versions the netlink writer's
// encoding was proven against.
var ProvenVersions = []string{"1.8.9"}

// Writer names how rules reach the kernel (the kproxy_iptables_writer
// metric's label).
const (
	WriterNetlink = "netlink"
	WriterRestore = "iptables-restore"
)

// xtModules are the xtables matches and targets (name, revision) the
// netlink writer encodes.
var xtModules = []struct {
	name   string
	rev    uint32
	target bool
}{
	{"comment", 0, false}, {"tcp", 0, false}, {"udp", 0, false}, {"sctp", 0, false},
	{"conntrack", 3, false}, {"addrtype", 1, false}, {"statistic", 0, false}, {"recent", 1, false},
	{"DNAT", 2, true}, {"MARK", 2, true}, {"MASQUERADE", 0, true}, {"REJECT", 0, true},
}

var versionRE = regexp.MustCompile(`v(\d+\.\d+\.\d+)`)

// iptablesVersion is the version `<iptables> --version` prints.
func iptablesVersion(ctx context.Context, ex Exec, cmd string) (string, error) {
	out, err := ex.Run(ctx, nil, cmd, "--version")
	if err != nil {
		return "", err
	}
	m := versionRE.FindSubmatch(out)
	if m == nil {
		return "", fmt.Errorf("%s --version printed %q", cmd, out)
	}
	return string(m[1]), nil
}

// chooseWriter decides, once the backend is known, whether writes go over
// netlink, and logs why. It needs the nf_tables backend, the writer
// enabled (WithNetlink), a proven iptables-nft version (unless
// WithUnprovenNetlink) in every family, and the kernel's support of every
// xtables module the writer uses, probed where the programs run.
func (p *Proxier) chooseWriter(ctx context.Context) {
	p.writerChosen = true
	p.writer, p.writerWhy = WriterRestore, ""
	switch {
	case !p.netlink:
		p.writerWhy = "the netlink writer is turned off"
	case p.backend != BackendNFT:
		p.writerWhy = "the legacy backend is in use"
	default:
		p.writerWhy = p.netlinkObstacle(ctx)
	}
	if p.writerWhy == "" {
		p.writer = WriterNetlink
		klog.FromContext(ctx).Info("Writing iptables rules over netlink, in iptables-nft's encoding", "provenVersions", ProvenVersions)
		return
	}
	klog.FromContext(ctx).Info("Writing iptables rules with iptables-restore", "reason", p.writerWhy)
}

// netlinkObstacle says what keeps the netlink writer from being used on
// this node ("" for nothing).
func (p *Proxier) netlinkObstacle(ctx context.Context) string {
	for _, f := range p.cfg.Families {
		cmd := p.backend.cmd(f, "")
		v, err := iptablesVersion(ctx, p.exec, cmd)
		if err != nil {
			return fmt.Sprintf("cannot tell %s's version: %v", cmd, err)
		}
		if !p.unproven && !slices.Contains(ProvenVersions, v) {
			return fmt.Sprintf("%s is version %s; the netlink writer is proven against %v", cmd, v, ProvenVersions)
		}
	}
	run, ok := p.exec.(nsRunner)
	if !ok {
		return "the programs run where kproxy's netlink sockets cannot reach"
	}
	compat := p.compat
	if compat == nil {
		compat = nfnl.CompatSupported
	}
	for _, f := range p.cfg.Families {
		var missing []string
		err := run.InNamespace(func() error {
			for _, m := range xtModules {
				ok, err := compat(nfproto(f), m.name, m.rev, m.target)
				if err != nil {
					return err
				}
				if !ok {
					missing = append(missing, fmt.Sprintf("%s rev %d", m.name, m.rev))
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Sprintf("cannot ask the kernel for xtables modules: %v", err)
		}
		if len(missing) > 0 {
			return fmt.Sprintf("the kernel lacks %v for %s", missing, f)
		}
	}
	return ""
}

// Writer reports how rules reach the kernel: WriterNetlink or
// WriterRestore ("" before the first sync chose).
func (p *Proxier) Writer() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.writer
}
