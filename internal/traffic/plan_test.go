package traffic

import (
	"strings"
	"testing"

	"github.com/kproxy/kproxy/internal/dataplane/dptest"
	"github.com/kproxy/kproxy/internal/model"
)

func planText(s *familyState, snap *model.Snapshot) string {
	var b strings.Builder
	for _, o := range s.plan(snap.V4) {
		b.WriteString(o.String() + "\n")
	}
	return b.String()
}

// TestPlan: the first plan resets the table and adds everything; later
// ones touch only the ports that changed; a key two ports claim stays
// with the first; a port that goes releases its keys and counters.
func TestPlan(t *testing.T) {
	web := dptest.Svc("ns", "web", "198.19.0.10", 80, dptest.WithNodePort(30080), dptest.WithExternalIPs("198.18.0.50"))
	dns := dptest.Svc("kube-system", "dns", "198.19.0.53", 53, dptest.WithProto(model.UDP))
	var s familyState
	steps := []struct {
		name string
		snap *model.Snapshot
		want string
	}{
		{"first", dptest.Snapshot(web, dns), `reset table
add counters kube-system/dns/p/UDP
add element frontends { 198.19.0.53 . udp . 53 : kube-system/dns/p/UDP }
add counters ns/web/p/TCP
add element frontends { 198.19.0.10 . tcp . 80 : ns/web/p/TCP }
add element frontends { 198.18.0.50 . tcp . 80 : ns/web/p/TCP }
add element nodeports { tcp . 30080 : ns/web/p/TCP }
`},
		{"same ports", dptest.Snapshot(web, dns), ""},
		{"web loses its external IP, clash claims it", dptest.Snapshot(
			dptest.Svc("ns", "web", "198.19.0.10", 80, dptest.WithNodePort(30080)),
			dptest.Svc("ns", "clash", "198.19.0.12", 80, dptest.WithExternalIPs("198.18.0.50")),
			dns), `delete element frontends { 198.18.0.50 . tcp . 80 }
add counters ns/clash/p/TCP
add element frontends { 198.19.0.12 . tcp . 80 : ns/clash/p/TCP }
add element frontends { 198.18.0.50 . tcp . 80 : ns/clash/p/TCP }
`},
		{"web claims it again: clash keeps it", dptest.Snapshot(web,
			dptest.Svc("ns", "clash", "198.19.0.12", 80, dptest.WithExternalIPs("198.18.0.50")),
			dns), ""},
		{"dns goes", dptest.Snapshot(web), `delete element frontends { 198.19.0.53 . udp . 53 }
delete counters kube-system/dns/p/UDP
delete element frontends { 198.19.0.12 . tcp . 80 }
delete element frontends { 198.18.0.50 . tcp . 80 }
delete counters ns/clash/p/TCP
`},
	}
	for _, st := range steps {
		if got := planText(&s, st.snap); got != st.want {
			t.Errorf("%s:\ngot:\n%swant:\n%s", st.name, got, st.want)
		}
	}
}

func TestCounterNameRoundTrip(t *testing.T) {
	for _, id := range []model.PortID{
		{Namespace: "ns", Name: "web", Port: "http", Protocol: model.TCP},
		{Namespace: "ns", Name: "web", Port: "", Protocol: model.UDP},
	} {
		for _, name := range []string{CounterName(id), CounterName(id) + newSuffix} {
			got, isNew, ok := ParseCounterName(name)
			if !ok || got != id || isNew != strings.HasSuffix(name, newSuffix) {
				t.Errorf("%q: %+v new=%v ok=%v", name, got, isNew, ok)
			}
		}
	}
	for _, bad := range []string{"", "a/b", "a/b/c/d/e", "/b/c/TCP"} {
		if _, _, ok := ParseCounterName(bad); ok {
			t.Errorf("%q parsed", bad)
		}
	}
}
