package iptables

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"slices"
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

// tableNames are the tables iptables knows.
var tableNames = []string{tableFilter, tableNAT, tableMangle, "raw", "security"}

// HasTables reports whether backend b holds any iptables table of family
// fam in this network namespace, without running iptables: for nf_tables
// over netlink (the ip or ip6 tables named as iptables' that iptables-nft
// creates), for legacy from ip_tables_names (ip6_tables_names) in the
// calling thread's /proc net directory, which lists the tables instantiated
// in its namespace and is absent while the module is not loaded. When it cannot tell, it says true.
//
// Cleanups use it to skip a backend and family with nothing to clean: each
// iptables-save they would run otherwise forks a process of the daemon's
// size, six to eight of them right after a cold start.
func HasTables(b Backend, fam model.Family) bool {
	if b == BackendLegacy {
		name := "/proc/thread-self/net/ip_tables_names"
		if fam == model.IPv6 {
			name = "/proc/thread-self/net/ip6_tables_names"
		}
		data, err := os.ReadFile(name)
		if errors.Is(err, fs.ErrNotExist) {
			return false
		}
		return err != nil || strings.TrimSpace(string(data)) != ""
	}
	conn, err := nftables.New()
	if err != nil {
		return true
	}
	tables, err := conn.ListTablesOfFamily(nftFamily(fam))
	if err != nil {
		return true
	}
	return slices.ContainsFunc(tables, func(t *nftables.Table) bool { return slices.Contains(tableNames, t.Name) })
}

// nftFamily is the nf_tables family of iptables-nft's tables of fam.
func nftFamily(fam model.Family) nftables.TableFamily {
	if fam == model.IPv6 {
		return nftables.TableFamilyIPv6
	}
	return nftables.TableFamilyIPv4
}
