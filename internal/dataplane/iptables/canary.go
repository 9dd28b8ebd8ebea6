package iptables

import (
	"bytes"
	"context"
	"errors"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/nfnl"
)

// A flushed or replaced table is noticed by a mark that any flush removes.
// kproxy writes no rule of its own for that (the mark of each table is a
// rule both kproxy and upstream kube-proxy write): a rule only kproxy knew
// would be left behind in upstream's chains after a rollback.
//   - nat: the jump from PREROUTING to KUBE-SERVICES;
//   - filter: the jump from INPUT to KUBE-NODEPORTS (health-check ports);
//   - mangle, where kproxy writes nothing but the empty KUBE-PROXY-CANARY
//     chain (as upstream does): that chain, which deleting the table's
//     chains removes.
type canaryMark struct {
	chain   string // a built-in chain, or chainCanary
	comment string // the comment of the rule that must be in it; "" means the chain must exist
}

var canaryMarks = map[string]canaryMark{
	tableNAT:    {"PREROUTING", "kubernetes service portals"},
	tableFilter: {"INPUT", "kubernetes health check service ports"},
	tableMangle: {chainCanary, ""},
}

// canaryOK reports whether table of family fam still holds its mark.
//
// On the nf_tables backend in kproxy's own network namespace it asks the
// kernel directly over netlink for that one chain: running `iptables-nft
// -S` instead makes iptables fetch every chain of the table, about 0.2 s
// per call at 10k Services, and Drifted runs every second. Elsewhere
// (legacy, or a namespace reached through NetnsExec) it runs
// `iptables -S CHAIN`.
func (p *Proxier) canaryOK(ctx context.Context, fam model.Family, table string) bool {
	m := canaryMarks[table]
	if _, local := p.exec.(OSExec); local && p.backend == BackendNFT {
		return netlinkCanaryOK(fam, table, m)
	}
	out, err := p.exec.Run(ctx, nil, p.backend.cmd(fam, ""), "-w", "-t", table, "-S", m.chain)
	return err == nil && (m.comment == "" || strings.Contains(string(out), `--comment "`+m.comment+`"`))
}

// netlinkCanaryOK reads the mark of an iptables-nft table (nf_tables table
// "nat", "filter" or "mangle" of family ip or ip6). A rule's comment is
// an xtables comment match, so the rule's attributes hold its text.
func netlinkCanaryOK(fam model.Family, table string, m canaryMark) bool {
	if m.comment == "" {
		_, err := nfnl.Get(nfproto(fam), unix.NFT_MSG_GETCHAIN, func(b *nfnl.Batch) {
			b.AttrStr(unix.NFTA_CHAIN_TABLE, table)
			b.AttrStr(unix.NFTA_CHAIN_NAME, m.chain)
		})
		return err == nil
	}
	found := false
	want := []byte(m.comment)
	err := nfnl.Dump(nfproto(fam), unix.NFT_MSG_GETRULE, func(b *nfnl.Batch) {
		b.AttrStr(unix.NFTA_RULE_TABLE, table)
		b.AttrStr(unix.NFTA_RULE_CHAIN, m.chain)
	}, func(attrs []byte) error {
		found = found || bytes.Contains(attrs, want)
		return nil
	})
	return (err == nil || errors.Is(err, nfnl.ErrInterrupted)) && found
}
