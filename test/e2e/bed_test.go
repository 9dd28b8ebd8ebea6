//go:build e2e

package e2e

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/kproxy/kproxy/test/testbed/netbed"
	"github.com/kproxy/kproxy/test/testbed/netbed/echo"
)

// echoPort is the port every pod's echo server listens on (TCP, UDP, SCTP).
const echoPort = 8080

// newBed builds the network testbed (hub, nodes, client; no pods) for t and
// tears it down when t ends.
func newBed(t *testing.T) *netbed.Bed {
	t.Helper()
	return netbed.Start(t, netbed.Options{Layout: testLayout(), EchoBinary: echoBinary(t)})
}

// podsPerNode is how many echo pods newBedWithPods puts on every node.
const podsPerNode = 2

// newBedWithPods builds the testbed with podsPerNode pods on every node,
// named <node>-<i>; pods are returned node by node.
func newBedWithPods(t *testing.T) (*netbed.Bed, []*netbed.Pod) {
	t.Helper()
	bed := newBed(t)
	var pods []*netbed.Pod
	for _, n := range bed.Nodes() {
		for i := range podsPerNode {
			name := n.Spec.Name + "-" + string(rune('a'+i))
			p, err := bed.AddPod(context.Background(), n.Spec.Name, name, netbed.PodPorts{})
			if err != nil {
				t.Fatal(err)
			}
			pods = append(pods, p)
		}
	}
	return bed, pods
}

// eventuallyOK repeats req from ns until it gets a reply (at most ~10 s) and
// fails t otherwise.
func eventuallyOK(t *testing.T, ns *netbed.Netns, req echo.Request) echo.Result {
	t.Helper()
	var res echo.Result
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if res = ns.Send(context.Background(), req); res.OK() {
			return res
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s -> %s (%s): no reply in 10s: %s", ns.Name, req.Dst, req.Proto, res)
	return res
}

// addrOf returns a or b, whichever is of the family of like.
func addrOf(like, a, b netip.Addr) netip.Addr {
	if like.Is4() == a.Is4() {
		return a
	}
	return b
}
