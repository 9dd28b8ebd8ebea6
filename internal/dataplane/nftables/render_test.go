package nftables

import (
	"bytes"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/model"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current output")

// featureSnapshot has one Service per feature; the packet tracer tests use
// it as well.
func featureSnapshot() *model.Snapshot {
	remote := ep("198.18.65.10", 8080, false)
	local := ep("198.18.64.10", 8080, true)
	return snapshot(
		svc("ns", "cluster", "198.19.0.10", 80, withEPs(ep("198.18.65.10", 8080, false), ep("198.18.64.10", 8080, true), ep("198.18.65.11", 8080, false))),
		svc("ns", "udp", "198.19.0.11", 53, withProto(model.UDP), withEPs(ep("198.18.65.12", 5353, false))),
		svc("ns", "sctp", "198.19.0.12", 9000, withProto(model.SCTP), withEPs(ep("198.18.65.13", 9000, false))),
		svc("ns", "noeps", "198.19.0.13", 80, withNodePort(30013), withExternalIPs("198.19.100.13")),
		svc("ns", "nodeport", "198.19.0.14", 80, withNodePort(30014), withEPs(remote, local)),
		svc("ns", "lb", "198.19.0.15", 80, withNodePort(30015), withLB("198.19.100.15"), withSourceRanges("198.18.200.0/24"), withEPs(remote, local)),
		svc("ns", "extip", "198.19.0.16", 80, withExternalIPs("198.19.100.16"), withEPs(remote)),
		svc("ns", "etplocal", "198.19.0.17", 80, withNodePort(30017), withLB("198.19.100.17"), withETPLocal, withEPs(remote, local)),
		svc("ns", "etplocal-none", "198.19.0.18", 80, withNodePort(30018), withLB("198.19.100.18"), withETPLocal, withEPs(remote)),
		svc("ns", "itplocal", "198.19.0.19", 80, withITPLocal, withEPs(remote, local)),
		svc("ns", "itplocal-none", "198.19.0.20", 80, withITPLocal, withEPs(remote)),
		svc("ns", "affinity", "198.19.0.21", 80, withAffinity(10800), withEPs(remote, local)),
		svc("ns", "terminating", "198.19.0.22", 80, withNodePort(30022), withEPs(terminating(ep("198.18.65.14", 8080, false)))),
		svc("ns", "dual", "fd00:19::10", 80, withNodePort(30023), withEPs(ep("fd00:65::10", 8080, false), ep("fd00:64::10", 8080, true))),
	)
}

func TestRenderGolden(t *testing.T) {
	dual := testConfig()
	dual.Families = []model.Family{model.IPv4, model.IPv6}
	dual.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("198.19.0.0/24"), netip.MustParsePrefix("fd00:19::/112")}
	masqAll := testConfig()
	masqAll.MasqueradeAll = true
	masqAll.NodePortAddresses = []string{"primary", "198.18.1.0/24"}
	// Overlapping ranges (ServiceCIDR objects may overlap) and another
	// family's: one interval element remains.
	masqAll.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("198.19.0.0/25"), netip.MustParsePrefix("198.19.0.1/16"), netip.MustParsePrefix("fd00:19::/112")}
	bridge := testConfig()
	bridge.LocalMode = dataplane.LocalBridgeInterface
	bridge.BridgeInterface = "cbr0"
	cases := []struct {
		name string
		cfg  dataplane.Config
		snap *model.Snapshot
	}{
		{"empty", testConfig(), snapshot()},
		{"features", dual, featureSnapshot()},
		{"masquerade-all-nodeport-addresses", masqAll, snapshot(svc("ns", "nodeport", "198.19.0.14", 80, withNodePort(30014), withEPs(ep("198.18.65.10", 8080, false))))},
		{"bridge-interface", bridge, snapshot(svc("ns", "etplocal", "198.19.0.17", 80, withNodePort(30017), withETPLocal, withEPs(ep("198.18.64.10", 8080, true))))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := New(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			if err := p.Render(&buf, tc.snap); err != nil {
				t.Fatal(err)
			}
			checkGolden(t, filepath.Join("testdata", tc.name+".golden"), buf.Bytes())
		})
	}
}

func checkGolden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if !bytes.Equal(want, got) {
		t.Errorf("%s differs from the rendered rules (run with -update if the change is intended):\n%s", path, got)
	}
}

// TestRenderDeterministic renders the same snapshot twice.
func TestRenderDeterministic(t *testing.T) {
	p, _ := New(testConfig())
	var a, b bytes.Buffer
	_ = p.Render(&a, featureSnapshot())
	_ = p.Render(&b, featureSnapshot())
	if a.String() != b.String() {
		t.Fatal("two renders of the same snapshot differ")
	}
}
