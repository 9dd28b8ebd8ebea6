package iptables

import (
	"context"
	"strings"

	"github.com/google/nftables"

	"github.com/kproxy/kproxy/internal/model"
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
	conn, err := nftables.New()
	if err != nil {
		return false
	}
	t := &nftables.Table{Name: table, Family: nftFamily(fam)}
	rules, err := conn.GetRules(t, &nftables.Chain{Name: chainCanary, Table: t})
	return err == nil && len(rules) > 0
}
