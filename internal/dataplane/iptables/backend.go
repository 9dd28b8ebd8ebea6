package iptables

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/nfnl"
)

// Backend is the iptables flavour: the nf_tables-based one or legacy
// xtables. Rules must never be split across the two.
type Backend string

const (
	BackendNFT    Backend = "nft"
	BackendLegacy Backend = "legacy"
)

// cmd is the program of this backend for a family; tool is "", "-save" or
// "-restore".
func (b Backend) cmd(fam model.Family, tool string) string {
	base := "iptables"
	if fam == model.IPv6 {
		base = "ip6tables"
	}
	return base + "-" + string(b) + tool
}

// Command is the program of this backend for a family; tool is "",
// "-save" or "-restore" (for other modes that write a few iptables rules).
func (b Backend) Command(fam model.Family, tool string) string { return b.cmd(fam, tool) }

func (b Backend) other() Backend {
	if b == BackendLegacy {
		return BackendNFT
	}
	return BackendLegacy
}

// Chains kubelet creates in the mangle table of the backend it uses.
var kubeletHints = []string{"KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY"}

// DetectBackend picks the backend the node uses, with the rules of
// upstream's kube-proxy image (kubernetes-sigs/iptables-wrappers):
//  1. a kubelet hint chain in nf_tables' mangle table: nft;
//  2. else a hint chain anywhere in legacy: legacy (legacy is read without
//     -t, which would create the table);
//  3. else legacy when it holds more rules than nf_tables, nft otherwise.
//
// Both families count. A program or module that is missing reads as empty.
func DetectBackend(ctx context.Context, ex Exec) Backend {
	if nftKubeletHint(ctx, ex) {
		return BackendNFT
	}
	legacy := saveAll(ctx, ex, BackendLegacy, "")
	if hasKubeletHint(legacy) {
		return BackendLegacy
	}
	// (With no legacy rules nf_tables wins whatever it holds: no need to
	// read it all, seconds on a loaded node.)
	if n := countRules(legacy); n > 0 && n > countRules(saveAll(ctx, ex, BackendNFT, "")) {
		return BackendLegacy
	}
	return BackendNFT
}

// nftKubeletHint tells whether kubelet's hint chains are in the nf_tables
// mangle tables: chain names over netlink where the Exec can reach the
// namespace (iptables-nft-save -t mangle reads the whole ruleset: ~3 s
// on a node with 10k Services loaded).
func nftKubeletHint(ctx context.Context, ex Exec) bool {
	run, ok := ex.(nsRunner)
	if !ok {
		return hasKubeletHint(saveAll(ctx, ex, BackendNFT, tableMangle))
	}
	found := false
	err := run.InNamespace(func() error {
		for _, fam := range []byte{unix.NFPROTO_IPV4, unix.NFPROTO_IPV6} {
			names, err := nfnl.ChainNames(fam, tableMangle)
			if err != nil {
				return err
			}
			found = found || slices.ContainsFunc(names, func(n string) bool { return slices.Contains(kubeletHints, n) })
		}
		return nil
	})
	if err != nil {
		return hasKubeletHint(saveAll(ctx, ex, BackendNFT, tableMangle))
	}
	return found
}

func hasKubeletHint(save string) bool {
	for _, h := range kubeletHints {
		if strings.Contains(save, "\n:"+h+" ") || strings.HasPrefix(save, ":"+h+" ") {
			return true
		}
	}
	return false
}

// countRules counts the rule lines ("-A ...") of iptables-save output.
func countRules(save string) int {
	n := strings.Count(save, "\n-")
	if strings.HasPrefix(save, "-") {
		n++
	}
	return n
}

// saveAll is the iptables-save output of both families, of one table or
// (table "") of every table the backend has.
func saveAll(ctx context.Context, ex Exec, b Backend, table string) string {
	var sb strings.Builder
	for _, fam := range []model.Family{model.IPv4, model.IPv6} {
		var args []string
		if table != "" {
			args = []string{"-t", table}
		}
		if out, err := ex.Run(ctx, nil, b.cmd(fam, "-save"), args...); err == nil {
			sb.Write(out)
			sb.WriteByte('\n')
		}
	}
	return sb.String()
}

// tableNames are the tables iptables knows.
var tableNames = []string{tableFilter, tableNAT, tableMangle, "raw", "security"}

// HasTables reports whether backend b holds any iptables table of family
// fam in this network namespace, without running iptables: for nf_tables
// over netlink (the ip or ip6 tables named as iptables' that iptables-nft
// creates), for legacy from ip_tables_names (ip6_tables_names) in the
// calling thread's /proc net directory, which lists the tables instantiated
// in its namespace and is absent while the module is not loaded. When it
// cannot tell, it says true.
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
	found := false
	err := nfnl.Dump(nfproto(fam), unix.NFT_MSG_GETTABLE, nil, func(attrs []byte) error {
		nfnl.EachAttr(attrs, func(typ uint16, data []byte) {
			if typ == unix.NFTA_TABLE_NAME && slices.Contains(tableNames, strings.TrimRight(string(data), "\x00")) {
				found = true
			}
		})
		return nil
	})
	return err != nil && !errors.Is(err, nfnl.ErrInterrupted) || found
}
