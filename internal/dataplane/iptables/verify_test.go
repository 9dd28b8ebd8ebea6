package iptables

import (
	"testing"

	"github.com/kproxy/kproxy/internal/dataplane/dptest"
)

// TestPortObjects: each port's rules are counted, and an endpoint more
// is rules more.
func TestPortObjects(t *testing.T) {
	p, _ := New(labConfig())
	snap := dptest.Snapshot(
		dptest.Svc("ns", "one", "198.19.0.10", 80, dptest.WithEPs(dptest.EP("198.18.64.10", 8080, true))),
		dptest.Svc("ns", "three", "198.19.0.11", 80, dptest.WithEPs(dptest.EP("198.18.64.10", 8080, true), dptest.EP("198.18.64.11", 8080, true), dptest.EP("198.18.65.10", 8080, false))),
	)
	got := p.PortObjects(snap.V4, snap.Node)
	one, three := got[snap.V4.Ports[0].ID], got[snap.V4.Ports[1].ID]
	if one == 0 || three <= one || len(got) != 2 {
		t.Fatalf("objects %v", got)
	}
}
