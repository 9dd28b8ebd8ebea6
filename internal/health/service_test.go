package health

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/objects"
)

// fakeNet stands in for the node's sockets: every requested address is
// served by a real listener on 127.0.0.1:0, so tests send real HTTP
// requests without touching the health-check ports themselves.
type fakeNet struct {
	mu     sync.Mutex
	opened []string          // "network addr", in order
	real   map[string]string // requested addr -> real addr
	fail   map[string]error  // requested addr -> error
}

func newFakeNet() *fakeNet { return &fakeNet{real: map[string]string{}, fail: map[string]error{}} }

func (n *fakeNet) listen(ctx context.Context, network, addr string) (net.Listener, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.opened = append(n.opened, network+" "+addr)
	if err := n.fail[addr]; err != nil {
		return nil, err
	}
	l, err := defaultListen(ctx, "tcp4", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	n.real[addr] = l.Addr().String()
	return l, nil
}

func (n *fakeNet) addr(requested string) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.real[requested]
}

func (n *fakeNet) openedCount() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.opened)
}

type fixedHealth bool

func (h fixedHealth) Healthy() bool { return bool(h) }

var (
	svcA = objects.Key{Namespace: "ns", Name: "a"}
	svcB = objects.Key{Namespace: "ns", Name: "b"}
)

func newTestServiceServer(t *testing.T, n *fakeNet, proxy HealthChecker) *ServiceHealthServer {
	t.Helper()
	s := NewServiceHealthServer(ServiceConfig{NodeName: "n1", Family: model.IPv4, Proxy: proxy, Listen: n.listen})
	t.Cleanup(s.Close)
	return s
}

type answer struct {
	code   int
	weight string
	body   string
}

func request(t *testing.T, addr string) answer {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/")
	if err != nil {
		t.Fatalf("GET %s: %v", addr, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header.Get("X-Load-Balancing-Endpoint-Weight"), string(b)}
}

func body(key objects.Key, n int, healthy bool) string {
	return fmt.Sprintf("{\n\t\"service\": {\n\t\t\"namespace\": %q,\n\t\t\"name\": %q\n\t},\n\t\"localEndpoints\": %d,\n\t\"serviceProxyHealthy\": %v\n}",
		key.Namespace, key.Name, n, healthy)
}

func TestServiceHealthAnswers(t *testing.T) {
	tests := []struct {
		name      string
		endpoints map[objects.Key]int
		proxy     HealthChecker
		want      answer
	}{
		{"no endpoints", nil, nil, answer{503, "0", body(svcA, 0, true)}},
		{"local endpoints", map[objects.Key]int{svcA: 2}, nil, answer{200, "2", body(svcA, 2, true)}},
		{"other service's endpoints", map[objects.Key]int{svcB: 2}, nil, answer{503, "0", body(svcA, 0, true)}},
		{"proxy unhealthy", map[objects.Key]int{svcA: 3}, fixedHealth(false), answer{503, "3", body(svcA, 3, false)}},
		{"proxy healthy", map[objects.Key]int{svcA: 1}, fixedHealth(true), answer{200, "1", body(svcA, 1, true)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := newFakeNet()
			s := newTestServiceServer(t, n, tc.proxy)
			if err := s.SyncServices(map[objects.Key]uint16{svcA: 30001}); err != nil {
				t.Fatal(err)
			}
			if err := s.SyncEndpoints(tc.endpoints); err != nil {
				t.Fatal(err)
			}
			if got := request(t, n.addr("0.0.0.0:30001")); got != tc.want {
				t.Errorf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestServiceHealthBodyIsUpstreams(t *testing.T) {
	// upstream writes the body from an indented template; this is it, dedented.
	want := `{
	"service": {
		"namespace": "ns",
		"name": "a"
	},
	"localEndpoints": 2,
	"serviceProxyHealthy": true
}`
	if got := string(serviceBody(svcA, 2, true)); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

func TestServiceHealthSyncIsIncremental(t *testing.T) {
	n := newFakeNet()
	s := newTestServiceServer(t, n, nil)
	steps := []struct {
		services   map[objects.Key]uint16
		wantOpened []string // new listens in this step
	}{
		{map[objects.Key]uint16{svcA: 30001}, []string{"tcp4 0.0.0.0:30001"}},
		{map[objects.Key]uint16{svcA: 30001, svcB: 30002}, []string{"tcp4 0.0.0.0:30002"}},
		{map[objects.Key]uint16{svcA: 30001, svcB: 30002}, nil},
		{map[objects.Key]uint16{svcA: 30003, svcB: 30002}, []string{"tcp4 0.0.0.0:30003"}},
		{map[objects.Key]uint16{svcB: 30002}, nil},
		{nil, nil},
	}
	for i, st := range steps {
		before := n.openedCount()
		if err := s.SyncServices(st.services); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		n.mu.Lock()
		opened := slices.Clone(n.opened[before:])
		n.mu.Unlock()
		if !slices.Equal(opened, st.wantOpened) {
			t.Errorf("step %d: opened %v, want %v", i, opened, st.wantOpened)
		}
		if got := s.Ports(); !mapsEqual(got, st.services) {
			t.Errorf("step %d: ports %v, want %v", i, got, st.services)
		}
	}
}

func mapsEqual(a, b map[objects.Key]uint16) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func TestServiceHealthClosesPorts(t *testing.T) {
	n := newFakeNet()
	s := newTestServiceServer(t, n, nil)
	if err := s.SyncServices(map[objects.Key]uint16{svcA: 30001}); err != nil {
		t.Fatal(err)
	}
	addr := n.addr("0.0.0.0:30001")
	request(t, addr)
	if err := s.SyncServices(nil); err != nil {
		t.Fatal(err)
	}
	if resp, err := http.Get("http://" + addr + "/"); err == nil {
		resp.Body.Close()
		t.Fatal("closed port still answers")
	}
}

func TestServiceHealthListenFailure(t *testing.T) {
	n := newFakeNet()
	boom := errors.New("address already in use")
	n.fail["0.0.0.0:30001"] = boom
	var reported []objects.Key
	s := NewServiceHealthServer(ServiceConfig{NodeName: "n1", Family: model.IPv4, Listen: n.listen,
		ListenFailed: func(k objects.Key, _ uint16, _ error) { reported = append(reported, k) }})
	t.Cleanup(s.Close)

	err := s.SyncServices(map[objects.Key]uint16{svcA: 30001, svcB: 30002})
	if !errors.Is(err, boom) {
		t.Fatalf("SyncServices: %v, want %v", err, boom)
	}
	if !slices.Equal(reported, []objects.Key{svcA}) {
		t.Errorf("reported %v", reported)
	}
	if got := s.Ports(); !mapsEqual(got, map[objects.Key]uint16{svcB: 30002}) {
		t.Errorf("ports %v", got)
	}
	delete(n.fail, "0.0.0.0:30001")
	if err := s.SyncServices(map[objects.Key]uint16{svcA: 30001, svcB: 30002}); err != nil {
		t.Fatalf("retry: %v", err)
	}
	if len(s.Ports()) != 2 {
		t.Errorf("ports after retry %v", s.Ports())
	}
}

func TestServiceHealthPartialListenFailureFreesPorts(t *testing.T) {
	n := newFakeNet()
	n.fail["198.18.0.2:30001"] = errors.New("cannot assign")
	s := NewServiceHealthServer(ServiceConfig{Family: model.IPv4, Listen: n.listen,
		NodePortAddresses: []string{"198.18.0.0/24"},
		InterfaceAddrs: func() ([]netip.Addr, error) {
			return []netip.Addr{netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("198.18.0.2")}, nil
		}})
	t.Cleanup(s.Close)
	if err := s.SyncServices(map[objects.Key]uint16{svcA: 30001}); err == nil {
		t.Fatal("no error")
	}
	first := n.addr("198.18.0.1:30001")
	if first == "" {
		t.Fatal("first address was not opened")
	}
	if resp, err := http.Get("http://" + first + "/"); err == nil {
		resp.Body.Close()
		t.Fatal("the address opened before the failure is still open")
	}
}

func TestServiceHealthClosedHandler(t *testing.T) {
	s := NewServiceHealthServer(ServiceConfig{Family: model.IPv4})
	rec := httptest.NewRecorder()
	serviceHandler{key: svcA, s: s}.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	if rec.Code != 200 || rec.Body.Len() != 0 {
		t.Errorf("closed healthcheck answered %d %q", rec.Code, rec.Body)
	}
}

func TestServiceHealthRunClosesOnCancel(t *testing.T) {
	n := newFakeNet()
	s := newTestServiceServer(t, n, nil)
	if err := s.SyncServices(map[objects.Key]uint16{svcA: 30001}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if len(s.Ports()) != 0 {
		t.Errorf("ports after Run: %v", s.Ports())
	}
}

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func TestServiceHealthListenAddresses(t *testing.T) {
	ifAddrs := addrs("127.0.0.1", "198.18.0.1", "198.18.1.1", "::1", "fd00::1", "fd00:1::1", "::ffff:198.18.2.1")
	tests := []struct {
		name    string
		family  model.Family
		cidrs   []string
		ifErr   error
		network string
		want    []netip.Addr
	}{
		{"default v4", model.IPv4, nil, nil, "tcp4", addrs("0.0.0.0")},
		{"default v6", model.IPv6, nil, nil, "tcp6", addrs("::")},
		{"other family only", model.IPv6, []string{"198.18.0.0/24"}, nil, "tcp6", addrs("::")},
		{"zero cidr wins", model.IPv4, []string{"198.18.0.0/24", "0.0.0.0/0"}, nil, "tcp4", addrs("0.0.0.0")},
		{"matching v4", model.IPv4, []string{"198.18.0.0/15", "fd00::/64"}, nil, "tcp4", addrs("198.18.0.1", "198.18.1.1", "198.18.2.1")},
		{"primary resolved", model.IPv4, []string{"198.18.0.1/32", "fd00::1/128"}, nil, "tcp4", addrs("198.18.0.1")},
		{"matching v6", model.IPv6, []string{"198.18.0.0/15", "fd00::/64"}, nil, "tcp6", addrs("fd00::1")},
		{"loopback", model.IPv4, []string{"127.0.0.0/8"}, nil, "tcp4", addrs("127.0.0.1")},
		{"no match", model.IPv4, []string{"198.19.0.0/24"}, nil, "tcp4", nil},
		{"invalid skipped", model.IPv4, []string{"bogus", "198.18.1.0/24"}, nil, "tcp4", addrs("198.18.1.1")},
		{"interfaces unreadable", model.IPv4, []string{"198.18.0.0/24"}, errors.New("netlink"), "tcp4", addrs("0.0.0.0")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := NewServiceHealthServer(ServiceConfig{Family: tc.family, NodePortAddresses: tc.cidrs,
				InterfaceAddrs: func() ([]netip.Addr, error) { return ifAddrs, tc.ifErr }})
			if got := s.listenAddrs(); !slices.Equal(got, tc.want) {
				t.Errorf("addresses %v, want %v", got, tc.want)
			}
			if s.network() != tc.network {
				t.Errorf("network %s, want %s", s.network(), tc.network)
			}
		})
	}
}

func TestServiceHealthNoAddressNoListener(t *testing.T) {
	n := newFakeNet()
	s := NewServiceHealthServer(ServiceConfig{Family: model.IPv4, Listen: n.listen, NodePortAddresses: []string{"198.19.0.0/24"},
		InterfaceAddrs: func() ([]netip.Addr, error) { return addrs("198.18.0.1"), nil }})
	if err := s.SyncServices(map[objects.Key]uint16{svcA: 30001}); err != nil {
		t.Fatal(err)
	}
	if n.openedCount() != 0 || len(s.Ports()) != 1 {
		t.Errorf("opened %v, ports %v", n.opened, s.Ports())
	}
}

// lbLocal is a LoadBalancer Service with externalTrafficPolicy Local and
// the given ports (name/TCP/number).
func lbLocal(name string, hc int32, ports ...string) *objects.Service {
	svc := &objects.Service{Namespace: "ns", Name: name, Type: objects.ServiceTypeLB, ClusterIPs: []string{"198.19.0.10"},
		ExternalTrafficPolicy: "Local", HealthCheckNodePort: hc}
	if hc == 0 {
		svc.Type, svc.ExternalTrafficPolicy = objects.ServiceTypeClusterIP, ""
	}
	for i, p := range ports {
		svc.Ports = append(svc.Ports, objects.ServicePort{Name: p, Protocol: "TCP", Port: int32(80 + i)})
	}
	return svc
}

// slice is an IPv4 EndpointSlice of Service svc with one TCP port and
// endpoints "ip@node", ready unless the address ends in "!".
func slice(svc, name, port string, eps ...string) *objects.EndpointSlice {
	s := &objects.EndpointSlice{Namespace: "ns", Name: name, ServiceName: svc, AddressType: "IPv4",
		Ports: []objects.EndpointPort{{Name: port, Protocol: "TCP", Port: 8080}}}
	for _, e := range eps {
		addr, node, _ := strings.Cut(e, "@")
		ready := !strings.HasSuffix(node, "!")
		node = strings.TrimSuffix(node, "!")
		cond := objects.CondFalse
		if ready {
			cond = objects.CondTrue
		}
		s.Endpoints = append(s.Endpoints, objects.Endpoint{Addr: netip.MustParseAddr(addr), HasAddress: true,
			Node: objects.OnNode(node), Ready: cond, Serving: cond})
	}
	return s
}

func ep(ip string, local, ready bool) *model.Endpoint {
	return &model.Endpoint{IP: netip.MustParseAddr(ip), Port: 80, IsLocal: local, Ready: ready, Serving: ready}
}

func TestServiceInputs(t *testing.T) {
	a, b, c, d := objects.Key{Namespace: "ns", Name: "a"}, objects.Key{Namespace: "ns", Name: "b"},
		objects.Key{Namespace: "ns", Name: "c"}, objects.Key{Namespace: "ns", Name: "d"}
	snap, _ := model.Build(model.Input{
		NodeName: "node1",
		Services: map[objects.Key]*objects.Service{
			a: lbLocal("a", 30001, "http", "https"),
			b: lbLocal("b", 0, "http"),
			c: lbLocal("c", 30003, "http"),
			d: lbLocal("d", 30004, "http"),
		},
		Slices: map[objects.Key][]*objects.EndpointSlice{
			// Counted once per IP over both ports; not ready and other
			// nodes' endpoints are not counted.
			a: {slice("a", "a-1", "http", "198.18.0.1@node1", "198.18.0.2@node1!", "198.18.0.3@node2"),
				slice("a", "a-2", "https", "198.18.0.1@node1", "198.18.0.4@node1")},
			// No health-check port: nobody asks for its count.
			b: {slice("b", "b-1", "http", "198.18.0.5@node1")},
			c: {slice("c", "c-1", "http", "198.18.0.6@node2")},
			// A slice port no Service port names counts, as upstream's
			// count over its whole endpoints map does.
			d: {slice("d", "d-1", "metrics", "198.18.0.7@node1", "198.18.0.8@node1")},
		},
	})
	ports, ready := ServiceInputs(snap.V4)
	wantPorts := map[objects.Key]uint16{a: 30001, c: 30003, d: 30004}
	if !mapsEqual(ports, wantPorts) {
		t.Errorf("ports %v, want %v", ports, wantPorts)
	}
	wantReady := map[objects.Key]int{a: 2, d: 2}
	if len(ready) != len(wantReady) || ready[a] != 2 || ready[d] != 2 {
		t.Errorf("ready %v, want %v", ready, wantReady)
	}
	if p, r := ServiceInputs(nil); len(p) != 0 || len(r) != 0 {
		t.Errorf("nil snapshot: %v %v", p, r)
	}
}

func TestServiceHealthSyncSnapshot(t *testing.T) {
	n := newFakeNet()
	s := newTestServiceServer(t, n, nil)
	fs := model.NewFamilySnapshot(model.IPv4, []*model.ServicePort{
		{ID: model.PortID{Namespace: "ns", Name: "a"}, HealthCheckNodePort: 30001,
			Endpoints: []*model.Endpoint{ep("198.18.0.1", true, true)}, LocalReadyEndpoints: 1},
	})
	if err := s.SyncSnapshot(fs); err != nil {
		t.Fatal(err)
	}
	if got := request(t, n.addr("0.0.0.0:30001")); got.code != 200 || got.weight != "1" {
		t.Errorf("got %+v", got)
	}
}

// TestServiceHealthSyncSnapshotUnchanged: a snapshot sharing the last
// one's health-checked ports changes nothing, but a port that failed to
// open is retried with the same snapshot, and a rebuilt port (new
// endpoints) is taken.
func TestServiceHealthSyncSnapshotUnchanged(t *testing.T) {
	n := newFakeNet()
	n.fail["0.0.0.0:30002"] = errors.New("address in use")
	s := newTestServiceServer(t, n, nil)
	a := &model.ServicePort{ID: model.PortID{Namespace: "ns", Name: "a"}, HealthCheckNodePort: 30001,
		Endpoints: []*model.Endpoint{ep("198.18.0.1", true, true)}, LocalReadyEndpoints: 1}
	b := &model.ServicePort{ID: model.PortID{Namespace: "ns", Name: "b"}, HealthCheckNodePort: 30002}
	fs := model.NewFamilySnapshot(model.IPv4, []*model.ServicePort{a, b})
	if err := s.SyncSnapshot(fs); err == nil {
		t.Fatal("want the failed port's error")
	}
	delete(n.fail, "0.0.0.0:30002")
	opened := n.openedCount()
	if err := s.SyncSnapshot(fs); err != nil {
		t.Fatal(err)
	}
	if n.openedCount() == opened || n.addr("0.0.0.0:30002") == "" {
		t.Errorf("the failed port was not retried with the same snapshot")
	}
	opened = n.openedCount()
	if err := s.SyncSnapshot(model.NewFamilySnapshot(model.IPv4, []*model.ServicePort{a, b})); err != nil {
		t.Fatal(err)
	}
	if n.openedCount() != opened {
		t.Errorf("an unchanged snapshot opened ports")
	}
	a2 := *a
	a2.Endpoints = append(slices.Clone(a.Endpoints), ep("198.18.0.2", true, true))
	a2.LocalReadyEndpoints = 2
	if err := s.SyncSnapshot(model.NewFamilySnapshot(model.IPv4, []*model.ServicePort{&a2, b})); err != nil {
		t.Fatal(err)
	}
	if got := request(t, n.addr("0.0.0.0:30001")); got.code != 200 || got.weight != "2" {
		t.Errorf("after the endpoint change: got %+v, want 200 with 2 endpoints", got)
	}
}
