package iptables

import (
	"context"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/internal/model"
)

// nsScripted is a scriptedExec whose namespace is this one (the kernel is
// faked through Proxier.compat).
type nsScripted struct{ scriptedExec }

func (nsScripted) InNamespace(fn func() error) error { return fn() }

// TestChooseWriter: the netlink writer only with the nf_tables backend, a
// proven iptables-nft version in every family, and every xtables module in
// the kernel; iptables-restore otherwise, with the reason.
func TestChooseWriter(t *testing.T) {
	v := func(v4, v6 string) nsScripted {
		return nsScripted{scriptedExec{
			"iptables-nft --version":  "iptables " + v4 + " (nf_tables)\n",
			"ip6tables-nft --version": "ip6tables " + v6 + " (nf_tables)\n",
		}}
	}
	all := func(byte, string, uint32, bool) (bool, error) { return true, nil }
	noRecent := func(_ byte, name string, _ uint32, _ bool) (bool, error) { return name != "recent", nil }
	cases := []struct {
		name    string
		ex      Exec
		backend Backend
		opts    []Option
		compat  func(byte, string, uint32, bool) (bool, error)
		want    string
		whyHas  string
	}{
		{"proven", v("v1.8.9", "v1.8.9"), BackendNFT, nil, all, WriterNetlink, ""},
		{"newer release", v("v1.8.11", "v1.8.11"), BackendNFT, nil, all, WriterRestore, "iptables-nft is version 1.8.11"},
		{"older in IPv6 only", v("v1.8.9", "v1.8.7"), BackendNFT, nil, all, WriterRestore, "ip6tables-nft is version 1.8.7"},
		{"unproven allowed", v("v1.8.11", "v1.8.11"), BackendNFT, []Option{WithUnprovenNetlink()}, all, WriterNetlink, ""},
		{"garbled version", v("vX", "vX"), BackendNFT, nil, all, WriterRestore, "cannot tell iptables-nft's version"},
		{"turned off", v("v1.8.9", "v1.8.9"), BackendNFT, []Option{WithNetlink(false)}, all, WriterRestore, "turned off"},
		{"legacy", v("v1.8.9", "v1.8.9"), BackendLegacy, nil, all, WriterRestore, "legacy backend"},
		{"kernel lacks a match", v("v1.8.9", "v1.8.9"), BackendNFT, nil, noRecent, WriterRestore, "the kernel lacks [recent rev 1]"},
		{"no namespace access", v("v1.8.9", "v1.8.9").scriptedExec, BackendNFT, nil, all, WriterRestore, "cannot reach"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := labConfig()
			cfg.Families = []model.Family{model.IPv4, model.IPv6}
			p, _ := New(cfg, append([]Option{WithExec(tc.ex), WithBackend(tc.backend)}, tc.opts...)...)
			p.compat = tc.compat
			p.chooseWriter(context.Background())
			if p.writer != tc.want || !strings.Contains(p.writerWhy, tc.whyHas) {
				t.Errorf("writer %q (%q), want %q (%q)", p.writer, p.writerWhy, tc.want, tc.whyHas)
			}
		})
	}
}
