package iptables

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/dataplane/dptest"
	"github.com/kproxy/kproxy/internal/model"
)

var update = flag.Bool("update", false, "rewrite golden files")

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update)", err)
	}
	if string(want) != got {
		t.Errorf("%s differs from golden file (run with -update to accept):\n%s", name, got)
	}
}

func TestRenderGolden(t *testing.T) {
	dual := dptest.Config()
	dual.Families = []model.Family{model.IPv4, model.IPv6}
	masqAll := dptest.Config()
	masqAll.MasqueradeAll = true
	masqAll.NodePortAddresses = []string{"198.18.0.2/32", "127.0.0.0/8"}
	bridge := dptest.Config()
	bridge.LocalMode = dataplane.LocalBridgeInterface
	bridge.BridgeInterface = "cbr0"
	cases := []struct {
		name string
		cfg  dataplane.Config
		opts []Option
		snap *model.Snapshot
	}{
		{"empty", dptest.Config(), nil, dptest.Snapshot()},
		{"features", dual, nil, featureSnapshot()},
		{"masquerade-all-nodeport-addresses", masqAll, nil, featureSnapshot()},
		{"bridge-no-localhost", bridge, []Option{WithLocalhostNodePorts(false)}, featureSnapshot()},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := New(tc.cfg, tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			var b bytes.Buffer
			if err := p.Render(&b, tc.snap); err != nil {
				t.Fatal(err)
			}
			golden(t, tc.name, b.String())
		})
	}
}

func TestChainNamesMatchUpstream(t *testing.T) {
	// Upstream's hash of "ns/svc:p" + "tcp".
	id := model.PortID{Namespace: "ns1", Name: "svc1", Port: "p80", Protocol: model.TCP}
	if got := chainsOf(id).svc; got != "KUBE-SVC-XPGD46QRK7WJZT7O" {
		t.Errorf("KUBE-SVC name = %s", got)
	}
}
