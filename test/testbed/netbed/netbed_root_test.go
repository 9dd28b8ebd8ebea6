package netbed

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/test/testbed/netbed/echo"
)

// TestRootBed builds a small bed and checks pod-to-pod across nodes, node to
// pod, client to node, and that nothing routes out. Needs root. The echo
// binary is KPROXY_ECHO, or built from ./test/echo into a temporary directory.
func TestRootBed(t *testing.T) {
	RequireRoot(t)
	bin := os.Getenv("KPROXY_ECHO")
	if bin == "" {
		bin = filepath.Join(t.TempDir(), "kproxy-echo")
		if out, err := exec.Command("go", "build", "-o", bin, "../../echo").CombinedOutput(); err != nil {
			t.Fatalf("building the echo server: %v\n%s", err, out)
		}
	}
	if _, err := os.Stat(bin); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("echo binary: %v", err)
		}
		t.Skipf("echo binary missing: %v", err)
	}
	b := Start(t, Options{Prefix: "kptu" + strings.TrimPrefix(New(Options{}).Prefix(), "kpt"), EchoBinary: bin})
	ctx := context.Background()
	p1, err := b.AddPod(ctx, "node1", "a", PodPorts{})
	if err != nil {
		t.Fatal(err)
	}
	p2, err := b.AddPod(ctx, "node2", "b", PodPorts{TCP: []int{8080}, UDP: []int{8080}})
	if err != nil {
		t.Fatal(err)
	}
	for _, proto := range []string{echo.ProtoHTTP, echo.ProtoTCP, echo.ProtoUDP} {
		for _, dst := range []netip.Addr{p2.IP4, p2.IP6} {
			res := p1.Send(ctx, echo.Request{Proto: proto, Dst: netip.AddrPortFrom(dst, 8080)})
			if !res.OK() || res.Reply.Pod != "b" {
				t.Errorf("%s a->b %s: %s", proto, dst, res)
			}
		}
	}
	res := b.Nodes()[0].Send(ctx, echo.Request{Proto: echo.ProtoTCP, Dst: netip.AddrPortFrom(p2.IP6, 8080), Src: netip.AddrPortFrom(netip.Addr{}, 40123)})
	if !res.OK() || res.Reply.Source.Port() != 40123 || res.Reply.Source.Addr() != b.Nodes()[0].Spec.IP6 {
		t.Errorf("node1 -> b with fixed source port: %s", res)
	}
	// HTTP from inside a namespace: the echo server answers GET too.
	code, body, err := b.Nodes()[0].HTTPGet(ctx, "http://"+netip.AddrPortFrom(p2.IP4, 8080).String()+"/")
	if err != nil || code != 200 || !strings.HasPrefix(body, "pod=b src="+b.Nodes()[0].Spec.IP4.String()) {
		t.Errorf("HTTPGet from node1: %d %q %v", code, body, err)
	}
	for _, ns := range b.Namespaces() {
		if out, err := ns.IP(ctx, "route", "get", "1.1.1.1"); err == nil {
			t.Errorf("%s routes out: %s", ns.Name, out)
		}
	}
}
