package nftables

import (
	"bytes"
	"flag"
	"hash/fnv"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/dataplane/dptest"
	"github.com/kproxy/kproxy/internal/model"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current output")

// featureSnapshot has one Service per feature; the packet tracer tests use
// it as well.
func featureSnapshot() *model.Snapshot {
	remote := dptest.EP("198.18.65.10", 8080, false)
	local := dptest.EP("198.18.64.10", 8080, true)
	return dptest.Snapshot(
		dptest.Svc("ns", "cluster", "198.19.0.10", 80, dptest.WithEPs(dptest.EP("198.18.65.10", 8080, false), dptest.EP("198.18.64.10", 8080, true), dptest.EP("198.18.65.11", 8080, false))),
		dptest.Svc("ns", "udp", "198.19.0.11", 53, dptest.WithProto(model.UDP), dptest.WithEPs(dptest.EP("198.18.65.12", 5353, false))),
		dptest.Svc("ns", "sctp", "198.19.0.12", 9000, dptest.WithProto(model.SCTP), dptest.WithEPs(dptest.EP("198.18.65.13", 9000, false))),
		dptest.Svc("ns", "noeps", "198.19.0.13", 80, dptest.WithNodePort(30013), dptest.WithExternalIPs("198.19.100.13")),
		dptest.Svc("ns", "nodeport", "198.19.0.14", 80, dptest.WithNodePort(30014), dptest.WithEPs(remote, local)),
		dptest.Svc("ns", "lb", "198.19.0.15", 80, dptest.WithNodePort(30015), dptest.WithLB("198.19.100.15"), dptest.WithSourceRanges("198.18.200.0/24"), dptest.WithEPs(remote, local)),
		dptest.Svc("ns", "extip", "198.19.0.16", 80, dptest.WithExternalIPs("198.19.100.16"), dptest.WithEPs(remote)),
		dptest.Svc("ns", "etplocal", "198.19.0.17", 80, dptest.WithNodePort(30017), dptest.WithLB("198.19.100.17"), dptest.WithETPLocal, dptest.WithEPs(remote, local)),
		dptest.Svc("ns", "etplocal-none", "198.19.0.18", 80, dptest.WithNodePort(30018), dptest.WithLB("198.19.100.18"), dptest.WithETPLocal, dptest.WithEPs(remote)),
		dptest.Svc("ns", "itplocal", "198.19.0.19", 80, dptest.WithITPLocal, dptest.WithEPs(remote, local)),
		dptest.Svc("ns", "itplocal-none", "198.19.0.20", 80, dptest.WithITPLocal, dptest.WithEPs(remote)),
		dptest.Svc("ns", "affinity", "198.19.0.21", 80, dptest.WithAffinity(10800), dptest.WithEPs(remote, local)),
		dptest.Svc("ns", "terminating", "198.19.0.22", 80, dptest.WithNodePort(30022), dptest.WithEPs(dptest.Terminating(dptest.EP("198.18.65.14", 8080, false)))),
		dptest.Svc("ns", "roundrobin", "198.19.0.24", 80, dptest.WithBalancing(model.BalanceRoundRobin), dptest.WithEPs(remote, local, dptest.EP("198.18.65.11", 8080, false))),
		dptest.Svc("ns", "sourcehash", "198.19.0.25", 80, dptest.WithBalancing(model.BalanceSourceHash), dptest.WithEPs(remote, local, dptest.EP("198.18.65.11", 8080, false))),
		dptest.Svc("ns", "rr-affinity", "198.19.0.26", 80, dptest.WithBalancing(model.BalanceRoundRobin), dptest.WithAffinity(60), dptest.WithEPs(remote, local)),
		dptest.Svc("ns", "sh-affinity", "198.19.0.27", 80, dptest.WithBalancing(model.BalanceSourceHash), dptest.WithAffinity(60), dptest.WithEPs(remote, local)),
		dptest.Svc("ns", "dual", "fd00:19::10", 80, dptest.WithNodePort(30023), dptest.WithEPs(dptest.EP("fd00:65::10", 8080, false), dptest.EP("fd00:64::10", 8080, true))),
	)
}

func TestRenderGolden(t *testing.T) {
	dual := dptest.Config()
	dual.Families = []model.Family{model.IPv4, model.IPv6}
	dual.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("198.19.0.0/24"), netip.MustParsePrefix("fd00:19::/112")}
	masqAll := dptest.Config()
	masqAll.MasqueradeAll = true
	masqAll.NodePortAddresses = []string{"primary", "198.18.1.0/24"}
	// Overlapping ranges (ServiceCIDR objects may overlap) and another
	// family's: one interval element remains.
	masqAll.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("198.19.0.0/25"), netip.MustParsePrefix("198.19.0.1/16"), netip.MustParsePrefix("fd00:19::/112")}
	bridge := dptest.Config()
	bridge.LocalMode = dataplane.LocalBridgeInterface
	bridge.BridgeInterface = "cbr0"
	cases := []struct {
		name string
		cfg  dataplane.Config
		snap *model.Snapshot
	}{
		{"empty", dptest.Config(), dptest.Snapshot()},
		{"features", dual, featureSnapshot()},
		{"masquerade-all-nodeport-addresses", masqAll, dptest.Snapshot(dptest.Svc("ns", "nodeport", "198.19.0.14", 80, dptest.WithNodePort(30014), dptest.WithEPs(dptest.EP("198.18.65.10", 8080, false))))},
		{"bridge-interface", bridge, dptest.Snapshot(dptest.Svc("ns", "etplocal", "198.19.0.17", 80, dptest.WithNodePort(30017), dptest.WithETPLocal, dptest.WithEPs(dptest.EP("198.18.64.10", 8080, true))))},
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
	p, _ := New(dptest.Config())
	var a, b bytes.Buffer
	_ = p.Render(&a, featureSnapshot())
	_ = p.Render(&b, featureSnapshot())
	if a.String() != b.String() {
		t.Fatal("two renders of the same snapshot differ")
	}
}

// TestAffinityHash: the affinity ids are kept in the kernel's affinity set
// across restarts and upgrades, so affinityHash must stay the FNV-1a hash
// of "HUMAN/ADDRESS/PORT" (the address's colons as dots) it always was.
func TestAffinityHash(t *testing.T) {
	for _, ep := range []*model.Endpoint{
		dptest.EP("198.18.64.10", 8080, false),
		dptest.EP("198.18.0.1", 1, true),
		dptest.EP("fd00:0:0:100::a", 65535, false),
		dptest.EP("fd00::1:2:3:4", 80, false),
	} {
		for _, human := range []string{"ns/svc/tcp/p", "", "a-very-long-namespace/with-a-long-name/sctp/metrics-port"} {
			h := fnv.New32a()
			h.Write([]byte(human + "/" + epName(ep)))
			if got, want := affinityHash(human, ep, nil), h.Sum32(); got != want {
				t.Errorf("affinityHash(%q, %s) = %#x, want %#x", human, ep.AddrPort(), got, want)
			}
		}
	}
}

// epName is an endpoint as the affinity ids name it: ADDRESS/PORT, the
// address's colons as dots.
func epName(ep *model.Endpoint) string {
	return strings.ReplaceAll(ep.IP.String(), ":", ".") + "/" + strconv.Itoa(int(ep.Port))
}
