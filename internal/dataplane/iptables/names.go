package iptables

import (
	"crypto/sha256"
	"encoding/base32"
	"strings"

	"github.com/kproxy/kproxy/internal/model"
)

// Table names.
const (
	tableFilter = "filter"
	tableNAT    = "nat"
	tableMangle = "mangle"
)

// Chain names shared with upstream kube-proxy: operators and tools grep for
// them, and upstream's leftovers carry them.
const (
	chainServices         = "KUBE-SERVICES"
	chainExternalServices = "KUBE-EXTERNAL-SERVICES"
	chainNodePorts        = "KUBE-NODEPORTS"
	chainPostrouting      = "KUBE-POSTROUTING"
	chainMarkMasq         = "KUBE-MARK-MASQ"
	chainForward          = "KUBE-FORWARD"
	chainProxyFirewall    = "KUBE-PROXY-FIREWALL"
	chainCanary           = "KUBE-PROXY-CANARY"
	// chainKubeletFirewall duplicates kubelet's chain holding the martian
	// localnet drop rule (CVE-2020-8558). Like upstream, kproxy creates it
	// but never deletes it: kubelet owns it.
	chainKubeletFirewall = "KUBE-FIREWALL"
)

// Prefixes of per-service-port chains (upstream's scheme) and of kproxy's
// dispatch buckets (see dispatch.go).
const (
	prefixSVC = "KUBE-SVC-"
	prefixSVL = "KUBE-SVL-"
	prefixEXT = "KUBE-EXT-"
	prefixFW  = "KUBE-FW-"
	prefixSEP = "KUBE-SEP-"
	// prefixServicesBucket and prefixNodePortsBucket name the sub-chains
	// KUBE-SERVICES and KUBE-NODEPORTS (nat) dispatch to. They start with
	// KUBE-SVC- on purpose: upstream kube-proxy deletes every nat chain
	// with one of its per-service prefixes that it does not use, in the
	// same iptables-restore that rewrites KUBE-SERVICES, so after a
	// rollback to upstream no bucket is left holding references to the
	// KUBE-SVC chains upstream wants to delete. Upstream's own names are
	// KUBE-SVC- plus 16 base32 characters; a "-" after IP or NP cannot
	// occur in them.
	prefixServicesBucket  = prefixSVC + "IP-"
	prefixNodePortsBucket = prefixSVC + "NP-"
	// Older kproxy versions named the buckets KUBE-SERVICES-… and
	// KUBE-NODEPORTS-…; they are deleted as stale chains.
	prefixOldServicesBucket  = chainServices + "-"
	prefixOldNodePortsBucket = chainNodePorts + "-"
)

// portName is upstream's string form of a service port name:
// "namespace/name" or "namespace/name:port".
func portName(id model.PortID) string { return id.String() }

// hash16 is the first 16 characters of the base32 SHA-256 of s: upstream's
// chain-name hash, so that chain names match upstream's for the same
// Service and endpoints.
func hash16(s string) string {
	sum := sha256.Sum256([]byte(s))
	return base32.StdEncoding.EncodeToString(sum[:])[:16]
}

// protoLower is the protocol as iptables spells it.
func protoLower(p model.Protocol) string { return strings.ToLower(string(p)) }

// portChains holds the chain names of one service port.
type portChains struct {
	svc, svl, ext, fw string
}

func chainsOf(id model.PortID) portChains {
	h := hash16(portName(id) + protoLower(id.Protocol))
	return portChains{svc: prefixSVC + h, svl: prefixSVL + h, ext: prefixEXT + h, fw: prefixFW + h}
}

// endpointChain is the KUBE-SEP chain of one endpoint of a service port.
func endpointChain(id model.PortID, ep *model.Endpoint) string {
	return prefixSEP + hash16(portName(id)+protoLower(id.Protocol)+ep.String())
}

// isServiceChain reports whether a chain name is a per-service-port chain
// (ours or upstream's) or one of kproxy's dispatch buckets: the nat chains
// upstream deletes when it does not use them.
func isServiceChain(name string) bool {
	for _, p := range []string{prefixSVC, prefixSVL, prefixEXT, prefixFW, prefixSEP} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// isLeftoverChain reports whether a chain in table is removed by a cleanup
// (--cleanup, or another mode's leftovers): an owned chain, or one only
// upstream's ipvs mode makes. Syncs never delete the ipvs ones: base chains
// jump to them, and only a cleanup removes those jumps with them.
func isLeftoverChain(table, name string) bool {
	if isOwnedChain(table, name) {
		return true
	}
	switch name {
	case "KUBE-NODE-PORT":
		return table == tableNAT || table == tableFilter
	case "KUBE-LOAD-BALANCER":
		return table == tableNAT
	case "KUBE-SOURCE-RANGES-FIREWALL", "KUBE-IPVS-FILTER", "KUBE-IPVS-OUT-FILTER":
		return table == tableFilter
	}
	return false
}

// isOwnedChain reports whether a chain in table is one kproxy (or upstream
// kube-proxy in iptables mode) creates and may delete.
func isOwnedChain(table, name string) bool {
	switch name {
	case chainServices, chainNodePorts, chainCanary:
		return true
	case chainPostrouting, chainMarkMasq:
		return table == tableNAT
	case chainExternalServices, chainForward, chainProxyFirewall:
		return table == tableFilter
	}
	if table != tableNAT {
		return false
	}
	return isServiceChain(name) || strings.HasPrefix(name, prefixOldServicesBucket) || strings.HasPrefix(name, prefixOldNodePortsBucket)
}
