package ipvs

import (
	"bytes"
	"context"
	"flag"
	"maps"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	libipvs "github.com/moby/ipvs"

	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/dataplane/dptest"
	"github.com/kproxy/kproxy/internal/model"
)

var update = flag.Bool("update", false, "rewrite the golden files")

const nodeIP = "198.18.0.11"

// featureSnapshot has one Service port of each kind IPVS mode renders.
func featureSnapshot() *model.Snapshot {
	sched := func(s string) dptest.SvcOpt { return func(sp *model.ServicePort) { sp.Scheduler = s } }
	return dptest.Snapshot(
		dptest.Svc("ns", "plain", "198.19.0.1", 80, dptest.WithEPs(dptest.EP("198.18.64.10", 8080, false), dptest.EP("198.18.65.10", 8080, true))),
		dptest.Svc("ns", "udp", "198.19.0.2", 53, dptest.WithProto(model.UDP), dptest.WithEPs(dptest.EP("198.18.65.11", 53, true))),
		dptest.Svc("ns", "np", "198.19.0.4", 80, dptest.WithNodePort(30080), dptest.WithEPs(dptest.EP("198.18.65.12", 80, true))),
		dptest.Svc("ns", "lb", "198.19.0.5", 80, dptest.WithNodePort(30081), dptest.WithLB("198.19.100.5"),
			dptest.WithSourceRanges("198.18.200.0/24", "198.19.100.5/32"), dptest.WithETPLocal, dptest.WithEPs(dptest.EP("198.18.65.13", 80, true))),
		dptest.Svc("ns", "ext", "198.19.0.6", 80, dptest.WithExternalIPs("198.19.50.1"), dptest.WithEPs(dptest.EP("198.18.64.14", 80, false))),
		dptest.Svc("ns", "aff", "198.19.0.7", 80, dptest.WithAffinity(600), sched("sh"), dptest.WithEPs(dptest.EP("198.18.64.15", 80, false))),
		dptest.Svc("ns", "none", "198.19.0.8", 80),
		dptest.Svc("ns", "v6", "fd00:19::9", 80, dptest.WithEPs(dptest.EP("fd00:64::10", 8080, false))),
	)
}

func testConfig() dataplane.Config {
	cfg := dptest.Config()
	cfg.Families = []model.Family{model.IPv4, model.IPv6}
	cfg.IPVS.Scheduler = "wrr"
	return cfg
}

func TestRenderGolden(t *testing.T) {
	p, _ := New(testConfig(), withKernel(newFakeKernel()))
	var b bytes.Buffer
	if err := p.Render(&b, featureSnapshot()); err != nil {
		t.Fatal(err)
	}
	const file = "testdata/features.golden"
	if *update {
		if err := os.WriteFile(file, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if b.String() != string(want) {
		t.Errorf("rendered rules differ from %s (go test -run Golden -update):\n%s", file, b.String())
	}
}

func newTestProxier(t *testing.T, k *fakeKernel) *Proxier {
	p, err := New(testConfig(), withKernel(k))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func syncSnap(t *testing.T, p *Proxier, snap *model.Snapshot, full bool) {
	t.Helper()
	if err := p.Sync(context.Background(), snap, dataplane.SyncRequest{Full: full}); err != nil {
		t.Fatal(err)
	}
}

const tcp, udp = "6 ", "17 "

func TestSyncProgramsEverything(t *testing.T) {
	k := newFakeKernel(nodeIP, "127.0.0.1", "fe80::1")
	p := newTestProxier(t, k)
	syncSnap(t, p, featureSnapshot(), true)
	for svc, want := range map[string]string{
		tcp + "198.19.0.1:80":        "wrr",
		udp + "198.19.0.2:53":        "wrr",
		tcp + nodeIP + ":30080":      "wrr",
		tcp + "198.19.100.5:80":      "wrr",
		tcp + "198.19.50.1:80":       "wrr",
		tcp + "198.19.0.7:80":        "sh",
		tcp + "198.19.0.8:80":        "wrr",
		tcp + "[fd00:19::9]:80":      "wrr",
		tcp + "127.0.0.1:30080":      "",
		tcp + "[fe80::1]:30080":      "",
		tcp + "198.19.0.4:30080":     "",
		tcp + "198.18.0.11:30081":    "wrr",
		tcp + "198.19.100.5:30081":   "",
		tcp + "198.19.0.5:80":        "wrr",
		tcp + "198.18.64.10:8080":    "",
		tcp + "[fd00:64::10]:8080":   "",
		tcp + "198.19.0.6:80":        "wrr",
		tcp + "198.19.0.4:80":        "wrr",
		tcp + "[fd00:0:0:10::11]:80": "",
	} {
		s := k.svcs[svc]
		switch {
		case want == "" && s != nil:
			t.Errorf("unexpected virtual server %s", svc)
		case want != "" && s == nil:
			t.Errorf("no virtual server %s", svc)
		case want != "" && s.SchedName != want:
			t.Errorf("%s: scheduler %s, want %s", svc, s.SchedName, want)
		}
	}
	if s := k.svcs[tcp+"198.19.0.7:80"]; s == nil || s.Flags&flagPersistent == 0 || s.Timeout != 600 {
		t.Errorf("affinity service not persistent for 600 s: %+v", s)
	}
	if got := k.reals(tcp + "198.19.0.1:80"); len(got) != 2 || got["198.18.64.10:8080"] != 1 {
		t.Errorf("plain's real servers: %v", got)
	}
	// ETP Local: the external frontends have only the local endpoint.
	if got := k.reals(tcp + "198.19.100.5:80"); len(got) != 1 || got["198.18.65.13:80"] != 1 {
		t.Errorf("lb's external real servers: %v", got)
	}
	for _, a := range []string{"198.19.0.1", "198.19.100.5", "198.19.50.1", "fd00:19::9"} {
		if !k.addrs[netip.MustParseAddr(a)] {
			t.Errorf("%s not bound to %s", a, DummyDevice)
		}
	}
	if k.addrs[netip.MustParseAddr(nodeIP)] {
		t.Error("the node IP was bound to the dummy")
	}
	for set, member := range map[string]string{
		"KUBE-CLUSTER-IP":                "198.19.0.1,tcp:80",
		"KUBE-6-CLUSTER-IP":              "fd00:19::9,tcp:80",
		"KUBE-NODE-PORT-TCP":             "30080",
		"KUBE-NODE-PORT-LOCAL-TCP":       "30081",
		"KUBE-LOAD-BALANCER-LOCAL":       "198.19.100.5,tcp:80",
		"KUBE-LOAD-BALANCER-SOURCE-CIDR": "198.19.100.5,tcp:80,198.19.100.5",
		"KUBE-LOOP-BACK":                 "198.18.65.10,tcp:8080,198.18.65.10",
		"KUBE-IPVS-IPS":                  "198.19.50.1",
		"KUBE-EXTERNAL-IP":               "198.19.50.1,tcp:80",
	} {
		if !k.sets[set][member] {
			t.Errorf("set %s lacks %s: %v", set, member, k.sets[set])
		}
	}
	if k.sets["KUBE-LOOP-BACK"]["198.18.64.10,tcp:8080,198.18.64.10"] {
		t.Error("a remote endpoint is in KUBE-LOOP-BACK")
	}
	if k.sysctls["net.ipv4.vs.conntrack"] != 1 || !k.dummy {
		t.Error("IPVS conntrack sysctl or dummy interface not set up")
	}
	if len(k.jumps) != 2*len(jumps) {
		t.Errorf("%d jumps, want %d", len(k.jumps), 2*len(jumps))
	}

	// The same snapshot again: an incremental sync changes nothing; a full
	// one (and a restarted proxy's first) rewrites only the iptables
	// chains, which it does not read back.
	n := len(k.writes)
	syncSnap(t, p, featureSnapshot(), false)
	if len(k.writes) != n {
		t.Errorf("an incremental sync of an unchanged snapshot wrote: %v", k.writes[n:])
	}
	for _, p := range []*Proxier{p, newTestProxier(t, k)} {
		n := len(k.writes)
		syncSnap(t, p, featureSnapshot(), true)
		if got := strings.Join(k.writes[n:], ","); got != "iptables-restore IPv4,iptables-restore IPv6" {
			t.Errorf("a full sync of an unchanged snapshot wrote: %s", got)
		}
	}
}

func TestServiceGoes(t *testing.T) {
	k := newFakeKernel(nodeIP)
	p := newTestProxier(t, k)
	syncSnap(t, p, featureSnapshot(), true)
	snap := dptest.Snapshot(dptest.Svc("ns", "plain", "198.19.0.1", 80, dptest.WithEPs(dptest.EP("198.18.64.10", 8080, false))))
	syncSnap(t, p, snap, false)
	if len(k.svcs) != 1 || k.svcs[tcp+"198.19.0.1:80"] == nil {
		t.Errorf("virtual servers after the others went: %v", k.svcs)
	}
	if len(k.addrs) != 1 || !k.addrs[netip.MustParseAddr("198.19.0.1")] {
		t.Errorf("bound addresses: %v", k.addrs)
	}
	if len(k.sets["KUBE-NODE-PORT-TCP"]) != 0 || len(k.sets["KUBE-CLUSTER-IP"]) != 1 || len(k.sets["KUBE-6-CLUSTER-IP"]) != 0 {
		t.Errorf("set members left: %v", k.sets)
	}
}

// TestRefusedServiceFailsAlone: a virtual server the kernel refuses (a
// scheduler it lacks) is logged and left out; the sync succeeds with every
// other Service in place, a later sync programs it once the kernel takes
// it, and one the kernel refuses to update keeps its current form.
func TestRefusedServiceFailsAlone(t *testing.T) {
	sched := func(s string) dptest.SvcOpt { return func(sp *model.ServicePort) { sp.Scheduler = s } }
	snapWith := func(s string) *model.Snapshot {
		return dptest.Snapshot(
			dptest.Svc("ns", "odd", "198.19.0.1", 80, sched(s), dptest.WithEPs(dptest.EP("198.18.64.10", 8080, false))),
			dptest.Svc("ns", "plain", "198.19.0.2", 80, dptest.WithEPs(dptest.EP("198.18.64.11", 8080, false))),
		)
	}
	k := newFakeKernel(nodeIP)
	k.noSched = map[string]bool{"twos": true}
	p := newTestProxier(t, k)
	syncSnap(t, p, snapWith("twos"), true)
	if k.svcs[tcp+"198.19.0.1:80"] != nil {
		t.Error("the refused virtual server exists")
	}
	if got := k.reals(tcp + "198.19.0.2:80"); len(got) != 1 {
		t.Errorf("the other Service's real servers: %v", got)
	}
	// Retried at every sync, incremental ones included.
	syncSnap(t, p, snapWith("twos"), false)
	delete(k.noSched, "twos")
	syncSnap(t, p, snapWith("twos"), false)
	if s := k.svcs[tcp+"198.19.0.1:80"]; s == nil || s.SchedName != "twos" || len(k.reals(tcp+"198.19.0.1:80")) != 1 {
		t.Errorf("the virtual server once the kernel takes it: %+v, reals %v", s, k.reals(tcp+"198.19.0.1:80"))
	}
	// An update the kernel refuses leaves the server as it was.
	k.noSched["lc"] = true
	syncSnap(t, p, snapWith("lc"), false)
	if s := k.svcs[tcp+"198.19.0.1:80"]; s == nil || s.SchedName != "twos" {
		t.Errorf("after a refused update: %+v", s)
	}
	delete(k.noSched, "lc")
	syncSnap(t, p, snapWith("lc"), false)
	if s := k.svcs[tcp+"198.19.0.1:80"]; s == nil || s.SchedName != "lc" {
		t.Errorf("after the update is taken: %+v", s)
	}
}

// TestGracefulTermination: a real server that goes keeps weight 0 while it
// has connections, and is deleted once it has none; a UDP one goes at once.
func TestGracefulTermination(t *testing.T) {
	k := newFakeKernel(nodeIP)
	p := newTestProxier(t, k)
	two := func(proto model.Protocol, eps ...*model.Endpoint) *model.Snapshot {
		return dptest.Snapshot(dptest.Svc("ns", "a", "198.19.0.1", 80, dptest.WithProto(proto), dptest.WithEPs(eps...)))
	}
	a, b := dptest.EP("198.18.64.10", 80, false), dptest.EP("198.18.64.11", 80, false)
	syncSnap(t, p, two(model.TCP, a, b), true)
	svc := tcp + "198.19.0.1:80"
	k.dests[svc]["198.18.64.11:80"].ActiveConnections = 3
	syncSnap(t, p, two(model.TCP, a), false)
	if got := k.reals(svc); len(got) != 2 || got["198.18.64.11:80"] != 0 {
		t.Fatalf("draining real server: %v, want weight 0", got)
	}
	syncSnap(t, p, two(model.TCP, a), false)
	if got := k.reals(svc); got["198.18.64.11:80"] != 0 || len(got) != 2 {
		t.Fatalf("real server with connections went: %v", got)
	}
	k.dests[svc]["198.18.64.11:80"].ActiveConnections = 0
	syncSnap(t, p, two(model.TCP, a), false)
	if got := k.reals(svc); len(got) != 1 {
		t.Errorf("drained real server stays: %v", got)
	}
	// It comes back: weight 1 again.
	syncSnap(t, p, two(model.TCP, a, b), false)
	if got := k.reals(svc); got["198.18.64.11:80"] != 1 {
		t.Errorf("returning real server: %v", got)
	}

	k2 := newFakeKernel(nodeIP)
	p2 := newTestProxier(t, k2)
	syncSnap(t, p2, two(model.UDP, a, b), true)
	usvc := udp + "198.19.0.1:80"
	k2.dests[usvc]["198.18.64.11:80"].ActiveConnections = 3
	syncSnap(t, p2, two(model.UDP, a), false)
	if got := k2.reals(usvc); len(got) != 1 {
		t.Errorf("UDP real server not deleted at once: %v", got)
	}

	// SCTP too, as upstream's (no graceful termination).
	k3 := newFakeKernel(nodeIP)
	p3 := newTestProxier(t, k3)
	syncSnap(t, p3, two(model.SCTP, a, b), true)
	ssvc := "132 198.19.0.1:80"
	if k3.dests[ssvc] == nil {
		t.Fatalf("no SCTP virtual server %q in %v", ssvc, slices.Collect(maps.Keys(k3.dests)))
	}
	k3.dests[ssvc]["198.18.64.11:80"].ActiveConnections = 3
	syncSnap(t, p3, two(model.SCTP, a), false)
	if got := k3.reals(ssvc); len(got) != 1 {
		t.Errorf("SCTP real server not deleted at once: %v", got)
	}
}

// TestExcludeCIDRs: virtual servers in excludeCIDRs are another
// component's; kproxy neither deletes nor cleans them up.
func TestExcludeCIDRs(t *testing.T) {
	k := newFakeKernel(nodeIP)
	foreign := &libipvs.Service{Address: netip.MustParseAddr("198.19.200.1").AsSlice(), Protocol: 6, Port: 443, SchedName: "rr", AddressFamily: 2}
	stale := &libipvs.Service{Address: netip.MustParseAddr("198.19.0.99").AsSlice(), Protocol: 6, Port: 443, SchedName: "rr", AddressFamily: 2}
	_ = k.NewService(foreign)
	_ = k.NewService(stale)
	cfg := testConfig()
	cfg.IPVS.ExcludeCIDRs = []netip.Prefix{netip.MustParsePrefix("198.19.200.0/24")}
	p, _ := New(cfg, withKernel(k))
	syncSnap(t, p, featureSnapshot(), true)
	if k.svcs[svcKey(foreign)] == nil || k.svcs[svcKey(stale)] != nil {
		t.Errorf("excluded kept / stale deleted: %v %v", k.svcs[svcKey(foreign)] != nil, k.svcs[svcKey(stale)] != nil)
	}
	if err := p.Cleanup(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(k.sets) != 0 || k.dummy {
		t.Errorf("after Cleanup: sets %v, dummy %v", k.sets, k.dummy)
	}
}

func TestStrictARPAndTimeouts(t *testing.T) {
	k := newFakeKernel(nodeIP)
	cfg := testConfig()
	cfg.IPVS.StrictARP = true
	cfg.IPVS.TCPTimeout = 900e9
	p, _ := New(cfg, withKernel(k))
	syncSnap(t, p, featureSnapshot(), true)
	if k.sysctls["net.ipv4.conf.all.arp_ignore"] != 1 || k.sysctls["net.ipv4.conf.all.arp_announce"] != 2 {
		t.Errorf("strictARP sysctls: %v", k.sysctls)
	}
	if !strings.Contains(strings.Join(k.writes, "\n"), "timeouts 15m0s 0s 0s") {
		t.Errorf("IPVS timeouts not set: %v", k.writes)
	}
}

// TestInitNode: --init-only sets the sysctls and timeouts, as upstream's
// proxier does before its init-only return, and programs nothing else.
func TestInitNode(t *testing.T) {
	k := newFakeKernel(nodeIP)
	cfg := testConfig()
	cfg.IPVS.StrictARP = true
	cfg.IPVS.UDPTimeout = 30e9
	p, _ := New(cfg, withKernel(k))
	if err := p.InitNode(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"net.ipv4.vs.conntrack": 1, "net.ipv4.vs.expire_nodest_conn": 1, "net.ipv4.vs.expire_quiescent_template": 1,
		"net.ipv4.ip_forward": 1, "net.ipv4.conf.all.arp_ignore": 1, "net.ipv4.conf.all.arp_announce": 2}
	if !maps.Equal(k.sysctls, want) {
		t.Errorf("sysctls %v, want %v", k.sysctls, want)
	}
	if !slices.Contains(k.writes, "timeouts 0s 0s 30s") {
		t.Errorf("IPVS timeouts not set: %v", k.writes)
	}
	if k.dummy || len(k.svcs) != 0 || len(k.sets) != 0 || len(k.rules) != 0 {
		t.Errorf("init-only programmed more: dummy %v, services %d, sets %d, rules %d", k.dummy, len(k.svcs), len(k.sets), len(k.rules))
	}
}

func TestParseIPSetSave(t *testing.T) {
	out := "create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536\n" +
		"add KUBE-CLUSTER-IP 198.19.0.1,tcp:80\ncreate OTHER hash:ip\nadd OTHER 1.2.3.4\ncreate KUBE-NODE-PORT-TCP bitmap:port range 0-65535\n"
	got := parseIPSetSave(out)
	if len(got) != 2 || len(got["KUBE-CLUSTER-IP"]) != 1 || got["KUBE-NODE-PORT-TCP"] == nil {
		t.Errorf("parseIPSetSave = %v", got)
	}
}

// TestDriftedWhenDummyGoes: deleting kube-ipvs0 (or a Service IP on it) is
// drift, and the next sync binds the addresses again.
func TestDriftedWhenDummyGoes(t *testing.T) {
	k := newFakeKernel(nodeIP)
	p := newTestProxier(t, k)
	if d, _ := p.Drifted(context.Background()); d {
		t.Fatal("drifted before the first sync")
	}
	syncSnap(t, p, featureSnapshot(), true)
	if d, err := p.Drifted(context.Background()); d || err != nil {
		t.Fatalf("drifted right after a sync: %v %v", d, err)
	}
	_ = k.DeleteDummy()
	if d, _ := p.Drifted(context.Background()); !d {
		t.Fatal("deleted kube-ipvs0 not noticed")
	}
	syncSnap(t, p, featureSnapshot(), false)
	if !k.dummy || !k.addrs[netip.MustParseAddr("198.19.0.1")] {
		t.Error("the sync after the drift did not repair kube-ipvs0")
	}
}

// TestSourceHashFallsBack: source-hash is the mh scheduler with its
// fallback flag, so that a client whose real server drains (weight 0) is
// sent elsewhere rather than refused.
func TestSourceHashFallsBack(t *testing.T) {
	sp := dptest.Svc("ns", "sh", "198.19.0.40", 80, dptest.WithBalancing(model.BalanceSourceHash), dptest.WithEPs(dptest.EP("198.18.64.10", 8080, true)))
	vs := &virtualServer{scheduler: scheduler(sp, "")}
	if s := service(vs); s.SchedName != "mh" || s.Flags&flagMHFallback == 0 {
		t.Errorf("source-hash virtual server: scheduler %q, flags %#x; want mh with the fallback flag", s.SchedName, s.Flags)
	}
	if s := service(&virtualServer{scheduler: "rr"}); s.Flags&flagMHFallback != 0 {
		t.Errorf("rr virtual server has the mh flag: %#x", s.Flags)
	}
}

// TestLocalPolicyWithoutLocalEndpoints: as upstream's IPVS mode, a Local
// policy's virtual servers take the cluster's endpoints when none is on this
// node, unless the port uses no cluster endpoints at all
// (internalTrafficPolicy Local, not externally accessible).
func TestLocalPolicyWithoutLocalEndpoints(t *testing.T) {
	remote := func(ip string) dptest.SvcOpt { return dptest.WithEPs(dptest.EP(ip, 80, false)) }
	mixed := dptest.WithEPs(dptest.EP("198.18.65.14", 80, false), dptest.EP("198.18.64.14", 80, true))
	snap := dptest.Snapshot(
		dptest.Svc("ns", "etp", "198.19.0.4", 80, dptest.WithNodePort(30080), dptest.WithETPLocal, remote("198.18.65.12")),
		dptest.Svc("ns", "itp-np", "198.19.0.5", 80, dptest.WithNodePort(30081), dptest.WithITPLocal, remote("198.18.65.13")),
		dptest.Svc("ns", "itp", "198.19.0.6", 80, dptest.WithITPLocal, remote("198.18.65.15")),
		dptest.Svc("ns", "etp-local", "198.19.0.7", 80, dptest.WithNodePort(30082), dptest.WithETPLocal, mixed),
	)
	d := render(testConfig(), snap.Family(model.IPv4), model.NodeInfo{Name: "node-a", Known: true}, []netip.Addr{netip.MustParseAddr(nodeIP)})
	for _, tc := range []struct {
		addr string
		port uint16
		want []string
	}{
		{nodeIP, 30080, []string{"198.18.65.12:80"}},
		{"198.19.0.4", 80, []string{"198.18.65.12:80"}},
		{"198.19.0.5", 80, []string{"198.18.65.13:80"}},
		{nodeIP, 30081, []string{"198.18.65.13:80"}},
		{"198.19.0.6", 80, nil},
		{nodeIP, 30082, []string{"198.18.64.14:80"}},
	} {
		vs := d.servers[vsKey{addr: netip.MustParseAddr(tc.addr), proto: model.TCP, port: tc.port}]
		if vs == nil {
			t.Errorf("%s:%d: no virtual server", tc.addr, tc.port)
			continue
		}
		var got []string
		for _, r := range vs.reals {
			got = append(got, r.String())
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s:%d: real servers %v, want %v", tc.addr, tc.port, got, tc.want)
		}
	}
}

// TestNodeAddressNotBound: an externalIP or LoadBalancer IP that is an
// address of the node gets its virtual server but is not bound to
// kube-ipvs0 (nor in KUBE-IPVS-IPS), as upstream's: bound, the node would
// refuse its other ports.
func TestNodeAddressNotBound(t *testing.T) {
	snap := dptest.Snapshot(
		dptest.Svc("ns", "ext", "198.19.0.6", 80, dptest.WithExternalIPs(nodeIP, "198.19.50.1"), dptest.WithEPs(dptest.EP("198.18.64.14", 80, false))),
		dptest.Svc("ns", "lb", "198.19.0.7", 81, dptest.WithLB("198.18.0.12"), dptest.WithEPs(dptest.EP("198.18.64.15", 80, false))),
	)
	local := []netip.Addr{netip.MustParseAddr(nodeIP), netip.MustParseAddr("198.18.0.12"), netip.MustParseAddr("127.0.0.1")}
	d := render(testConfig(), snap.Family(model.IPv4), model.NodeInfo{Name: "node-a", Known: true}, local)
	for addr, port := range map[string]uint16{nodeIP: 80, "198.18.0.12": 81, "198.19.50.1": 80} {
		if d.servers[vsKey{addr: netip.MustParseAddr(addr), proto: model.TCP, port: port}] == nil {
			t.Errorf("no virtual server %s:%d", addr, port)
		}
	}
	var bound []string
	for a := range d.bound {
		bound = append(bound, a.String())
	}
	slices.Sort(bound)
	if want := []string{"198.19.0.6", "198.19.0.7", "198.19.50.1"}; !slices.Equal(bound, want) {
		t.Errorf("bound %v, want %v", bound, want)
	}
	if ips := slices.Sorted(maps.Keys(d.sets[setIPVSIPs])); !slices.Equal(ips, []string{"198.19.0.6", "198.19.0.7", "198.19.50.1"}) {
		t.Errorf("%s holds %v", setIPVSIPs, ips)
	}
}

// TestConfiguredMHHashesPorts: --ipvs-scheduler mh gets upstream's flag,
// mh-port (its FlagSourceHash), not kproxy's source-hash mh-fallback.
func TestConfiguredMHHashesPorts(t *testing.T) {
	cfg := testConfig()
	cfg.IPVS.Scheduler = "mh"
	snap := dptest.Snapshot(
		dptest.Svc("ns", "plain", "198.19.0.1", 80, dptest.WithEPs(dptest.EP("198.18.64.10", 8080, false))),
		dptest.Svc("ns", "sh", "198.19.0.2", 80, dptest.WithBalancing(model.BalanceSourceHash), dptest.WithEPs(dptest.EP("198.18.64.11", 8080, false))),
	)
	d := render(cfg, snap.Family(model.IPv4), model.NodeInfo{Name: "node-a", Known: true}, nil)
	for addr, want := range map[string]uint32{"198.19.0.1": flagMHPort, "198.19.0.2": flagMHFallback} {
		vs := d.servers[vsKey{addr: netip.MustParseAddr(addr), proto: model.TCP, port: 80}]
		if s := service(vs); s.SchedName != "mh" || s.Flags&(flagMHPort|flagMHFallback) != want {
			t.Errorf("%s: scheduler %q flags %#x, want mh with %#x", addr, s.SchedName, s.Flags, want)
		}
		if !sameService(service(vs), vs) {
			t.Errorf("%s: the kernel's copy of its own service differs", addr)
		}
	}
}

// TestNoLocalDetection: without a way to tell local traffic (no cluster
// CIDR of the family), the node's own connections with a Service IP as
// source are masqueraded, as upstream's; with one, traffic from outside
// the cluster is.
func TestNoLocalDetection(t *testing.T) {
	snap := featureSnapshot()
	for _, tc := range []struct {
		name  string
		cidrs []netip.Prefix
		want  string
	}{
		{"none", nil, "-m set --match-set KUBE-CLUSTER-IP src,dst -j MARK --or-mark 0x4000"},
		{"cluster CIDR", dptest.Config().ClusterCIDRs, "-m set --match-set KUBE-CLUSTER-IP dst,dst ! -s " + dptest.ClusterNet.String() + " -j MARK --or-mark 0x4000"},
	} {
		cfg := testConfig()
		cfg.ClusterCIDRs = tc.cidrs
		d := render(cfg, snap.Family(model.IPv4), model.NodeInfo{Name: "node-a", Known: true}, nil)
		if !strings.Contains(d.rules, tc.want) {
			t.Errorf("%s: rules lack %q:\n%s", tc.name, tc.want, d.rules)
		}
	}
}

// TestConnReuseMode: on kernels 4.1 to 5.8 the full sync (and
// --init-only) sets net.ipv4.vs.conn_reuse_mode=0, as upstream does;
// other kernels keep theirs.
func TestConnReuseMode(t *testing.T) {
	for _, tc := range []struct {
		release string
		set     bool
	}{
		{"4.0.9", false},
		{"4.1.0", true},
		{"4.19.0-26-amd64", true},
		{"5.4.0-150-generic", true},
		{"5.8.18", true},
		{"5.9.0", false},
		{"6.1.0-57-amd64", false},
		{"4.19-rc1", true},
		{"garbage", false},
	} {
		t.Run(tc.release, func(t *testing.T) {
			k := newFakeKernel(nodeIP)
			k.release = tc.release
			k.sysctls["net.ipv4.vs.conn_reuse_mode"] = 1
			p, _ := New(testConfig(), withKernel(k))
			syncSnap(t, p, featureSnapshot(), true)
			if got := k.sysctls["net.ipv4.vs.conn_reuse_mode"] == 0; got != tc.set {
				t.Errorf("conn_reuse_mode set to 0: %v, want %v", got, tc.set)
			}
		})
	}
}
