package daemon

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"time"

	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/objects"
)

// Proxy modes kproxy knows.
const (
	ModeNFTables = "nftables"
	ModeIPTables = "iptables"
	ModeIPVS     = "ipvs"
	// ModeUserspace is kproxy's own: it relays connections itself.
	ModeUserspace = "userspace"
)

// nodePortAddressesPrimary is the nodePortAddresses keyword for "the node's
// primary IPs".
const nodePortAddressesPrimary = "primary"

// nodeName returns this node's name as upstream computes it: the override,
// else the host name, trimmed and lower-cased.
func nodeName(override string, hostname func() (string, error)) (string, error) {
	name := override
	if name == "" {
		h, err := hostname()
		if err != nil {
			return "", fmt.Errorf("getting the host name: %w", err)
		}
		name = h
	}
	name = strings.ToLower(strings.TrimSpace(name))
	if name == "" {
		return "", errors.New("empty host name is invalid: set --hostname-override")
	}
	return name, nil
}

// syncPeriods returns the mode's syncPeriod and minSyncPeriod (the
// v1alpha1 file keeps one pair per mode).
func syncPeriods(c *kpv1alpha1.KubeProxyConfiguration) (sync, minSync time.Duration) {
	switch c.Mode {
	case ModeNFTables:
		return c.NFTables.SyncPeriod.Duration, c.NFTables.MinSyncPeriod.Duration
	case ModeIPVS:
		return c.IPVS.SyncPeriod.Duration, c.IPVS.MinSyncPeriod.Duration
	default:
		return c.IPTables.SyncPeriod.Duration, c.IPTables.MinSyncPeriod.Duration
	}
}

// masquerade returns the mode's masqueradeBit and masqueradeAll.
func masquerade(c *kpv1alpha1.KubeProxyConfiguration) (bit int, all bool) {
	if c.Mode == ModeNFTables {
		if c.NFTables.MasqueradeBit != nil {
			bit = int(*c.NFTables.MasqueradeBit)
		}
		return bit, c.NFTables.MasqueradeAll
	}
	if c.IPTables.MasqueradeBit != nil {
		bit = int(*c.IPTables.MasqueradeBit)
	}
	return bit, c.IPTables.MasqueradeAll
}

// nodeIPs is what the node's addresses tell: the primary family and one IP
// per family (loopback when unknown).
type nodeIPs struct {
	primary model.Family
	byFam   map[model.Family]netip.Addr
}

// detectNodeIPs follows upstream: a specific --bind-address is the primary
// IP; else the Node's first address (and the second, of the other family);
// else 127.0.0.1 and ::1 with IPv4 primary.
func detectNodeIPs(raw []netip.Addr, bindAddress string) nodeIPs {
	n := nodeIPs{primary: model.IPv4, byFam: map[model.Family]netip.Addr{
		model.IPv4: netip.AddrFrom4([4]byte{127, 0, 0, 1}),
		model.IPv6: netip.IPv6Loopback(),
	}}
	if len(raw) > 0 {
		n.primary = model.FamilyOf(raw[0])
		n.byFam[n.primary] = raw[0].Unmap()
		if len(raw) > 1 {
			n.byFam[model.FamilyOf(raw[1])] = raw[1].Unmap()
		}
	}
	// Sloppy, as upstream parses it: validation accepts "010.0.0.1".
	if bind, ok := objects.ParseAddr(bindAddress); ok && !bind.IsUnspecified() {
		n.primary = model.FamilyOf(bind)
		n.byFam[n.primary] = bind
	}
	return n
}

// known returns the node IPs that are not the loopback fallback, primary first.
func (n nodeIPs) known() []netip.Addr {
	var out []netip.Addr
	for _, f := range []model.Family{n.primary, otherFamily(n.primary)} {
		if ip := n.byFam[f]; ip.IsValid() && !ip.IsLoopback() {
			out = append(out, ip)
		}
	}
	return out
}

func otherFamily(f model.Family) model.Family {
	if f == model.IPv6 {
		return model.IPv4
	}
	return model.IPv6
}

// rawNodeIPs returns the Node's host IPs as upstream picks them: the first
// InternalIP (else ExternalIP), then the first of the other family.
func rawNodeIPs(node *objects.Node) []netip.Addr {
	if node == nil {
		return nil
	}
	var all []netip.Addr
	for _, list := range [][]string{node.InternalIPs, node.ExternalIPs} {
		for _, s := range list {
			if ip, ok := objects.ParseAddr(s); ok { // sloppy, as upstream
				all = append(all, ip)
			}
		}
	}
	if len(all) == 0 {
		return nil
	}
	out := []netip.Addr{all[0]}
	for _, ip := range all[1:] {
		if ip.Is4() != all[0].Is4() {
			return append(out, ip)
		}
	}
	return out
}

// families returns the families to program: both when the kernel supports
// IPv6 (upstream runs dual-stack whenever the backend and kernel can, whatever
// the node's addresses), else IPv4. An IPv6 primary without IPv6 support is
// an error, as upstream.
func families(primary model.Family, ipv6Supported bool) ([]model.Family, error) {
	if ipv6Supported {
		return []model.Family{model.IPv4, model.IPv6}, nil
	}
	if primary == model.IPv6 {
		return nil, errors.New("no support for primary IP family IPv6")
	}
	return []model.Family{model.IPv4}, nil
}

// kernelIPv6Supported reports whether this kernel has IPv6 and it is not
// disabled, as upstream checks it.
func kernelIPv6Supported() bool {
	if _, err := os.Stat("/proc/net/if_inet6"); err != nil {
		return false
	}
	b, err := os.ReadFile("/proc/sys/net/ipv6/conf/all/disable_ipv6")
	return err != nil || strings.TrimSpace(string(b)) != "1"
}

// dataplaneConfig derives the backend configuration from the
// KubeProxyConfiguration and what is known about the node.
func dataplaneConfig(c *kpv1alpha1.KubeProxyConfiguration, ips nodeIPs, fams []model.Family) (dataplane.Config, error) {
	bit, all := masquerade(c)
	cfg := dataplane.Config{
		Families:          fams,
		MasqueradeBit:     bit,
		MasqueradeAll:     all,
		LocalMode:         dataplane.LocalMode(c.DetectLocalMode),
		BridgeInterface:   c.DetectLocal.BridgeInterface,
		InterfacePrefix:   c.DetectLocal.InterfaceNamePrefix,
		NodePortAddresses: completeFamilies(nodePortAddresses(c.NodePortAddresses, ips), fams),
		NodeIPs:           ips.known(),
	}
	if c.IPTables.LocalhostNodePorts != nil && !*c.IPTables.LocalhostNodePorts {
		cfg.NoLocalhostNodePorts = true
	}
	cfg.IPVS = dataplane.IPVSConfig{
		Scheduler: c.IPVS.Scheduler, StrictARP: c.IPVS.StrictARP,
		TCPTimeout: c.IPVS.TCPTimeout.Duration, TCPFinTimeout: c.IPVS.TCPFinTimeout.Duration, UDPTimeout: c.IPVS.UDPTimeout.Duration,
	}
	// Only IPVS mode reads (and upstream only validates) excludeCIDRs: a
	// leftover bad entry does not stop the other modes.
	for _, s := range c.IPVS.ExcludeCIDRs {
		p, ok := model.ParsePrefix(s)
		if !ok && c.Mode == ModeIPVS {
			return cfg, fmt.Errorf("ipvs.excludeCIDRs: invalid CIDR %q", s)
		}
		if ok {
			cfg.IPVS.ExcludeCIDRs = append(cfg.IPVS.ExcludeCIDRs, p)
		}
	}
	if cfg.LocalMode == dataplane.LocalClusterCIDR && c.ClusterCIDR != "" {
		cidrs, err := parseCIDRs(c.ClusterCIDR)
		if err != nil {
			return cfg, fmt.Errorf("clusterCIDR: %w", err)
		}
		cfg.ClusterCIDRs = cidrs
	}
	return cfg, nil
}

// nodePortAddresses resolves the "primary" keyword as upstream does: into the
// node's non-loopback IPs as /32 and /128 CIDRs. When no node IP is known the
// result is empty, which upstream takes as "every local address".
//
// Other entries are parsed as upstream parses them (leading zeros, host
// bits) and handed on in canonical form, so that the dataplanes' strict
// parsers take "010.0.0.0/8" as 10.0.0.0/8 rather than skip it and leave
// the family open on every address.
func nodePortAddresses(configured []string, ips nodeIPs) []string {
	if len(configured) != 1 || configured[0] != nodePortAddressesPrimary {
		var out []string
		for _, s := range configured {
			if p, ok := model.ParsePrefix(s); ok {
				s = p.String()
			}
			out = append(out, s)
		}
		return out
	}
	out := []string{}
	for _, f := range []model.Family{model.IPv4, model.IPv6} {
		ip := ips.byFam[f]
		if ip.IsValid() && !ip.IsLoopback() {
			out = append(out, netip.PrefixFrom(ip, ip.BitLen()).String())
		}
	}
	return out
}

// completeFamilies gives every family without a CIDR in a non-empty
// nodePortAddresses list its zero-length CIDR: upstream accepts NodePorts on
// every local address of a family the list does not mention (so "primary"
// on a node with only an IPv4 IP leaves IPv6 NodePorts open everywhere).
func completeFamilies(cidrs []string, fams []model.Family) []string {
	if len(cidrs) == 0 {
		return cidrs
	}
	out := cidrs
	for _, f := range fams {
		if !hasCIDROf(cidrs, f) {
			zero := netip.PrefixFrom(netip.IPv4Unspecified(), 0)
			if f == model.IPv6 {
				zero = netip.PrefixFrom(netip.IPv6Unspecified(), 0)
			}
			out = append(out, zero.String())
		}
	}
	return out
}

// hasCIDROf reports whether cidrs holds a CIDR of family f.
func hasCIDROf(cidrs []string, f model.Family) bool { return familyCount(cidrs, f) > 0 }

// localhostNodePorts reports whether iptables mode answers NodePorts on
// 127.0.0.1 (and so needs route_localnet=1): iptables.localhostNodePorts is
// on and nodePortAddresses is empty or has an IPv4 CIDR containing
// 127.0.0.1 or none at all ("primary" never contains it).
func localhostNodePorts(c *kpv1alpha1.KubeProxyConfiguration) bool {
	if c.Mode != ModeIPTables || (c.IPTables.LocalhostNodePorts != nil && !*c.IPTables.LocalhostNodePorts) {
		return false
	}
	npa := c.NodePortAddresses
	if len(npa) == 1 && npa[0] == nodePortAddressesPrimary {
		return false
	}
	if !hasCIDROf(npa, model.IPv4) {
		return true
	}
	loopback := netip.AddrFrom4([4]byte{127, 0, 0, 1})
	for _, s := range npa {
		if p, ok := model.ParsePrefix(s); ok && p.Contains(loopback) {
			return true
		}
	}
	return false
}

func parseCIDRs(list string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	var errs []error
	for _, s := range strings.Split(list, ",") {
		p, ok := model.ParsePrefix(s) // sloppy, as upstream
		if !ok {
			errs = append(errs, fmt.Errorf("invalid CIDR %q", strings.TrimSpace(s)))
			continue
		}
		out = append(out, p)
	}
	return out, errors.Join(errs...)
}
