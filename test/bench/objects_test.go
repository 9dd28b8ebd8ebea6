//go:build e2e

package bench

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/kproxy/kproxy/internal/objects"
	"github.com/kproxy/kproxy/test/testbed/controlplane"
)

// The benchmark's API objects, all in namespace benchNS, all IPv4:
//
//	svc-00000 …   the N bulk Services, ClusterIP clusterIP(i), each with one
//	              EndpointSlice of M fake endpoints in the pod CIDRs (nothing
//	              answers there), except the sample Services, whose endpoints
//	              are the real echo pods
//	probe         198.18.129.1: the change-latency Service (one real pod, on
//	              and off)
//	dp            198.18.129.2: the data-plane Service (the real pods)
const (
	benchNS      = "bench"
	servicePort  = 80
	podPort      = 8080 // the echo pods' port
	writeClients = 32   // concurrent API writers
	maxServices  = narrowServices + 65000
	// narrowServices is how many bulk Services take their ClusterIP from
	// the API server's own range; the rest take theirs from
	// controlplane.WideServiceCIDR4 (a ServiceCIDR object, ensureWideRange).
	narrowServices = 32000
	sampleCount    = 16
	triggerTime    = "endpoints.kubernetes.io/last-change-trigger-time"
)

var (
	clusterIPBase = netip.MustParseAddr("198.18.130.0") // .. 198.18.255.254: 32,255 addresses
	probeIP       = netip.MustParseAddr("198.18.129.1")
	dpIP          = netip.MustParseAddr("198.18.129.2")
	lbBase        = controlplane.LoadBalancerCIDR4.Addr().Next() // 198.18.64.1
)

// Fake endpoints take the host numbers fakeFirst..fakeLast of each node's
// pod CIDR; real pods (netbed gives them .10 upwards) stay below.
const (
	fakeFirst         = 32
	fakeLast          = 253
	fakeEndpointSpace = 2 * (fakeLast - fakeFirst + 1)
)

// clusterIP is bulk Service i's ClusterIP.
func clusterIP(i int) netip.Addr {
	if i < narrowServices {
		return addrAdd(clusterIPBase, i)
	}
	return addrAdd(controlplane.WideServiceCIDR4.Addr(), i-narrowServices+1)
}

// addrAdd returns a + n (IPv4).
func addrAdd(a netip.Addr, n int) netip.Addr {
	b := a.As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += uint32(n)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func serviceName(i int) string { return fmt.Sprintf("svc-%05d", i) }

// sampleIndexes are the bulk Services that get the real pods as endpoints
// and are probed during the cold start: the first, the last and evenly
// spaced ones between.
func sampleIndexes(n int) []int {
	seen := map[int]bool{}
	var out []int
	for k := range sampleCount {
		i := k * (n - 1) / (sampleCount - 1)
		if !seen[i] {
			seen[i] = true
			out = append(out, i)
		}
	}
	return out
}

// objectSet describes every object of one benchmark size.
type objectSet struct {
	n, m     int
	affinity bool // every tenth bulk Service has ClientIP affinity
	// balancing: every twentieth bulk Service is annotated round-robin,
	// every other twentieth source-hash
	balancing bool
	sample    map[int]bool
	realPods  []realPod // the echo pods the sample and dp Services use
}

// realPod is a pod the bed runs, as the API objects name it.
type realPod struct {
	ip         netip.Addr
	node, zone string
}

func newObjectSet(n, m int, affinity bool, pods []realPod) *objectSet {
	s := &objectSet{n: n, m: m, affinity: affinity, sample: map[int]bool{}, realPods: pods}
	for _, i := range sampleIndexes(n) {
		s.sample[i] = true
	}
	return s
}

// maxNodePorts bounds the NodePort Services: with the 250 LoadBalancers
// (two ports each) they fill most of the API server's default range of
// 2,768 node ports (reached past 44,000 Services otherwise).
const maxNodePorts = 2000

// service returns bulk Service i: mostly ClusterIP; every 20th a NodePort
// (the first maxNodePorts of them), every 50th a LoadBalancer (the first
// 250); some with ClientIP affinity, some with Local traffic policies;
// every 10th with a second (UDP) port. Sample Services are plain ClusterIP.
func (s *objectSet) service(i int) *v1.Service {
	svc := controlplane.NewService(benchNS, serviceName(i), []netip.Addr{clusterIP(i)},
		controlplane.ServicePort("tcp", v1.ProtocolTCP, servicePort, podPort))
	if s.sample[i] {
		return svc
	}
	if i%10 == 5 {
		svc.Spec.Ports = append(svc.Spec.Ports, controlplane.ServicePort("dns", v1.ProtocolUDP, 53, 5353))
	}
	switch {
	case i%50 == 25 && i/50 < 250:
		svc.Spec.Type = v1.ServiceTypeLoadBalancer
	case i%20 == 10 && i/20 < maxNodePorts:
		svc.Spec.Type = v1.ServiceTypeNodePort
	}
	if svc.Spec.Type != v1.ServiceTypeClusterIP && (i/10)%4 == 1 {
		svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	}
	if i%10 == 3 && s.affinity {
		svc.Spec.SessionAffinity = v1.ServiceAffinityClientIP
	}
	if s.balancing && i%10 == 1 {
		svc.Annotations = map[string]string{objects.AnnotationLoadBalancing: "round-robin"}
		if i%20 == 11 {
			svc.Annotations[objects.AnnotationLoadBalancing] = "source-hash"
		}
	}
	if i%25 == 7 {
		svc.Spec.InternalTrafficPolicy = ptr.To(v1.ServiceInternalTrafficPolicyLocal)
	}
	return svc
}

// loadBalancerIP is the ingress address of LoadBalancer Service i.
func loadBalancerIP(i int) netip.Addr { return addrAdd(lbBase, i/50) }

// slice returns bulk Service i's EndpointSlice.
func (s *objectSet) slice(svc *v1.Service, i int) *discoveryv1.EndpointSlice {
	var ports []discoveryv1.EndpointPort
	for _, p := range svc.Spec.Ports {
		ports = append(ports, controlplane.EndpointPort(p.Name, p.Protocol, p.TargetPort.IntVal))
	}
	var eps []discoveryv1.Endpoint
	if s.sample[i] {
		for _, p := range s.realPods {
			eps = append(eps, controlplane.ReadyEndpoint(p.ip, p.node, p.zone))
		}
	} else {
		for j := range s.m {
			eps = append(eps, fakeEndpoint((i*s.m+j)%fakeEndpointSpace))
		}
	}
	return controlplane.NewEndpointSlice(benchNS, svc.Name, svc.Name+"-1", discoveryv1.AddressTypeIPv4, ports, eps...)
}

// fakeEndpoint k: host fakeFirst+k/2 of node1's (k even) or node2's pod CIDR.
func fakeEndpoint(k int) discoveryv1.Endpoint {
	node, zone, cidr := "node1", "zone-a", netip.MustParseAddr("198.18.17.0")
	if k%2 == 1 {
		node, zone, cidr = "node2", "zone-b", netip.MustParseAddr("198.18.18.0")
	}
	return controlplane.ReadyEndpoint(addrAdd(cidr, fakeFirst+k/2), node, zone)
}

// writers are the concurrent API clients of the bulk creation: protobuf,
// no client-side rate limit.
func writers(cp *controlplane.ControlPlane) ([]kubernetes.Interface, error) {
	out := make([]kubernetes.Interface, writeClients)
	for i := range out {
		cfg := *cp.Config
		cfg.ContentType = "application/vnd.kubernetes.protobuf"
		cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
		cfg.QPS, cfg.Burst = -1, 0
		cs, err := kubernetes.NewForConfig(&cfg)
		if err != nil {
			return nil, fmt.Errorf("bench: clientset: %w", err)
		}
		out[i] = cs
	}
	return out, nil
}

// createRange creates bulk Services [from, to) and their slices with the
// writers in parallel, and returns how long it took.
func (s *objectSet) createRange(ctx context.Context, clients []kubernetes.Interface, from, to int) (time.Duration, error) {
	start := time.Now()
	jobs := make(chan int)
	errc := make(chan error, len(clients))
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for _, c := range clients {
		wg.Go(func() {
			for i := range jobs {
				if err := s.create(ctx, c, i); err != nil {
					errc <- err
					cancel()
					return
				}
			}
		})
	}
feed:
	for i := from; i < to; i++ {
		select {
		case jobs <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(jobs)
	wg.Wait()
	select {
	case err := <-errc:
		return 0, err
	default:
	}
	return time.Since(start), ctx.Err()
}

func (s *objectSet) create(ctx context.Context, c kubernetes.Interface, i int) error {
	svc := s.service(i)
	out, err := c.CoreV1().Services(benchNS).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("bench: create service %s: %w", svc.Name, err)
	}
	if svc.Spec.Type == v1.ServiceTypeLoadBalancer {
		out.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: loadBalancerIP(i).String()}}
		if _, err := c.CoreV1().Services(benchNS).UpdateStatus(ctx, out, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("bench: service %s status: %w", svc.Name, err)
		}
	}
	sl := s.slice(svc, i)
	if _, err := c.DiscoveryV1().EndpointSlices(benchNS).Create(ctx, sl, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("bench: create endpointslice %s: %w", sl.Name, err)
	}
	return nil
}

// bareList lists the bench's Services and EndpointSlices once with c
// (protobuf, no client-side rate limit), decoding them as any client does,
// and returns how long it took.
func bareList(ctx context.Context, c kubernetes.Interface) (time.Duration, error) {
	start := time.Now()
	svcs, err := c.CoreV1().Services(benchNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, fmt.Errorf("list services: %w", err)
	}
	slices, err := c.DiscoveryV1().EndpointSlices(benchNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, fmt.Errorf("list endpointslices: %w", err)
	}
	d := time.Since(start)
	if len(svcs.Items) == 0 || len(slices.Items) == 0 {
		return 0, fmt.Errorf("listed %d Services and %d slices", len(svcs.Items), len(slices.Items))
	}
	return d, nil
}

// inputsSynced finds when kproxy logged that its inputs were synced (klog
// gives the time of day only: taken on began's day, in UTC).
func inputsSynced(log string, began time.Time) (time.Time, bool) {
	for _, line := range strings.Split(log, "\n") {
		if !strings.Contains(line, "Inputs synced") {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 2 {
			return time.Time{}, false
		}
		tod, err := time.Parse("15:04:05.000000", f[1])
		if err != nil {
			return time.Time{}, false
		}
		b := began.UTC()
		at := time.Date(b.Year(), b.Month(), b.Day(), tod.Hour(), tod.Minute(), tod.Second(), tod.Nanosecond(), time.UTC)
		if at.Before(b.Add(-time.Hour)) { // past midnight
			at = at.Add(24 * time.Hour)
		}
		return at, true
	}
	return time.Time{}, false
}

// ensureWideRange adds controlplane.WideServiceCIDR4 as a ServiceCIDR
// object and waits until the API server allocates from it, for the bulk
// Services past narrowServices: a dry-run Service with an address of the
// range is accepted. (Without kube-controller-manager nothing sets the
// range's Ready condition; the API server then takes it as ready once its
// informer has it.)
func ensureWideRange(ctx context.Context, cp *controlplane.ControlPlane) error {
	cidrs := cp.Client.NetworkingV1().ServiceCIDRs()
	obj := &networkingv1.ServiceCIDR{
		ObjectMeta: metav1.ObjectMeta{Name: "bench-wide"},
		Spec:       networkingv1.ServiceCIDRSpec{CIDRs: []string{controlplane.WideServiceCIDR4.String()}},
	}
	if _, err := cidrs.Create(ctx, obj, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("bench: create ServiceCIDR %s: %w", obj.Name, err)
	}
	probe := controlplane.NewService(benchNS, "bench-wide-probe", []netip.Addr{lastAddr(controlplane.WideServiceCIDR4).Prev()},
		controlplane.ServicePort("tcp", v1.ProtocolTCP, servicePort, podPort))
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := cp.Client.CoreV1().Services(benchNS).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("bench: the API server does not allocate from ServiceCIDR %s after 30s: %w", obj.Name, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// lastAddr is the last address of p (IPv4).
func lastAddr(p netip.Prefix) netip.Addr { return addrAdd(p.Masked().Addr(), 1<<(32-p.Bits())-1) }

// createFixed creates the probe Service (no endpoints yet) and the dp
// Service (the real pods).
func (s *objectSet) createFixed(ctx context.Context, cp *controlplane.ControlPlane) error {
	ports := []discoveryv1.EndpointPort{controlplane.EndpointPort("tcp", v1.ProtocolTCP, podPort)}
	for _, f := range []struct {
		name string
		ip   netip.Addr
		pods []realPod
	}{{"probe", probeIP, nil}, {"dp", dpIP, s.realPods}} {
		svc := controlplane.NewService(benchNS, f.name, []netip.Addr{f.ip},
			controlplane.ServicePort("tcp", v1.ProtocolTCP, servicePort, podPort))
		if _, err := cp.ApplyService(ctx, svc); err != nil {
			return err
		}
		var eps []discoveryv1.Endpoint
		for _, p := range f.pods {
			eps = append(eps, controlplane.ReadyEndpoint(p.ip, p.node, p.zone))
		}
		sl := controlplane.NewEndpointSlice(benchNS, f.name, f.name+"-1", discoveryv1.AddressTypeIPv4, ports, eps...)
		if _, err := cp.ApplyEndpointSlice(ctx, sl); err != nil {
			return err
		}
	}
	return nil
}

// probeWriter changes the probe Service's only endpoint. It is the only
// writer of that slice, so it keeps the last version it wrote.
type probeWriter struct {
	client kubernetes.Interface
	pod    realPod
	cur    *discoveryv1.EndpointSlice
}

func newProbeWriter(ctx context.Context, c kubernetes.Interface, pod realPod) (*probeWriter, error) {
	cur, err := c.DiscoveryV1().EndpointSlices(benchNS).Get(ctx, "probe-1", metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("bench: probe slice: %w", err)
	}
	return &probeWriter{client: c, pod: pod, cur: cur}, nil
}

// endpointState is what the probe slice says about the probe pod.
type endpointState int

const (
	stateAbsent endpointState = iota
	stateReady
	stateNotReady
)

// set writes the probe slice with the pod in state st, stamping the
// trigger-time annotation the proxies' programming-latency metric reads.
func (w *probeWriter) set(ctx context.Context, st endpointState) error {
	sl := w.cur.DeepCopy()
	sl.Endpoints = nil
	if st != stateAbsent {
		ep := controlplane.ReadyEndpoint(w.pod.ip, w.pod.node, w.pod.zone)
		if st == stateNotReady {
			ep.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(false), Terminating: ptr.To(false)}
		}
		sl.Endpoints = []discoveryv1.Endpoint{ep}
	}
	if sl.Annotations == nil {
		sl.Annotations = map[string]string{}
	}
	sl.Annotations[triggerTime] = time.Now().UTC().Format(time.RFC3339Nano)
	out, err := w.client.DiscoveryV1().EndpointSlices(benchNS).Update(ctx, sl, metav1.UpdateOptions{})
	if err != nil {
		return fmt.Errorf("bench: update probe slice: %w", err)
	}
	w.cur = out
	return nil
}
