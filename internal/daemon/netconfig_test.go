package daemon

import (
	"errors"
	"net/netip"
	"reflect"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
	"k8s.io/utils/ptr"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/objects"
)

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

func TestDetectNodeIPs(t *testing.T) {
	tests := []struct {
		name    string
		raw     []netip.Addr
		bind    string
		primary model.Family
		known   []netip.Addr
	}{
		{"nothing known: loopback, IPv4 primary", nil, "0.0.0.0", model.IPv4, nil},
		{"node IPv4", addrs("198.18.1.1"), "0.0.0.0", model.IPv4, addrs("198.18.1.1")},
		{"node IPv6 primary, dual", addrs("fd00::1", "198.18.1.1"), "::", model.IPv6, addrs("fd00::1", "198.18.1.1")},
		{"bind address overrides the primary", addrs("198.18.1.1"), "198.18.9.9", model.IPv4, addrs("198.18.9.9")},
		{"IPv6 bind address flips the primary", addrs("198.18.1.1"), "fd00::9", model.IPv6, addrs("fd00::9", "198.18.1.1")},
		{"bind address alone", nil, "198.18.9.9", model.IPv4, addrs("198.18.9.9")},
		{"empty bind address", addrs("198.18.1.1"), "", model.IPv4, addrs("198.18.1.1")},
		{"bind address with leading zeros, as upstream's sloppy parse", addrs("fd00::1"), "198.018.009.009", model.IPv4, addrs("198.18.9.9", "fd00::1")},
		{"IPv4-mapped bind address is IPv4", addrs("fd00::1"), "::ffff:198.18.9.9", model.IPv4, addrs("198.18.9.9", "fd00::1")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := detectNodeIPs(tc.raw, tc.bind)
			if got.primary != tc.primary || !slices.Equal(got.known(), tc.known) {
				t.Errorf("detectNodeIPs() = %v %v, want %v %v", got.primary, got.known(), tc.primary, tc.known)
			}
		})
	}
}

func TestRawNodeIPs(t *testing.T) {
	tests := []struct {
		name string
		node *objects.Node
		want []netip.Addr
	}{
		{"no node", nil, nil},
		{"no addresses", &objects.Node{}, nil},
		{"internal first", &objects.Node{InternalIPs: []string{"198.18.1.1", "198.18.1.2"}, ExternalIPs: []string{"198.18.2.1"}}, addrs("198.18.1.1")},
		{"dual-stack", &objects.Node{InternalIPs: []string{"198.18.1.1", "fd00::1"}}, addrs("198.18.1.1", "fd00::1")},
		{"external when no internal", &objects.Node{ExternalIPs: []string{"fd00::2"}}, addrs("fd00::2")},
		{"invalid skipped", &objects.Node{InternalIPs: []string{"bogus", "198.18.1.1"}}, addrs("198.18.1.1")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := rawNodeIPs(tc.node); !slices.Equal(got, tc.want) {
				t.Errorf("rawNodeIPs() = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestFamilies(t *testing.T) {
	both := []model.Family{model.IPv4, model.IPv6}
	tests := []struct {
		primary model.Family
		ipv6    bool
		want    []model.Family
		wantErr bool
	}{
		{model.IPv4, true, both, false},
		{model.IPv6, true, both, false},
		{model.IPv4, false, []model.Family{model.IPv4}, false},
		{model.IPv6, false, nil, true},
	}
	for _, tc := range tests {
		got, err := families(tc.primary, tc.ipv6)
		if (err != nil) != tc.wantErr || !slices.Equal(got, tc.want) {
			t.Errorf("families(%v, %v) = %v, %v; want %v, err=%v", tc.primary, tc.ipv6, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestDataplaneConfig(t *testing.T) {
	v4 := detectNodeIPs(addrs("198.18.1.1"), "")
	dual := detectNodeIPs(addrs("198.18.1.1", "fd00::1"), "")
	none := detectNodeIPs(nil, "")
	fams := []model.Family{model.IPv4}
	tests := []struct {
		name    string
		cfg     kpv1alpha1.KubeProxyConfiguration
		ips     nodeIPs
		fams    []model.Family // default: IPv4
		want    dataplane.Config
		wantErr bool
	}{{
		name: "nftables: its own masquerade settings, primary resolved",
		cfg: kpv1alpha1.KubeProxyConfiguration{Mode: ModeNFTables, DetectLocalMode: "ClusterCIDR", ClusterCIDR: "198.19.0.0/16,fd00:1::/64",
			NodePortAddresses: []string{"primary"},
			NFTables:          kpv1alpha1.KubeProxyNFTablesConfiguration{MasqueradeBit: ptr.To[int32](14), MasqueradeAll: true},
			IPTables:          kpv1alpha1.KubeProxyIPTablesConfiguration{MasqueradeBit: ptr.To[int32](3)}},
		ips: dual,
		want: dataplane.Config{Families: fams, MasqueradeBit: 14, MasqueradeAll: true, LocalMode: dataplane.LocalClusterCIDR,
			ClusterCIDRs:      []netip.Prefix{netip.MustParsePrefix("198.19.0.0/16"), netip.MustParsePrefix("fd00:1::/64")},
			NodePortAddresses: []string{"198.18.1.1/32", "fd00::1/128"}, NodeIPs: addrs("198.18.1.1", "fd00::1")},
	}, {
		name: "iptables: iptables masquerade settings, CIDR list kept",
		cfg: kpv1alpha1.KubeProxyConfiguration{Mode: ModeIPTables, DetectLocalMode: "BridgeInterface",
			DetectLocal:       kpv1alpha1.DetectLocalConfiguration{BridgeInterface: "cbr0", InterfaceNamePrefix: "veth"},
			NodePortAddresses: []string{"198.18.0.0/16"},
			IPTables:          kpv1alpha1.KubeProxyIPTablesConfiguration{MasqueradeBit: ptr.To[int32](14)}},
		ips: v4,
		want: dataplane.Config{Families: fams, MasqueradeBit: 14, LocalMode: dataplane.LocalBridgeInterface, BridgeInterface: "cbr0",
			InterfacePrefix: "veth", NodePortAddresses: []string{"198.18.0.0/16"}, NodeIPs: addrs("198.18.1.1")},
	}, {
		name: "primary without a known node IP means every address",
		cfg:  kpv1alpha1.KubeProxyConfiguration{Mode: ModeNFTables, NodePortAddresses: []string{"primary"}},
		ips:  none,
		want: dataplane.Config{Families: fams, NodePortAddresses: []string{}},
	}, {
		name: "a family the list does not mention gets every address, as upstream",
		cfg:  kpv1alpha1.KubeProxyConfiguration{Mode: ModeIPTables, NodePortAddresses: []string{"198.18.0.0/16"}},
		ips:  v4,
		fams: []model.Family{model.IPv4, model.IPv6},
		want: dataplane.Config{Families: []model.Family{model.IPv4, model.IPv6},
			NodePortAddresses: []string{"198.18.0.0/16", "::/0"}, NodeIPs: addrs("198.18.1.1")},
	}, {
		name: "primary with only an IPv4 node IP: IPv6 NodePorts everywhere",
		cfg:  kpv1alpha1.KubeProxyConfiguration{Mode: ModeNFTables, NodePortAddresses: []string{"primary"}},
		ips:  v4,
		fams: []model.Family{model.IPv4, model.IPv6},
		want: dataplane.Config{Families: []model.Family{model.IPv4, model.IPv6},
			NodePortAddresses: []string{"198.18.1.1/32", "::/0"}, NodeIPs: addrs("198.18.1.1")},
	}, {
		name: "CIDRs parsed as upstream (leading zeros, host bits), handed on canonical",
		cfg:  kpv1alpha1.KubeProxyConfiguration{Mode: ModeNFTables, NodePortAddresses: []string{"198.018.0.1/16", " fd00::1/64"}},
		ips:  v4,
		fams: []model.Family{model.IPv4, model.IPv6},
		want: dataplane.Config{Families: []model.Family{model.IPv4, model.IPv6},
			NodePortAddresses: []string{"198.18.0.0/16", "fd00::/64"}, NodeIPs: addrs("198.18.1.1")},
	}, {
		name: "sloppy cluster CIDR; a bad excludeCIDRs entry only matters in ipvs mode",
		cfg: kpv1alpha1.KubeProxyConfiguration{Mode: ModeNFTables, DetectLocalMode: "ClusterCIDR", ClusterCIDR: "010.0.0.0/8",
			IPVS: kpv1alpha1.KubeProxyIPVSConfiguration{ExcludeCIDRs: []string{"10.0.0.1", "198.18.0.0/15"}}},
		ips: v4,
		want: dataplane.Config{Families: fams, LocalMode: dataplane.LocalClusterCIDR, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
			IPVS: dataplane.IPVSConfig{ExcludeCIDRs: []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15")}}, NodeIPs: addrs("198.18.1.1")},
	}, {
		name:    "bad excludeCIDRs entry in ipvs mode",
		cfg:     kpv1alpha1.KubeProxyConfiguration{Mode: ModeIPVS, IPVS: kpv1alpha1.KubeProxyIPVSConfiguration{ExcludeCIDRs: []string{"10.0.0.1"}}},
		ips:     v4,
		wantErr: true,
	}, {
		name:    "bad cluster CIDR",
		cfg:     kpv1alpha1.KubeProxyConfiguration{Mode: ModeNFTables, DetectLocalMode: "ClusterCIDR", ClusterCIDR: "nope"},
		ips:     v4,
		wantErr: true,
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fs := tc.fams
			if fs == nil {
				fs = fams
			}
			got, err := dataplaneConfig(&tc.cfg, tc.ips, fs)
			if (err != nil) != tc.wantErr {
				t.Fatalf("error = %v, wantErr %v", err, tc.wantErr)
			}
			if !tc.wantErr && !reflect.DeepEqual(got, tc.want) {
				t.Errorf("dataplaneConfig() =\n%+v\nwant\n%+v", got, tc.want)
			}
		})
	}
}

func TestSyncPeriodsAndRunner(t *testing.T) {
	d := func(s int) metav1.Duration { return metav1.Duration{Duration: time.Duration(s) * time.Second} }
	c := kpv1alpha1.KubeProxyConfiguration{
		NFTables: kpv1alpha1.KubeProxyNFTablesConfiguration{SyncPeriod: d(30), MinSyncPeriod: d(1)},
		IPTables: kpv1alpha1.KubeProxyIPTablesConfiguration{SyncPeriod: d(40), MinSyncPeriod: d(2)},
		IPVS:     kpv1alpha1.KubeProxyIPVSConfiguration{SyncPeriod: d(50), MinSyncPeriod: d(3)},
	}
	tests := []struct {
		mode          string
		sync, min     time.Duration
		maxInterval   time.Duration
		retryInterval time.Duration
		fullInterval  time.Duration
	}{
		{ModeNFTables, 30 * time.Second, time.Second, time.Hour, 30 * time.Second, time.Hour},
		{ModeIPTables, 40 * time.Second, 2 * time.Second, time.Hour, 40 * time.Second, time.Hour},
		{ModeIPVS, 50 * time.Second, 3 * time.Second, 50 * time.Second, 50 * time.Second, 50 * time.Second},
	}
	for _, tc := range tests {
		c.Mode = kpv1alpha1.ProxyMode(tc.mode)
		s, m := syncPeriods(&c)
		if s != tc.sync || m != tc.min {
			t.Errorf("%s: syncPeriods = %v %v, want %v %v", tc.mode, s, m, tc.sync, tc.min)
		}
		dm := &daemon{o: testOptions(), mode: tc.mode, inputs: Inputs{Tracker: newFakeTracker(nil)}}
		dm.o.Config = &c
		rc := dm.runnerConfig()
		if rc.MaxInterval != tc.maxInterval || rc.RetryInterval != tc.retryInterval || rc.MinInterval != tc.min || rc.FullInterval != tc.fullInterval {
			t.Errorf("%s: runner config = %+v", tc.mode, rc)
		}
	}
}

func TestNodeName(t *testing.T) {
	host := func() (string, error) { return " Host-A\n", nil }
	broken := func() (string, error) { return "", errors.New("no uts") }
	tests := []struct {
		override string
		hostname func() (string, error)
		want     string
		wantErr  bool
	}{
		{"", host, "host-a", false},
		{"Node-B ", broken, "node-b", false},
		{"", broken, "", true},
		{"  ", func() (string, error) { return "", nil }, "", true},
	}
	for _, tc := range tests {
		got, err := nodeName(tc.override, tc.hostname)
		if got != tc.want || (err != nil) != tc.wantErr {
			t.Errorf("nodeName(%q) = %q, %v; want %q, err=%v", tc.override, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestLeftoverModes(t *testing.T) {
	all := map[string]DataplaneFunc{ModeNFTables: nil, ModeIPTables: nil, ModeIPVS: nil}
	tests := map[string][]string{
		ModeNFTables: {ModeIPTables, ModeIPVS},
		ModeIPTables: {ModeNFTables},
		ModeIPVS:     {ModeNFTables},
	}
	for mode, want := range tests {
		if got := leftoverModes(mode, all); !slices.Equal(got, want) {
			t.Errorf("leftoverModes(%s) = %v, want %v", mode, got, want)
		}
	}
}

func TestLocalhostNodePorts(t *testing.T) {
	off := false
	tests := []struct {
		name string
		cfg  kpv1alpha1.KubeProxyConfiguration
		want bool
	}{
		{"iptables default", kpv1alpha1.KubeProxyConfiguration{Mode: ModeIPTables}, true},
		{"nftables never", kpv1alpha1.KubeProxyConfiguration{Mode: ModeNFTables}, false},
		{"turned off", kpv1alpha1.KubeProxyConfiguration{Mode: ModeIPTables, IPTables: kpv1alpha1.KubeProxyIPTablesConfiguration{LocalhostNodePorts: &off}}, false},
		{"primary", kpv1alpha1.KubeProxyConfiguration{Mode: ModeIPTables, NodePortAddresses: []string{"primary"}}, false},
		{"CIDR without loopback", kpv1alpha1.KubeProxyConfiguration{Mode: ModeIPTables, NodePortAddresses: []string{"198.18.0.0/16"}}, false},
		{"CIDR with loopback", kpv1alpha1.KubeProxyConfiguration{Mode: ModeIPTables, NodePortAddresses: []string{"198.18.0.0/16", "127.0.0.0/8"}}, true},
		{"CIDR with leading zeros, no loopback", kpv1alpha1.KubeProxyConfiguration{Mode: ModeIPTables, NodePortAddresses: []string{"010.0.0.0/8"}}, false},
		{"only IPv6 CIDRs: IPv4 is all", kpv1alpha1.KubeProxyConfiguration{Mode: ModeIPTables, NodePortAddresses: []string{"fd00::/64"}}, true},
	}
	for _, tc := range tests {
		if got := localhostNodePorts(&tc.cfg); got != tc.want {
			t.Errorf("%s: localhostNodePorts = %v, want %v", tc.name, got, tc.want)
		}
	}
}
