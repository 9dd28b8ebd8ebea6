package objects

import (
	"net/netip"
	"reflect"
	"testing"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func ptr[T any](v T) *T { return &v }

func TestFromService(t *testing.T) {
	local := corev1.ServiceInternalTrafficPolicyLocal
	proxy := corev1.LoadBalancerIPModeProxy
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", ResourceVersion: "7", Labels: map[string]string{"app": "x"}},
		Spec: corev1.ServiceSpec{
			Type:                     corev1.ServiceTypeLoadBalancer,
			ClusterIP:                "198.18.0.10",
			ClusterIPs:               []string{"198.18.0.10", "fd00::10"},
			Ports:                    []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, NodePort: 30080}},
			ExternalIPs:              []string{"198.18.1.1"},
			LoadBalancerSourceRanges: []string{"198.18.0.0/16"},
			SessionAffinity:          corev1.ServiceAffinityClientIP,
			SessionAffinityConfig:    &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr(int32(60))}},
			ExternalTrafficPolicy:    corev1.ServiceExternalTrafficPolicyLocal,
			InternalTrafficPolicy:    &local,
			HealthCheckNodePort:      31000,
			TrafficDistribution:      ptr("PreferClose"),
		},
		Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{
			{IP: "198.18.2.2", IPMode: &proxy}, {Hostname: "lb.example"}, {IP: "198.18.2.3"},
		}}},
	}
	want := &Service{
		Namespace: "ns", Name: "web", ResourceVersion: "7", Type: "LoadBalancer",
		ClusterIPs:               []string{"198.18.0.10", "fd00::10"},
		Ports:                    []ServicePort{{Name: "http", Protocol: "TCP", Port: 80, NodePort: 30080}},
		ExternalIPs:              []string{"198.18.1.1"},
		LoadBalancerIngress:      []LoadBalancerIngress{{IP: "198.18.2.2", IPMode: "Proxy"}, {IP: "198.18.2.3"}},
		LoadBalancerSourceRanges: []string{"198.18.0.0/16"},
		SessionAffinity:          "ClientIP", SessionAffinityTimeout: 60,
		ExternalTrafficPolicy: "Local", InternalTrafficPolicy: "Local", HealthCheckNodePort: 31000,
		TrafficDistribution: "PreferClose",
	}
	got := FromService(svc)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("FromService:\n got %+v\nwant %+v", got, want)
	}
	svc.Spec.ClusterIPs[0] = "changed"
	if got.ClusterIPs[0] != "198.18.0.10" {
		t.Errorf("FromService shares memory with its input")
	}
}

func TestFromServiceClusterIPFallback(t *testing.T) {
	got := FromService(&corev1.Service{Spec: corev1.ServiceSpec{ClusterIP: "198.18.0.1"}})
	if !reflect.DeepEqual(got.ClusterIPs, []string{"198.18.0.1"}) {
		t.Errorf("ClusterIPs = %v", got.ClusterIPs)
	}
	empty := FromService(&corev1.Service{Spec: corev1.ServiceSpec{ExternalIPs: []string{}}})
	if empty.ClusterIPs != nil || empty.ExternalIPs != nil || empty.Ports != nil {
		t.Errorf("empty lists should be nil: %+v", empty)
	}
}

func TestFromEndpointSlice(t *testing.T) {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "ns", Name: "web-abc", ResourceVersion: "3",
			Labels:      map[string]string{LabelServiceName: "web"},
			Annotations: map[string]string{AnnotationTriggerTime: "2025-01-02T03:04:05Z"},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Protocol: ptr(corev1.ProtocolUDP), Port: ptr(int32(8080))}, {}},
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{"198.18.3.1"},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(true), Serving: ptr(true), Terminating: ptr(false)},
			NodeName:   ptr("node-a"), Zone: ptr("z1"),
			Hints: &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "z1"}}, ForNodes: []discoveryv1.ForNode{{Name: "node-a"}}},
		}, {Addresses: []string{"198.18.3.2"}}},
	}
	want := &EndpointSlice{
		Namespace: "ns", Name: "web-abc", ResourceVersion: "3", ServiceName: "web", AddressType: "IPv4",
		Ports: []EndpointPort{{Name: "http", Protocol: "UDP", Port: 8080}, {}},
		Endpoints: []Endpoint{
			{Addr: netip.MustParseAddr("198.18.3.1"), HasAddress: true, Ready: CondTrue, Serving: CondTrue, Terminating: CondFalse,
				Node: OnNode("node-a"), Hints: &Hints{Zones: []string{"z1"}, Nodes: []string{"node-a"}}},
			{Addr: netip.MustParseAddr("198.18.3.2"), HasAddress: true},
		},
		TriggerTime: "2025-01-02T03:04:05Z",
	}
	got := FromEndpointSlice(es)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("FromEndpointSlice:\n got %+v\nwant %+v", got, want)
	}
	*es.Endpoints[0].Conditions.Ready = false
	if got.Endpoints[0].Ready != CondTrue {
		t.Errorf("FromEndpointSlice shares condition pointers with its input")
	}
	for _, tc := range []struct {
		in   *bool
		want Cond
		or   [2]bool // Or(false), Or(true)
	}{{nil, CondUnset, [2]bool{false, true}}, {ptr(true), CondTrue, [2]bool{true, true}}, {ptr(false), CondFalse, [2]bool{false, false}}} {
		if c := CondOf(tc.in); c != tc.want || c.Or(false) != tc.or[0] || c.Or(true) != tc.or[1] {
			t.Errorf("CondOf(%v) = %v (Or %v %v), want %v (%v)", tc.in, c, c.Or(false), c.Or(true), tc.want, tc.or)
		}
	}
	if n := unsafe.Sizeof(Endpoint{}); n > 48 {
		t.Errorf("Endpoint is %d bytes; keep it within 48 (100k of them at 10k Services)", n)
	}
	if got.ServiceKey() != (Key{"ns", "web"}) {
		t.Errorf("ServiceKey = %v", got.ServiceKey())
	}
}

// Addresses are parsed once, as the API server's objects are read: the
// first address only, upstream's sloppy forms accepted, what does not
// parse kept as text for the model's problem report, FQDN slices left
// unparsed (nothing proxies them).
func TestFromEndpointSliceAddresses(t *testing.T) {
	for _, tc := range []struct {
		name     string
		addrType discoveryv1.AddressType
		addrs    []string
		want     netip.Addr
		has      bool
		bad      string
	}{
		{"IPv4", discoveryv1.AddressTypeIPv4, []string{"198.18.3.1", "198.18.3.2"}, netip.MustParseAddr("198.18.3.1"), true, ""},
		{"IPv6", discoveryv1.AddressTypeIPv6, []string{"fd00::1"}, netip.MustParseAddr("fd00::1"), true, ""},
		{"leading zeros read as decimal", discoveryv1.AddressTypeIPv4, []string{"198.018.003.001"}, netip.MustParseAddr("198.18.3.1"), true, ""},
		{"IPv4-mapped IPv6 is IPv4", discoveryv1.AddressTypeIPv4, []string{"::ffff:198.18.3.1"}, netip.MustParseAddr("198.18.3.1"), true, ""},
		{"zone refused", discoveryv1.AddressTypeIPv6, []string{"fe80::1%eth0"}, netip.Addr{}, true, "fe80::1%eth0"},
		{"not an address", discoveryv1.AddressTypeIPv4, []string{"198.18.3.300"}, netip.Addr{}, true, "198.18.3.300"},
		{"no address", discoveryv1.AddressTypeIPv4, nil, netip.Addr{}, false, ""},
		{"FQDN", discoveryv1.AddressTypeFQDN, []string{"example.test"}, netip.Addr{}, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			es := &discoveryv1.EndpointSlice{AddressType: tc.addrType, Endpoints: []discoveryv1.Endpoint{
				{Addresses: []string{"198.18.9.9"}}, {Addresses: tc.addrs}}}
			got := FromEndpointSlice(es)
			e := got.Endpoints[1]
			if e.Addr != tc.want || e.HasAddress != tc.has || got.BadAddresses[1] != tc.bad {
				t.Errorf("got %v (has %v, bad %q), want %v (has %v, bad %q)", e.Addr, e.HasAddress, got.BadAddresses[1], tc.want, tc.has, tc.bad)
			}
			if _, ok := got.BadAddresses[0]; ok || (tc.bad == "") != (got.BadAddresses == nil) {
				t.Errorf("BadAddresses %v, want only endpoint 1's", got.BadAddresses)
			}
		})
	}
}

// OnNode gives one handle per name; no node is the zero handle.
func TestOnNode(t *testing.T) {
	if h := OnNode("node-a"); h != OnNode("node-a") || h.Value() != "node-a" {
		t.Errorf("node-a: %v", h)
	}
	if OnNode("") != (Endpoint{}).Node {
		t.Errorf(`OnNode("") is not the zero handle`)
	}
}

func TestFromNode(t *testing.T) {
	now := metav1.Now()
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "node-a", ResourceVersion: "9", DeletionTimestamp: &now,
			Labels: map[string]string{LabelTopologyZone: "z1", "kubernetes.io/os": "linux"}},
		Spec: corev1.NodeSpec{PodCIDR: "198.18.64.0/24", Taints: []corev1.Taint{{Key: TaintToBeDeletedByCA}}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeHostName, Address: "node-a"},
			{Type: corev1.NodeInternalIP, Address: "198.18.0.2"},
			{Type: corev1.NodeExternalIP, Address: "198.19.0.2"},
		}},
	}
	want := &Node{
		Name: "node-a", ResourceVersion: "9", Labels: map[string]string{LabelTopologyZone: "z1"},
		PodCIDRs: []string{"198.18.64.0/24"}, InternalIPs: []string{"198.18.0.2"}, ExternalIPs: []string{"198.19.0.2"},
		Deleting: true, ToBeDeleted: true,
	}
	if got := FromNode(n); !reflect.DeepEqual(got, want) {
		t.Errorf("FromNode:\n got %+v\nwant %+v", got, want)
	}
	if got := FromNode(&corev1.Node{}); got.Labels != nil || got.Zone() != "" {
		t.Errorf("node without zone: %+v", got)
	}
}

func TestServiceProxied(t *testing.T) {
	tests := []struct {
		name string
		svc  corev1.Service
		want bool
	}{
		{"cluster IP", corev1.Service{Spec: corev1.ServiceSpec{ClusterIP: "198.18.0.1"}}, true},
		{"headless", corev1.Service{Spec: corev1.ServiceSpec{ClusterIP: "None"}}, false},
		{"no cluster IP", corev1.Service{}, false},
		{"external name", corev1.Service{Spec: corev1.ServiceSpec{ClusterIP: "198.18.0.1", Type: corev1.ServiceTypeExternalName}}, false},
		{"proxy name", corev1.Service{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{LabelServiceProxyName: "other"}},
			Spec: corev1.ServiceSpec{ClusterIP: "198.18.0.1"}}, false},
	}
	for _, tc := range tests {
		if got := ServiceProxied(&tc.svc); got != tc.want {
			t.Errorf("%s: ServiceProxied = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestSliceProxied(t *testing.T) {
	named := map[string]string{LabelServiceName: "web"}
	tests := []struct {
		name   string
		labels map[string]string
		at     discoveryv1.AddressType
		want   bool
	}{
		{"ipv4", named, discoveryv1.AddressTypeIPv4, true},
		{"ipv6", named, discoveryv1.AddressTypeIPv6, true},
		{"fqdn", named, discoveryv1.AddressTypeFQDN, false},
		{"no service", nil, discoveryv1.AddressTypeIPv4, false},
		{"headless", map[string]string{LabelServiceName: "web", LabelHeadless: ""}, discoveryv1.AddressTypeIPv4, false},
	}
	for _, tc := range tests {
		es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Labels: tc.labels}, AddressType: tc.at}
		if got := SliceProxied(es); got != tc.want {
			t.Errorf("%s: SliceProxied = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestFromServiceCIDR(t *testing.T) {
	now := metav1.Now()
	c := &networkingv1.ServiceCIDR{
		ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", ResourceVersion: "3", DeletionTimestamp: &now},
		Spec:       networkingv1.ServiceCIDRSpec{CIDRs: []string{"198.18.128.0/17", "fd00:0:0:ffff::/112"}},
	}
	want := &ServiceCIDR{Name: "kubernetes", ResourceVersion: "3", CIDRs: []string{"198.18.128.0/17", "fd00:0:0:ffff::/112"}}
	got := FromServiceCIDR(c)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("FromServiceCIDR = %+v, want %+v", got, want)
	}
	c.Spec.CIDRs[0] = "changed"
	if got.CIDRs[0] != "198.18.128.0/17" {
		t.Errorf("FromServiceCIDR shares spec.cidrs with its input")
	}
	if k := got.Key(); k != (Key{Name: "kubernetes"}) || k.String() != "kubernetes" {
		t.Errorf("Key = %+v", k)
	}
	if empty := FromServiceCIDR(&networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "e"}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{}}}); empty.CIDRs != nil {
		t.Errorf("empty spec.cidrs = %#v, want nil", empty.CIDRs)
	}
}
