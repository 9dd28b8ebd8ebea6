//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/test/testbed/netbed"
	"github.com/kproxy/kproxy/test/testbed/netbed/echo"
)

// testServiceTrafficMetrics (kproxy runs with --service-traffic-metrics):
// N new connections over TCP and UDP, to a ClusterIP from a pod on node1
// and to node1's NodePort from the client, show up on node1's /metrics as
// exactly N more kproxy_service_new_connections_total of that port and
// family in the first scrape after the traffic, with packets and bytes
// grown by at least two packets of 28+ bytes per connection.
func testServiceTrafficMetrics(t *testing.T, b *fbed, f family) {
	kproxyOnly(t, "kproxy's Service traffic metrics")
	if b.mode == "ipvs" {
		// IPVS forwards without the conntrack DNAT the counters key on:
		// the flag is accepted, warned about, and exports nothing.
		got, err := scrapeTraffic(b.node(0))
		if err != nil || len(got) > 0 {
			t.Errorf("ipvs mode: kproxy_service_* series %v (%v), want none", got, err)
		}
		return
	}
	svc := b.applyService(t, svcName("trafficmetrics", f), v1.ServiceTypeNodePort)
	on2 := b.podsOn("node2")
	b.setSlices(t, svc.Name, nil, readyEPs(on2...))
	node := b.node(0)
	vip := clusterIP(t, svc, f.v6)
	client := b.bed.Client()
	from := b.podsOn("node1")[0].Netns
	flows := []struct {
		what string
		from *netbed.Netns
		req  echo.Request
		port string
	}{
		{"tcp ClusterIP", from, req(echo.ProtoTCP, vip, 80), "tcp"},
		{"udp ClusterIP", from, req(echo.ProtoUDP, vip, 80), "udp"},
		{"tcp NodePort", client, req(echo.ProtoTCP, nodeAddr(node, f), nodePort(t, svc, "tcp")), "tcp"},
		{"udp NodePort", client, req(echo.ProtoUDP, nodeAddr(node, f), nodePort(t, svc, "udp")), "udp"},
	}
	for _, fl := range flows {
		waitForPods(t, b.exited, fl.from, fl.req, on2...)
	}
	key := func(port, metric string) string {
		return fmt.Sprintf("%s{namespace=%q,name=%q,port=%q,ip_family=%q}", metric, svc.Namespace, svc.Name, port, familyName(f))
	}
	var before map[string]float64
	eventually(t, b.exited, func() error {
		var err error
		before, err = scrapeTraffic(node)
		if err == nil && before[key("udp", "kproxy_service_new_connections_total")] == 0 {
			err = fmt.Errorf("no counted connection of %s yet", svc.Name)
		}
		return err
	}, "node1 counts %s's connections", svc.Name)
	const n = 20
	for _, fl := range flows {
		for i := range n {
			r := fl.req
			if r.Proto == echo.ProtoUDP {
				// A UDP request from a kernel-chosen port can reuse the
				// 5-tuple of an earlier one whose conntrack entry is still
				// live, and so is not a new connection: pick fresh ports.
				r.Src = netip.AddrPortFrom(netip.Addr{}, freshUDPPort())
			}
			if res := fl.from.Send(context.Background(), r); !res.OK() {
				t.Fatalf("%s: request %d: %s %v", fl.what, i, res.Kind, res.Err)
			}
		}
	}
	after, err := scrapeTraffic(node)
	if err != nil {
		t.Fatal(err)
	}
	for _, port := range []string{"tcp", "udp"} {
		conns := after[key(port, "kproxy_service_new_connections_total")] - before[key(port, "kproxy_service_new_connections_total")]
		pkts := after[key(port, "kproxy_service_packets_total")] - before[key(port, "kproxy_service_packets_total")]
		bytes := after[key(port, "kproxy_service_bytes_total")] - before[key(port, "kproxy_service_bytes_total")]
		t.Logf("%s: +%v new connections, +%v packets, +%v bytes", port, conns, pkts, bytes)
		if conns != 2*n {
			t.Errorf("%s: %v new connections counted, sent %d", port, conns, 2*n)
		}
		if pkts < 2*2*n || bytes < 28*pkts {
			t.Errorf("%s: %v packets, %v bytes for %d connections", port, pkts, bytes, 2*n)
		}
	}
}

// udpPorts hands out source ports below Linux's default ephemeral range
// (32768-60999), each once per test process, so that no two requests share
// a 5-tuple while a conntrack entry of the first may live (UDP: 30-120 s).
var udpPorts atomic.Uint32

func freshUDPPort() uint16 {
	return uint16(20000 + udpPorts.Add(1)%12000)
}

// scrapeTraffic returns node's kproxy_service_* samples by series.
func scrapeTraffic(node *netbed.Node) (map[string]float64, error) {
	fams, err := scrapeNode(node)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for name, mf := range fams {
		if !strings.HasPrefix(name, "kproxy_service_") {
			continue
		}
		for _, m := range mf.GetMetric() {
			out[seriesKey(name, m)] = m.GetCounter().GetValue()
		}
	}
	return out, nil
}

// scrapeNode reads the node's proxy's /metrics.
func scrapeNode(node *netbed.Node) (map[string]*dto.MetricFamily, error) {
	code, body, err := node.HTTPGet(context.Background(), "http://127.0.0.1:10249/metrics")
	if err != nil || code != 200 {
		return nil, fmt.Errorf("GET /metrics: %d %v", code, err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(strings.NewReader(body))
}

func seriesKey(name string, m *dto.Metric) string {
	l := map[string]string{}
	for _, lp := range m.GetLabel() {
		l[lp.GetName()] = lp.GetValue()
	}
	return fmt.Sprintf("%s{namespace=%q,name=%q,port=%q,ip_family=%q}", name, l["namespace"], l["name"], l["port"], l["ip_family"])
}
