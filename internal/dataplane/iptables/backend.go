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

// DetectBackend picks the backend the node uses, as upstream's
// iptables-wrapper does: kubelet's hint chain decides; else the backend with
// more KUBE-* lines; else the one with more rules; nft on a tie.
func DetectBackend(ctx context.Context, ex Exec) Backend {
	for _, b := range []Backend{BackendNFT, BackendLegacy} {
		out := saveAll(ctx, ex, b, "mangle")
		for _, h := range kubeletHints {
			if strings.Contains(out, ":"+h+" ") {
				return b
			}
		}
	}
	nft, legacy := saveAll(ctx, ex, BackendNFT, ""), saveAll(ctx, ex, BackendLegacy, "")
	if n, l := strings.Count(nft, "KUBE-"), strings.Count(legacy, "KUBE-"); n+l > 0 {
		return pick(n, l)
	}
	return pick(strings.Count(nft, "\n-"), strings.Count(legacy, "\n-"))
}

func pick(nft, legacy int) Backend {
	if legacy > nft {
		return BackendLegacy
	}
	return BackendNFT
}

// saveAll is the iptables-save output of both families (errors count as
// empty: a missing binary or module means nothing is there).
func saveAll(ctx context.Context, ex Exec, b Backend, table string) string {
	var sb strings.Builder
	for _, fam := range []model.Family{model.IPv4, model.IPv6} {
		args := []string{}
		if table != "" {
			args = append(args, "-t", table)
		}
		out, err := ex.Run(ctx, nil, b.cmd(fam, "-save"), args...)
		if err == nil {
			sb.Write(out)
		}
	}
	return sb.String()
}
