package iptables

import (
	"context"
	"strings"

	"github.com/kproxy/kproxy/internal/model"
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
	if hasKubeletHint(saveAll(ctx, ex, BackendNFT, tableMangle)) {
		return BackendNFT
	}
	legacy := saveAll(ctx, ex, BackendLegacy, "")
	if hasKubeletHint(legacy) {
		return BackendLegacy
	}
	if countRules(legacy) > countRules(saveAll(ctx, ex, BackendNFT, "")) {
		return BackendLegacy
	}
	return BackendNFT
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
