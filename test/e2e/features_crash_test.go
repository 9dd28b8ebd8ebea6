//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/kproxy/kproxy/internal/inspect"
	"github.com/kproxy/kproxy/test/testbed/controlplane"
	"github.com/kproxy/kproxy/test/testbed/netbed"
	"github.com/kproxy/kproxy/test/testbed/netbed/echo"
)

// testCrashUnderChurn (kproxy-only): node1's kproxy is killed (SIGKILL)
// in the middle of a storm of 1,000 endpoint changes to ten Services and
// started again once the storm is over. An established connection
// through another Service keeps working throughout; afterwards the
// kernel agrees with a fresh render of the API's state (explain --verify
// of every churned Service, in the modes that verify) and sends to
// exactly the endpoints the API lists; and the restarted process's first
// sync writes no more than the churned Services' state on top of what a
// restart with nothing changed writes. In IPVS mode (a VM under TCG,
// where each API write takes ~0.3 s) the storm is 200 changes, killed
// after 80: IPVS does not count kernel changes, and the crash and the
// takeover are the same at that size.
func testCrashUnderChurn(t *testing.T, b *fbed, f family) {
	kproxyOnly(t, "kproxy's debug endpoint counts what a sync writes")
	const services = 10
	changes, killAt := 1000, 400
	if b.mode == "ipvs" {
		changes, killAt = 200, 80
	}
	node := b.node(0)
	kp := b.kproxys[node.Spec.Name]

	anchor := b.applyService(t, svcName("crashanchor", f), v1.ServiceTypeClusterIP)
	b.setSlices(t, anchor.Name, nil, readyEPs(b.pods...))
	churned := make([]*v1.Service, services)
	for i := range churned {
		churned[i] = b.applyService(t, svcName(fmt.Sprintf("crash%d", i), f), v1.ServiceTypeClusterIP)
		b.setSlices(t, churned[i].Name, nil, readyEPs(b.pods...))
	}
	from := b.pods[0]
	dst := netip.AddrPortFrom(clusterIP(t, anchor, f.v6), 80)
	waitForPods(t, b.exited, from.Netns, req(echo.ProtoTCP, dst.Addr(), 80), b.pods...)
	for _, svc := range churned {
		waitForPods(t, b.exited, from.Netns, req(echo.ProtoTCP, clusterIP(t, svc, f.v6), 80), b.pods...)
	}

	// What a restart writes when nothing changed while kproxy was down.
	if err := kp.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := kp.Restart(); err != nil {
		t.Fatal(err)
	}
	b.waitHealthy(t)
	base := b.firstSyncOps(t, node)

	conn, err := echo.DialKeepAlive(from.Netns.Do, dst, 2*time.Second)
	if err != nil {
		t.Fatalf("keep-alive connection to %s: %v", dst, err)
	}
	defer conn.Close()
	p := startFuncProber(conn.Exchange, 50*time.Millisecond, 3*time.Minute)

	// The storm: change i gives Service i%10 the two pods and 1 to 8
	// addresses no pod has (never sent to by a probe), a different set
	// each time.
	slice := func(svc string, i int) *discoveryv1.EndpointSlice {
		var eps []discoveryv1.Endpoint
		for _, pod := range b.pods {
			eps = append(eps, endpointOf(b.api.ns, ep{pod: pod}, f))
		}
		for k := range 1 + (i/services)%8 {
			a := netip.AddrFrom4([4]byte{198, 18, 34, byte(10 + k + i%7)}) // no pod
			if f.v6 {
				a = netip.MustParseAddr(fmt.Sprintf("fd00:0:0:1fe::%x", 10+k+i%7))
			}
			eps = append(eps, controlplane.ReadyEndpoint(a, "node2", ""))
		}
		addrType := sliceAddressType(f)
		return controlplane.NewEndpointSlice(b.api.ns, svc, svc+"-"+f.name, addrType, defaultEndpointPorts(), eps...)
	}
	start := time.Now()
	var killed time.Time
	for i := range changes {
		if i == killAt {
			if err := kp.Kill(); err != nil {
				t.Fatal(err)
			}
			killed = time.Now()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := b.api.cp.ApplyEndpointSlice(ctx, slice(churned[i%services].Name, i))
		cancel()
		if err != nil {
			t.Fatalf("change %d: %v", i, err)
		}
	}
	t.Logf("%d endpoint changes in %v; kproxy killed after %d, down for %v so far",
		changes, time.Since(start).Round(time.Millisecond), killAt, time.Since(killed).Round(time.Millisecond))
	restarted := time.Now()
	if err := kp.Restart(); err != nil {
		t.Fatal(err)
	}
	b.waitHealthy(t)
	t.Logf("restarted and healthy in %v", time.Since(restarted).Round(time.Millisecond))
	after := b.firstSyncOps(t, node)

	// Every churned Service sends to the pods, and the kernel agrees with
	// a fresh render of what the API holds.
	for j, svc := range churned {
		last := changes - services + j // the Service's last change
		want := len(b.pods) + 1 + (last/services)%8
		r := req(echo.ProtoTCP, clusterIP(t, svc, f.v6), 80)
		if a := b.explainOn(t, node, podIP(from, f), r); len(a.Endpoints) != want {
			t.Errorf("%s: explain sends to %d endpoints, want the %d of its last change", svc.Name, len(a.Endpoints), want)
		}
	}
	time.Sleep(500 * time.Millisecond)
	rs := p.Stop()
	if bad := failuresOf(rs); len(bad) > 0 {
		t.Errorf("%d of %d exchanges on the established connection failed:%s", len(bad), len(rs), describeProbes(bad, 10))
	} else {
		t.Logf("established connection: %d exchanges across the crash, none failed", len(rs))
	}
	// The ten Services' endpoints (up to ten each) in both directions of
	// the diff, generously: what a mode writes per endpoint differs.
	bound := base + services*80
	t.Logf("first sync after a quiet restart wrote %d kernel changes; after the crash %d (bound %d)", base, after, bound)
	if after < 0 {
		return // the mode does not count (IPVS)
	}
	if after > bound {
		t.Errorf("the first sync after the crash wrote %d kernel changes; a quiet restart writes %d, the churned Services at most %d more",
			after, base, bound-base)
	}
}

// firstSyncOps returns the kernel changes the first successful sync of
// node's kproxy wrote (-1 when its mode does not count them).
func (b *fbed) firstSyncOps(t *testing.T, node *netbed.Node) int {
	t.Helper()
	ops := -1
	eventually(t, b.exited, func() error {
		st, err := inspectState(t, node)
		if err != nil {
			return err
		}
		if st.FirstSuccess == nil {
			return fmt.Errorf("no successful sync yet")
		}
		if st.FirstSuccess.KernelOps != nil {
			ops = *st.FirstSuccess.KernelOps
		}
		return nil
	}, "kproxy on %s reports its first sync", node.Spec.Name)
	return ops
}

// inspectState reads node's kproxy state with `kproxy inspect -o json`.
func inspectState(t *testing.T, node *netbed.Node) (*inspect.State, error) {
	out, err := node.Run(context.Background(), kproxyBinary(t), "inspect", "--address", debugAddress, "-o", "json")
	if err != nil {
		return nil, err
	}
	var st inspect.State
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		return nil, fmt.Errorf("%v: %s", err, out)
	}
	return &st, nil
}
