package iptables

import (
	"context"
	"errors"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/nfnl"
)

// canaryOK reports whether table's KUBE-PROXY-CANARY chain of family fam
// exists and still holds its rule. Flushing the table removes the rule,
// deleting the chain removes both.
//
// On the nf_tables backend in kproxy's own network namespace it asks the
// kernel directly over netlink for that one chain's rules: running
// `iptables-nft -S` instead makes iptables fetch every chain of the table,
// about 0.2 s per call at 10k Services, and Drifted runs every second.
// Elsewhere (legacy, or a namespace reached through NetnsExec) it runs
// `iptables -S KUBE-PROXY-CANARY`.
func (p *Proxier) canaryOK(ctx context.Context, fam model.Family, table string) bool {
	if _, local := p.exec.(OSExec); local && p.backend == BackendNFT {
		return netlinkCanaryOK(fam, table)
	}
	out, err := p.exec.Run(ctx, nil, p.backend.cmd(fam, ""), "-w", "-t", table, "-S", chainCanary)
	return err == nil && strings.Contains(string(out), "kproxy canary")
}

// netlinkCanaryOK reads the canary chain's rules of an iptables-nft table
// (nf_tables table "nat", "filter" or "mangle" of family ip or ip6).
func netlinkCanaryOK(fam model.Family, table string) bool {
	rules := 0
	err := nfnl.Dump(nfproto(fam), unix.NFT_MSG_GETRULE, func(b *nfnl.Batch) {
		b.AttrStr(unix.NFTA_RULE_TABLE, table)
		b.AttrStr(unix.NFTA_RULE_CHAIN, chainCanary)
	}, func([]byte) error {
		rules++
		return nil
	})
	return (err == nil || errors.Is(err, nfnl.ErrInterrupted)) && rules > 0
}
