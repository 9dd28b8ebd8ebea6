package daemon

import (
	"context"
	"strings"
	"testing"

	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/objects"
)

type recordedEvent struct{ key, uid, reason, message string }

type fakeEvents struct{ got []recordedEvent }

func (f *fakeEvents) ServiceWarning(key objects.Key, uid, reason, message string) {
	f.got = append(f.got, recordedEvent{key.String(), uid, reason, message})
}

func (f *fakeEvents) ProxyServiceWarning(key objects.Key, reason, action, message string) {
	f.got = append(f.got, recordedEvent{key.String(), action, reason, message})
}

func (f *fakeEvents) NodeEvent(eventType, reason, action, message string) {
	f.got = append(f.got, recordedEvent{"node", eventType + "/" + action, reason, message})
}

func TestBalancingFor(t *testing.T) {
	for _, tc := range []struct {
		mode, name string
		want       model.Balancing
		err        string
	}{
		{ModeNFTables, "", model.BalanceRandom, ""},
		{ModeNFTables, "source-hash", model.BalanceSourceHash, ""},
		{ModeNFTables, "least-connections", 0, "not supported in nftables mode"},
		{ModeIPTables, "source-hash", 0, "not supported in iptables mode"},
		{ModeIPTables, "round-robin", model.BalanceRoundRobin, ""},
		{ModeIPVS, "least-connections", model.BalanceLeastConnections, ""},
		{ModeNFTables, "fastest", 0, "not one of"},
	} {
		got, err := balancingFor(tc.mode, tc.name)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s %q: err %v, want %q", tc.mode, tc.name, err, tc.err)
			}
			continue
		}
		if err != nil || got.Default != tc.want || got.Mode != tc.mode {
			t.Errorf("%s %q: %+v, %v; want default %v", tc.mode, tc.name, got, err, tc.want)
		}
	}
}

// TestProblemEvents: a Service whose annotation names an algorithm the
// mode lacks gets one Event naming the reason (once, however many syncs
// see the problem); problems of other kinds get none.
func TestProblemEvents(t *testing.T) {
	lb, err := balancingFor(ModeIPTables, "random")
	if err != nil {
		t.Fatal(err)
	}
	svc := &objects.Service{Namespace: "ns", Name: "web", UID: "u-1", Type: "ClusterIP", ClusterIPs: []string{"198.19.0.10"},
		Ports: []objects.ServicePort{{Name: "http", Protocol: "TCP", Port: 80}}, LoadBalancing: "source-hash"}
	in := model.Input{NodeName: "node1", Services: map[objects.Key]*objects.Service{svc.Key(): svc}, Balancing: lb}
	snap, problems := model.Build(in)
	if p := snap.V4.Ports[0]; p.Balancing != model.BalanceRandom {
		t.Errorf("port balancing %v, want the default (random)", p.Balancing)
	}
	ev := &fakeEvents{}
	log := problemLog{events: ev}
	for range 2 {
		log.log(context.Background(), append(problems, model.Problem{Kind: "EndpointSlice", Object: objects.Key{Namespace: "ns", Name: "s"}, Field: "f", Reason: "r"}))
	}
	if len(ev.got) != 1 {
		t.Fatalf("events %+v, want one", ev.got)
	}
	if e := ev.got[0]; e.key != "ns/web" || e.uid != "u-1" || e.reason != model.ReasonUnsupportedBalancing || !strings.Contains(e.message, "source-hash is not supported in iptables mode; using random") {
		t.Errorf("event %+v", e)
	}
}

// TestExternalIPsAllowed: upstream's AllowServiceExternalIPs gate, on by
// default, turns the model's IgnoreExternalIPs on when set to false.
func TestExternalIPsAllowed(t *testing.T) {
	for _, tc := range []struct {
		name  string
		gates map[string]bool
		want  bool
	}{
		{"default", nil, true},
		{"named true", map[string]bool{"AllowServiceExternalIPs": true}, true},
		{"named false", map[string]bool{"AllowServiceExternalIPs": false}, false},
		{"another gate", map[string]bool{"AllAlpha": false}, true},
	} {
		g, err := config.FeatureGateFor(&kpv1alpha1.KubeProxyConfiguration{FeatureGates: tc.gates})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := externalIPsAllowed(g); got != tc.want {
			t.Errorf("%s: externalIPsAllowed = %v, want %v", tc.name, got, tc.want)
		}
	}
	if !externalIPsAllowed(nil) {
		t.Error("a nil gate must allow external IPs")
	}
}
