//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/explain"
	"github.com/kproxy/kproxy/internal/inspect"
	"github.com/kproxy/kproxy/test/testbed/netbed/echo"
)

// testInspect: kproxy inspect, run on node1 against the running kproxy's
// debug endpoint, shows a Service that traffic just reached, with its
// ClusterIP and NodePort frontends and exactly the endpoints that
// answered, and a successful last sync; the table names it too; kproxy
// explain --debug-address answers from the live snapshot as explain from
// the API does.
func testInspect(t *testing.T, b *fbed, f family) {
	kproxyOnly(t, "kproxy's debug endpoint")
	svc := b.applyService(t, svcName("inspect", f), v1.ServiceTypeNodePort)
	on2 := b.podsOn("node2")
	b.setSlices(t, svc.Name, nil, readyEPs(on2...))
	vip := clusterIP(t, svc, f.v6)
	r := req(echo.ProtoTCP, vip, 80)
	got := waitForPods(t, b.exited, b.pods[0].Netns, r, on2...)
	node := b.node(0)
	name := svc.Namespace + "/" + svc.Name + ":tcp"
	var entry inspect.Service
	eventually(t, b.exited, func() error {
		st, err := inspectState(t, node)
		if err != nil {
			return err
		}
		if st.Node != "node1" || st.Mode != b.mode || st.LastSuccess == nil || st.Syncs < 1 {
			return fmt.Errorf("node %q mode %q lastSuccess %v syncs %d", st.Node, st.Mode, st.LastSuccess, st.Syncs)
		}
		i := slices.IndexFunc(st.Services, func(s inspect.Service) bool {
			return s.Service == name && s.Family == familyName(f)
		})
		if i < 0 {
			return fmt.Errorf("no %s %s in %d services", name, familyName(f), len(st.Services))
		}
		entry = st.Services[i]
		return nil
	}, "inspect shows %s", name)
	wantFront := []string{netip.AddrPortFrom(vip, 80).String(), fmt.Sprintf("NodePort %d", nodePort(t, svc, "tcp"))}
	if !slices.Equal(entry.Frontends, wantFront) {
		t.Errorf("inspect frontends %v, want %v", entry.Frontends, wantFront)
	}
	var eps []string
	for _, e := range entry.Endpoints {
		if e.State != "ready" || e.Local {
			t.Errorf("endpoint %+v: want ready on another node", e)
		}
		eps = append(eps, e.Address)
	}
	var want []string
	for _, p := range on2 {
		want = append(want, netip.AddrPortFrom(podIP(p, f), echoPort).String())
	}
	slices.Sort(eps)
	slices.Sort(want)
	if !slices.Equal(eps, want) || entry.ClusterEndpoints != len(want) {
		t.Errorf("inspect endpoints %v (cluster %d), traffic reached %v (%s)", eps, entry.ClusterEndpoints, want, got)
	}
	// Objects: the rules and elements the mode writes for the port; IPVS
	// mode does not count them.
	uncounted := b.mode == "ipvs" || b.mode == "userspace"
	if uncounted != (entry.Objects < 0) || entry.Objects == 0 {
		t.Errorf("inspect objects %d in %s mode", entry.Objects, b.mode)
	}
	table, err := node.Run(context.Background(), kproxyBinary(t), "inspect", "--address", debugAddress)
	if err != nil || !strings.Contains(table, name) || !strings.Contains(table, "node node1, "+b.mode+" mode") {
		t.Errorf("inspect table (err %v) lacks %s:\n%s", err, name, table)
	}
	live, err := node.Run(context.Background(), kproxyBinary(t), "explain", "--debug-address", debugAddress,
		"--from", podIP(b.pods[0], f).String(), "--to", r.Dst.String(), "-o", "json")
	var a explain.Answer
	if err != nil || json.Unmarshal([]byte(live), &a) != nil {
		t.Fatalf("explain --debug-address: %v\n%s", err, live)
	}
	fromAPI := b.explainOn(t, node, podIP(b.pods[0], f), r)
	if a.Verdict != fromAPI.Verdict || !slices.Equal(a.Endpoints, fromAPI.Endpoints) || a.Masquerade != fromAPI.Masquerade {
		t.Errorf("explain from the live kproxy %+v, from the API %+v", a, fromAPI)
	}
}

func familyName(f family) string {
	if f.v6 {
		return "IPv6"
	}
	return "IPv4"
}
