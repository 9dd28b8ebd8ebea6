//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/test/testbed/controlplane"
	"github.com/kproxy/kproxy/test/testbed/netbed"
	"github.com/kproxy/kproxy/test/testbed/netbed/echo"
)

// Helpers of the migration cases (features_migration_test.go): one small
// bed per case, a proxy (upstream kube-proxy or kproxy) on node1 only, and
// probers that keep opening new connections through node1 while the
// proxies are switched.

// upstreamBinary is upstream kube-proxy v1.36.3 as `make testbed-deps`
// builds it, next to the cached kube-apiserver.
func upstreamBinary(t *testing.T) string {
	t.Helper()
	p := filepath.Join(filepath.Dir(controlplane.APIServerPath()), "kube-proxy")
	if _, err := os.Stat(p); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("upstream kube-proxy: %v (run: make testbed-deps)", err)
		}
		t.Skipf("upstream kube-proxy not built: %v (run: make testbed-deps)", err)
	}
	return p
}

// migBed is one migration case's sandbox.
type migBed struct {
	t    *testing.T
	bed  *netbed.Bed
	pods []*netbed.Pod
	api  *api
	node *netbed.Node // node1: where the proxies are switched
	svc  *v1.Service  // a NodePort Service backed by every pod
	kcfg string       // kubeconfig of the kproxy user, inside the node
	proc *netbed.Process
}

func newMigBed(t *testing.T, namespace string) *migBed {
	t.Helper()
	bed, pods := newBedWithPods(t)
	b := &migBed{t: t, bed: bed, pods: pods, api: newAPI(t, namespace), node: bed.Nodes()[0], kcfg: nodeKubeconfig(t)}
	b.api.applyNodes(bed)
	b.svc = b.api.createService("mig", v1.ServiceTypeNodePort)
	b.api.setEndpoints(b.svc.Name, pods)
	t.Cleanup(func() {
		if t.Failed() {
			b.dump()
		}
	})
	return b
}

// proxySpec says how a proxy is started: which binary, which mode, and
// whether through flags or a kubeadm-style --config file.
type proxySpec struct {
	bin, mode string
	config    bool
	extra     []string // more flags (with flags only)
}

func (s proxySpec) String() string {
	how := "flags"
	if s.config {
		how = "config file"
	}
	return fmt.Sprintf("%s %s (%s)", filepath.Base(s.bin), s.mode, how)
}

// args are the proxy's command line: upstream flags only.
func (b *migBed) args(s proxySpec) []string {
	if s.config {
		return []string{s.bin, "--config", b.writeConfig(s.mode), "--hostname-override", b.node.Spec.Name}
	}
	return append([]string{s.bin,
		"--kubeconfig", b.kcfg,
		"--hostname-override", b.node.Spec.Name,
		"--proxy-mode", s.mode,
		"--healthz-bind-address", netip.AddrPortFrom(b.node.Spec.IP4, 10256).String(),
		"--metrics-bind-address", "127.0.0.1:10249",
		"--cluster-cidr", clusterCIDRs(),
		// nf_conntrack_max is global, not per namespace: leave it alone.
		"--conntrack-max-per-core", "0",
		"--v", "2",
	}, s.extra...)
}

// kubeadmConfig is a KubeProxyConfiguration as kubeadm writes it to its
// kube-proxy ConfigMap (every field spelled out, most left at their zero
// value for the proxy to default), with the testbed's kubeconfig, cluster
// CIDRs and mode. maxPerCore is 0 because nf_conntrack_max is global.
const kubeadmConfig = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
bindAddress: 0.0.0.0
bindAddressHardFail: false
clientConnection:
  acceptContentTypes: ""
  burst: 0
  contentType: ""
  kubeconfig: %s
  qps: 0
clusterCIDR: %s
configSyncPeriod: 0s
conntrack:
  maxPerCore: 0
  min: null
  tcpBeLiberal: false
  tcpCloseWaitTimeout: null
  tcpEstablishedTimeout: null
  udpStreamTimeout: 0s
  udpTimeout: 0s
detectLocal:
  bridgeInterface: ""
  interfaceNamePrefix: ""
detectLocalMode: ""
enableProfiling: false
healthzBindAddress: ""
hostnameOverride: ""
iptables:
  localhostNodePorts: null
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
ipvs:
  excludeCIDRs: null
  minSyncPeriod: 0s
  scheduler: ""
  strictARP: false
  syncPeriod: 0s
  tcpFinTimeout: 0s
  tcpTimeout: 0s
  udpTimeout: 0s
kind: KubeProxyConfiguration
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: "0"
    text:
      infoBufferSize: "0"
  verbosity: 2
metricsBindAddress: ""
mode: %s
nftables:
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
nodePortAddresses: null
oomScoreAdj: null
showHiddenMetricsForVersion: ""
winkernel:
  enableDSR: false
  forwardHealthCheckVip: false
  networkName: ""
  rootHnsEndpointName: ""
  sourceVip: ""
`

// writeConfig writes the kubeadm-style config file for mode.
func (b *migBed) writeConfig(mode string) string {
	b.t.Helper()
	path := filepath.Join(b.t.TempDir(), "kube-proxy-"+mode+".yaml")
	text := fmt.Sprintf(kubeadmConfig, b.kcfg, clusterCIDRs(), mode)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		b.t.Fatal(err)
	}
	return path
}

// start runs the proxy of s on node1 and waits until its /healthz answers.
func (b *migBed) start(s proxySpec) {
	b.t.Helper()
	name := "kproxy"
	if strings.HasPrefix(filepath.Base(s.bin), "kube-proxy") {
		name = "kube-proxy"
	}
	p, err := b.node.Start(name, b.args(s)...)
	if err != nil {
		b.t.Fatal(err)
	}
	b.proc = p
	start := time.Now()
	url := "http://" + netip.AddrPortFrom(b.node.Spec.IP4, 10256).String() + "/healthz"
	// Upstream serves /healthz only after its start-up cleanup of the
	// other modes' state (iptables-save and -restore per family, an exec
	// per IPVS ip set) and its first sync: in the TCG VM 38 s to over 60 s.
	eventuallyWithin(b.t, proxyStartTimeout, b.exited, func() error {
		code, body, err := b.node.HTTPGet(context.Background(), url)
		if err == nil && code != 200 {
			err = fmt.Errorf("status %d: %s", code, body)
		}
		return err
	}, "%s healthy", s)
	b.t.Logf("%s healthy after %v", s, time.Since(start).Round(time.Millisecond))
}

// stop stops the running proxy (SIGTERM, then SIGKILL after 5 s).
func (b *migBed) stop() {
	b.t.Helper()
	if err := b.proc.Stop(); err != nil {
		b.t.Fatal(err)
	}
	b.t.Logf("%s stopped: %v", b.proc.Name, b.proc.ExitErr())
}

// exited reports the proxy's exit as an error (abortFunc).
func (b *migBed) exited() error {
	if b.proc != nil && !b.proc.Running() {
		return fmt.Errorf("%s exited (%v); log %s:\n%s", b.proc.Name, b.proc.ExitErr(), b.proc.LogPath, tail(b.proc.Log(), 40))
	}
	return nil
}

// probe is one continuously repeated request: from where, what.
type probe struct {
	name string
	from *netbed.Netns
	req  echo.Request
}

// probes are new connections through node1 in both families: a pod on
// node1 to the ClusterIP (TCP and UDP), the client to node1's NodePort.
func (b *migBed) probes() []probe {
	var out []probe
	client := b.bed.Client()
	for _, f := range families {
		vip := clusterIP(b.t, b.svc, f.v6)
		np := netip.AddrPortFrom(nodeAddr(b.node, f), nodePort(b.t, b.svc, "tcp"))
		tcp := echo.Request{Proto: echo.ProtoTCP, Dst: netip.AddrPortFrom(vip, 80), Timeout: dropTimeout(f)}
		out = append(out,
			probe{"pod->ClusterIP/tcp/" + f.name, b.pods[0].Netns, tcp},
			probe{"client->NodePort/tcp/" + f.name, client, echo.Request{Proto: echo.ProtoTCP, Dst: np, Timeout: dropTimeout(f)}})
		if !f.v6 {
			udp := tcp
			udp.Proto = echo.ProtoUDP
			out = append(out, probe{"pod->ClusterIP/udp/" + f.name, b.pods[0].Netns, udp})
		}
	}
	return out
}

// waitServing waits until every probe is answered by every pod.
func (b *migBed) waitServing(want ...*netbed.Pod) {
	b.t.Helper()
	for _, p := range b.probes() {
		waitForPods(b.t, b.exited, p.from, p.req, want...)
	}
}

// probeInterval is the pause between two probes of one prober.
const probeInterval = 20 * time.Millisecond

// probing is a set of running probers.
type probing struct {
	probes  []probe
	probers []*prober
}

func (b *migBed) startProbing() *probing {
	ps := &probing{probes: b.probes()}
	for _, p := range ps.probes {
		ps.probers = append(ps.probers, startProber(p.from, p.req, probeInterval, 3*time.Minute))
	}
	return ps
}

// probeNames are the probes' names, in probe order.
func (ps *probing) probeNames() []string {
	out := make([]string, len(ps.probes))
	for i, p := range ps.probes {
		out[i] = p.name
	}
	return out
}

// stop ends probing and returns each probe's results, in probe order.
func (ps *probing) stop() [][]probeResult { return stopAll(ps.probers) }

// stopAll stops every prober and returns their results, in order.
func stopAll(probers []*prober) [][]probeResult {
	out := make([][]probeResult, len(probers))
	for i, p := range probers {
		out[i] = p.Stop()
	}
	return out
}

// --- kernel state -------------------------------------------------------------

// nftTables lists node1's nftables tables as "family name".
func (b *migBed) nftTables() []string {
	b.t.Helper()
	out, err := b.node.Run(context.Background(), "nft", "list", "tables")
	if err != nil {
		b.t.Fatal(err)
	}
	var tables []string
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "table" {
			tables = append(tables, f[1]+" "+f[2])
		}
	}
	return tables
}

// hasNFTable reports whether node1 has the nftables table name in any family.
func (b *migBed) hasNFTable(name string) bool {
	for _, t := range b.nftTables() {
		if strings.HasSuffix(t, " "+name) {
			return true
		}
	}
	return false
}

// iptablesSave is node1's iptables-save of both families.
func (b *migBed) iptablesSave() string {
	b.t.Helper()
	var sb strings.Builder
	for _, v6 := range []bool{false, true} {
		out, err := b.node.IptablesSave(context.Background(), v6)
		if err != nil {
			b.t.Fatal(err)
		}
		sb.WriteString(out)
	}
	return sb.String()
}

// kubeChains lists node1's KUBE-* iptables chains (both families) as
// "table chain".
func (b *migBed) kubeChains() []string {
	return leftoverChains(b.iptablesSave())
}

// duplicateRules lists rules that appear twice in one chain of one
// iptables-save (a jump added by each proxy, say).
func duplicateRules(save string) []string {
	var dups []string
	seen := map[string]bool{}
	table := ""
	for _, l := range strings.Split(save, "\n") {
		switch {
		case strings.HasPrefix(l, "*"):
			table = l
			clear(seen)
		case strings.HasPrefix(l, "-A "):
			if seen[l] {
				dups = append(dups, table+" "+l)
			}
			seen[l] = true
		}
	}
	return dups
}

// rulesMentioning returns the lines of node1's iptables rules and of the
// nftables rules and set elements that can still affect a packet that
// name addr. Sets nothing refers to are inert and not searched: kproxy's
// leave some in the kube-proxy table after a rollback to upstream.
func (b *migBed) rulesMentioning(addr netip.Addr) []string {
	b.t.Helper()
	var out []string
	lines := append(liveIPTablesRules(b.iptablesSave()), b.nftGraph().liveText()...)
	for _, l := range append(lines, b.ipvsRealServers()...) {
		if containsAddr(l, addr) {
			out = append(out, strings.TrimSpace(l))
		}
	}
	return out
}

// liveIPTablesRules returns the rules of an iptables-save output that can
// affect a packet: those of the built-in chains and of every chain a
// reachable rule jumps or goes to, per table. Chains nothing reaches (an
// iptables mode's, left by upstream's ipvs mode) are inert.
func liveIPTablesRules(save string) []string {
	var out []string
	for _, sec := range strings.Split(save, "\n*")[0:] {
		rules := map[string][]string{}
		for _, l := range strings.Split(sec, "\n") {
			if f := strings.Fields(l); len(f) > 2 && f[0] == "-A" {
				rules[f[1]] = append(rules[f[1]], l)
			}
		}
		seen := map[string]bool{}
		var visit func(chain string)
		visit = func(chain string) {
			if seen[chain] {
				return
			}
			seen[chain] = true
			for _, l := range rules[chain] {
				out = append(out, l)
				f := strings.Fields(l)
				for i := 0; i+1 < len(f); i++ {
					if f[i] == "-j" || f[i] == "-g" {
						visit(f[i+1])
					}
				}
			}
		}
		for _, c := range []string{"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"} {
			visit(c)
		}
	}
	return out
}

// ipvsRealServers lists node1's IPVS real servers that take new
// connections (weight > 0; a draining one has weight 0) as
// "real server ADDR:PORT" lines.
func (b *migBed) ipvsRealServers() []string {
	out, err := b.node.Run(context.Background(), "cat", "/proc/net/ip_vs")
	if err != nil {
		return nil
	}
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) < 4 || f[0] != "->" || f[3] == "0" {
			continue
		}
		if ap, ok := parseProcIPVS(f[1]); ok {
			lines = append(lines, "real server "+ap.String())
		}
	}
	return lines
}

// parseProcIPVS reads an address of /proc/net/ip_vs: C0A80001:0050 or
// [fd00:0000:...:0001]:0050.
func parseProcIPVS(s string) (netip.AddrPort, bool) {
	i := strings.LastIndex(s, ":")
	if i < 0 {
		return netip.AddrPort{}, false
	}
	port, err := strconv.ParseUint(s[i+1:], 16, 16)
	if err != nil {
		return netip.AddrPort{}, false
	}
	host := strings.Trim(s[:i], "[]")
	if !strings.Contains(host, ":") {
		v, err := strconv.ParseUint(host, 16, 32)
		if err != nil {
			return netip.AddrPort{}, false
		}
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), uint16(port)), true
	}
	a, err := netip.ParseAddr(host)
	return netip.AddrPortFrom(a, uint16(port)), err == nil
}

// nftGraph reads node1's whole nftables ruleset.
func (b *migBed) nftGraph() *nftGraph {
	b.t.Helper()
	out, err := b.node.Run(context.Background(), "nft", "-j", "list", "ruleset")
	if err != nil {
		b.t.Fatal(err)
	}
	g, err := parseNFTGraph(out)
	if err != nil {
		b.t.Fatal(err)
	}
	return g
}

// containsAddr reports whether line names addr as a whole token.
func containsAddr(line string, addr netip.Addr) bool {
	for _, tok := range strings.FieldsFunc(line, func(r rune) bool {
		return r == ' ' || r == '/' || r == ',' || r == '{' || r == '}' || r == '[' || r == ']' || r == '"'
	}) {
		if tok == addr.String() {
			return true
		}
		if ap, err := netip.ParseAddrPort(tok); err == nil && ap.Addr() == addr {
			return true
		}
	}
	return false
}

// ipvsSetNames are ip sets upstream's ipvs mode creates.
var ipvsSetNames = []string{"KUBE-CLUSTER-IP", "KUBE-6-CLUSTER-IP", "KUBE-NODE-PORT-TCP"}

// addIPVSSets creates, in node1, ip sets as an earlier ipvs-mode run
// leaves them.
func (b *migBed) addIPVSSets() {
	b.t.Helper()
	for _, name := range ipvsSetNames {
		typ, fam := "hash:ip,port", "inet"
		if strings.Contains(name, "-6-") {
			fam = "inet6"
		}
		if strings.Contains(name, "NODE-PORT") {
			typ = "bitmap:port"
		}
		args := []string{"ipset", "create", name, typ}
		if typ == "bitmap:port" {
			args = append(args, "range", "0-65535")
		} else {
			args = append(args, "family", fam)
		}
		if out, err := b.node.Run(context.Background(), args...); err != nil {
			b.t.Fatalf("%v: %v %s", args, err, out)
		}
	}
}

// kubeIPSets lists node1's KUBE-* ip sets.
func (b *migBed) kubeIPSets() []string {
	b.t.Helper()
	out, err := b.node.Run(context.Background(), "ipset", "list", "-n")
	if err != nil {
		b.t.Fatal(err)
	}
	var sets []string
	for _, l := range strings.Fields(out) {
		if strings.HasPrefix(l, "KUBE-") {
			sets = append(sets, "ipset "+l)
		}
	}
	return sets
}

// legacyTables lists the legacy (xtables) iptables tables instantiated in
// node1, both families. Merely running iptables-legacy-save creates them.
func (b *migBed) legacyTables() string {
	b.t.Helper()
	// A kernel without the ip_tables module (the IPVS VM's, until
	// something loads it) has neither file: no legacy table.
	out, err := b.node.Run(context.Background(), "sh", "-c", "cat /proc/net/ip_tables_names /proc/net/ip6_tables_names 2>/dev/null || true")
	if err != nil {
		b.t.Fatal(err)
	}
	return strings.Join(strings.Fields(out), ",")
}

// dump logs node1's rules and the proxy's log.
func (b *migBed) dump() {
	ctx := context.Background()
	nft, err := b.node.Run(ctx, "nft", "list", "ruleset")
	b.t.Logf("---- nft list ruleset on %s (err=%v) ----\n%s", b.node.Spec.Name, err, nft)
	for _, v6 := range []bool{false, true} {
		out, err := b.node.IptablesSave(ctx, v6)
		b.t.Logf("---- iptables-save ipv6=%v on %s (err=%v) ----\n%s", v6, b.node.Spec.Name, err, out)
	}
	if b.proc != nil {
		b.t.Logf("---- %s log (%s) ----\n%s", b.proc.Name, b.proc.LogPath, tail(b.proc.Log(), 60))
	}
}
