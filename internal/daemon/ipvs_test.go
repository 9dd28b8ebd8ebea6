package daemon

import (
	"strings"
	"testing"

	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/dataplane"
)

func TestIPVSFallback(t *testing.T) {
	noop := func(dataplane.Config) (dataplane.Dataplane, error) { return nil, nil }
	for _, tc := range []struct {
		name     string
		mode     string
		ipvsDP   bool
		missing  []string
		wantMode string
	}{
		{"iptables stays", ModeIPTables, true, []string{"x"}, ModeIPTables},
		{"nftables stays", ModeNFTables, false, nil, ModeNFTables},
		{"ipvs usable", ModeIPVS, true, nil, ModeIPVS},
		{"no ip_vs module", ModeIPVS, true, []string{"kernel module ip_vs"}, ModeIPTables},
		{"no ipvs dataplane", ModeIPVS, false, nil, ModeIPTables},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := env{dataplanes: map[string]DataplaneFunc{ModeIPTables: noop, ModeNFTables: noop}}
			if tc.ipvsDP {
				e.dataplanes[ModeIPVS] = noop
			}
			var asked string
			e.ipvsSupport = func(s string) []string { asked = s; return tc.missing }
			cfg := &kpv1alpha1.KubeProxyConfiguration{Mode: kpv1alpha1.ProxyMode(tc.mode)}
			cfg.IPVS.Scheduler = "wrr"
			o := &config.Options{Config: cfg}
			got := ipvsFallback(o, e)
			if string(got.Config.Mode) != tc.wantMode {
				t.Errorf("mode = %q, want %q", got.Config.Mode, tc.wantMode)
			}
			if string(o.Config.Mode) != tc.mode {
				t.Errorf("the caller's options changed to mode %q", o.Config.Mode)
			}
			if tc.mode == ModeIPVS && tc.ipvsDP && asked != "wrr" {
				t.Errorf("support checked for scheduler %q, want wrr", asked)
			}
		})
	}
}

func TestListsBuiltin(t *testing.T) {
	const builtin = "kernel/net/netfilter/nf_conntrack.ko\nkernel/net/netfilter/ipvs/ip_vs.ko\nkernel/net/netfilter/ipvs/ip_vs_rr.ko\n"
	for module, want := range map[string]bool{"ip_vs_rr": true, "ip_vs": true, "ip_vs_wrr": false, "ip_vs_r": false} {
		if got := listsBuiltin(strings.NewReader(builtin), module); got != want {
			t.Errorf("listsBuiltin(%s) = %v, want %v", module, got, want)
		}
	}
}
