package iptables

import (
	"bytes"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
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
	t.Run("empty", func(t *testing.T) { golden(t, "empty", renderText(t, dptest.Config(), nil, dptest.Snapshot())) })
	for _, v := range configVariants(dptest.Config) {
		t.Run(v.name, func(t *testing.T) { golden(t, v.name, renderText(t, v.cfg, v.opts, featureSnapshot())) })
	}
}

func renderText(t *testing.T, cfg dataplane.Config, opts []Option, snap *model.Snapshot) string {
	t.Helper()
	p, err := New(cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := p.Render(&b, snap); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestChainNamesMatchUpstream(t *testing.T) {
	// Upstream's hash of "ns/svc:p" + "tcp".
	id := model.PortID{Namespace: "ns1", Name: "svc1", Port: "p80", Protocol: model.TCP}
	if got := chainsOf(id).svc; got != "KUBE-SVC-XPGD46QRK7WJZT7O" {
		t.Errorf("KUBE-SVC name = %s", got)
	}
}

// configVariant is a configuration the golden, translation and netlink
// tests render the feature snapshot with.
type configVariant struct {
	name string
	cfg  dataplane.Config
	opts []Option
}

// configVariants are dual-stack, masquerade-all with nodePortAddresses,
// and the bridge and interface-prefix local-traffic detectors, each on
// top of base().
func configVariants(base func() dataplane.Config) []configVariant {
	dual := base()
	dual.Families = []model.Family{model.IPv4, model.IPv6}
	masqAll := base()
	masqAll.MasqueradeAll = true
	masqAll.NodePortAddresses = []string{"198.18.0.2/32", "127.0.0.0/8"}
	bridge := base()
	bridge.LocalMode = dataplane.LocalBridgeInterface
	bridge.BridgeInterface = "cbr0"
	prefix := base()
	prefix.LocalMode = dataplane.LocalInterfacePrefix
	prefix.InterfacePrefix = "veth"
	return []configVariant{
		{name: "features", cfg: dual},
		{name: "masquerade-all-nodeport-addresses", cfg: masqAll},
		{name: "bridge-no-localhost", cfg: bridge, opts: []Option{WithLocalhostNodePorts(false)}},
		{name: "interface-prefix", cfg: prefix},
	}
}

// TestRenderCounters: with upstream's nfacct counters, the INVALID drop
// counts into one, and every NodePort gets a rule for 127.0.0.0/8 ahead of
// its own, counting into the other (IPv4 only, and only with localhost
// NodePorts).
func TestRenderCounters(t *testing.T) {
	cfg := dptest.Config()
	cfg.Families = []model.Family{model.IPv4, model.IPv6}
	snap := featureSnapshot()
	var b bytes.Buffer
	for _, f := range cfg.Families {
		rs := Render(Params{Config: cfg, LocalhostNodePorts: true, Counters: Counters{InvalidDropped: true, LocalhostAccepted: true}}, snap.Family(f), snap.Node)
		b.WriteString("# " + f.String() + "\n" + RestoreText(rs))
	}
	golden(t, "counters", b.String())

	rs := Render(Params{Config: cfg, LocalhostNodePorts: false, Counters: Counters{InvalidDropped: true, LocalhostAccepted: true}}, snap.Family(model.IPv4), snap.Node)
	if text := RestoreText(rs); bytes.Contains([]byte(text), []byte(nfacctLocalhostArg)) {
		t.Errorf("localhost NodePorts off, yet a rule counts localhost NodePort packets:\n%s", text)
	}
}

// TestTraceLocalhostNodePortCounted: the host's connection to a NodePort on
// 127.0.0.1 takes the counting rule and ends where it did without it.
func TestTraceLocalhostNodePortCounted(t *testing.T) {
	lo := netip.MustParseAddr("127.0.0.1")
	pkt := dptest.Packet{Src: lo, Dst: lo, Proto: "tcp", DPort: 30004, FromHost: true}
	for name, of := range map[string]func(testing.TB, Params, *model.Snapshot, model.Family) *testTracer{"typed": traceOf, "text": traceTextOf} {
		plain, counted := testParams(), testParams()
		counted.Counters = Counters{InvalidDropped: true, LocalhostAccepted: true}
		want := of(t, plain, featureSnapshot(), model.IPv4).trace(pkt)
		got := of(t, counted, featureSnapshot(), model.IPv4).trace(pkt)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: with the counting rule %+v, without %+v", name, got, want)
		}
		if want.Verdict != "accept" {
			t.Errorf("%s: 127.0.0.1:30004 from the host: %+v, want accepted to the endpoint", name, want)
		}
	}
}

const nfacctLocalhostArg = "-m nfacct --nfacct-name localhost_nps_accepted_pkts"
