//go:build e2e

package e2e

import (
	"context"
	"net/netip"
	"os/exec"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/kproxy/kproxy/test/testbed/controlplane"
)

// TestControlPlaneWatchList checks how the shared API server answers the
// initial list of an informer, and which path kproxy's informers take: by
// default they LIST (kproxy streams the Services and EndpointSlices lists
// item by item, faster than a watch-list; source/api/features.go), and with
// --feature-gates WatchListClient=true, against etcd 3.6 (the default) whose
// API server serves watch-list, kproxy's Services and EndpointSlices arrive
// as watch events and it sends no LIST; against Debian's etcd 3.4.23
// (KPROXY_ETCD=debian) the server refuses watch-list and kproxy lists.
// WatchListClient=false lists whatever the server offers. kproxy runs with
// --dry-run in the root namespace: it reads the API and prints its rules,
// touching no kernel state.
func TestControlPlaneWatchList(t *testing.T) {
	cp := sharedControlPlane(t)
	ctx := context.Background()
	want := controlplane.EtcdServesWatchList(cp.EtcdVersion)
	served, reason, err := cp.ServesWatchList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("etcd %s: watch-list served %v %s", cp.EtcdVersion, served, reason)
	if served != want {
		t.Fatalf("etcd %s: watch-list served = %v (%s), want %v", cp.EtcdVersion, served, reason, want)
	}

	// kproxy waits up to 30 s for its Node's addresses, as upstream does.
	node, err := cp.CreateNode(ctx, "e2e-watchlist", []netip.Prefix{netip.MustParsePrefix("198.18.17.0/24")},
		[]netip.Addr{netip.MustParseAddr("198.18.0.11")}, "zone-a")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.DeleteNode(context.Background(), node.Name) })
	for _, tc := range []struct {
		flags         []string
		wantWatchList bool
	}{
		{nil, false},
		{[]string{"--feature-gates", "WatchListClient=true"}, want},
		{[]string{"--feature-gates", "WatchListClient=false"}, false},
	} {
		before := initialListCounts(t, cp)
		cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		args := append([]string{"--kubeconfig", cp.KproxyKubeconfig, "--hostname-override", node.Name,
			"--proxy-mode", "nftables", "--dry-run", "--v", "2"}, tc.flags...)
		out, err := exec.CommandContext(cctx, kproxyBinary(t), args...).CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("kproxy %v: %v\n%s", args, err, tail(string(out), 40))
		}
		after := initialListCounts(t, cp)
		for _, r := range []string{"services", "endpointslices"} {
			lists, watchLists := after[r].lists-before[r].lists, after[r].watchLists-before[r].watchLists
			t.Logf("kproxy --dry-run %v: %s: %v LIST and %v watch-list requests", tc.flags, r, lists, watchLists)
			switch {
			case tc.wantWatchList && (lists != 0 || watchLists < 1):
				t.Errorf("%v: %s: %v LIST, %v watch-list requests; want the initial list by watch-list only", tc.flags, r, lists, watchLists)
			case !tc.wantWatchList && lists < 1:
				t.Errorf("%v: %s: no LIST request; want one (watch-list refused or turned off)", tc.flags, r)
			}
		}
	}
}

// listCounts are the API server's completed LIST and watch-list requests
// of one resource.
type listCounts struct{ lists, watchLists float64 }

// initialListCounts reads the API server's apiserver_request_total (verb
// LIST) and apiserver_watch_list_duration_seconds (observed when a
// watch-list request's initial events end) by resource.
func initialListCounts(t *testing.T, cp *controlplane.ControlPlane) map[string]listCounts {
	t.Helper()
	fams := parseMetrics(t, func() (string, error) { return cp.Metrics(context.Background()) })
	out := map[string]listCounts{}
	for _, m := range fams["apiserver_request_total"].GetMetric() {
		l := labels(m.GetLabel())
		if l["verb"] == "LIST" {
			c := out[l["resource"]]
			c.lists += m.GetCounter().GetValue()
			out[l["resource"]] = c
		}
	}
	for _, m := range fams["apiserver_watch_list_duration_seconds"].GetMetric() {
		r := labels(m.GetLabel())["resource"]
		c := out[r]
		c.watchLists += float64(m.GetHistogram().GetSampleCount())
		out[r] = c
	}
	return out
}

func labels(pairs []*dto.LabelPair) map[string]string {
	out := make(map[string]string, len(pairs))
	for _, p := range pairs {
		out[p.GetName()] = p.GetValue()
	}
	return out
}
