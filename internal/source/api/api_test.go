package api

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	componentbaseconfig "k8s.io/component-base/config/v1alpha1"
	"k8s.io/klog/v2/ktesting"

	"github.com/kproxy/kproxy/internal/objects"
	"github.com/kproxy/kproxy/internal/source"
	"github.com/kproxy/kproxy/internal/source/sourcetest"
)

func service(name, clusterIP string, mod ...func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: clusterIP, ClusterIPs: []string{clusterIP},
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}}},
	}
	for _, m := range mod {
		m(s)
	}
	return s
}

func endpointSlice(name, svc string, labels ...string) *discoveryv1.EndpointSlice {
	l := map[string]string{objects.LabelServiceName: svc}
	for _, k := range labels {
		l[k] = ""
	}
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: l},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"198.18.1.1"}}},
	}
}

func node(name, zone string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{objects.LabelTopologyZone: zone}}}
}

func serviceCIDR(name string, cidrs ...string) *networkingv1.ServiceCIDR {
	return &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: cidrs}}
}

// fakeLister lists and watches through a fake clientset's typed clients.
// Like the clientset, it does not do watch-list requests.
type fakeLister struct{ c kubernetes.Interface }

func (f fakeLister) ListWatch(kind source.Kind, tweak func(*metav1.ListOptions)) cache.ListerWatcher {
	type lw struct {
		list  cache.ListWithContextFunc
		watch cache.WatchFuncWithContext
	}
	var k lw
	switch kind {
	case source.Services:
		c := f.c.CoreV1().Services("")
		k = lw{func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return c.List(ctx, o) }, c.Watch}
	case source.EndpointSlices:
		c := f.c.DiscoveryV1().EndpointSlices("")
		k = lw{func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return c.List(ctx, o) }, c.Watch}
	case source.Nodes:
		c := f.c.CoreV1().Nodes()
		k = lw{func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return c.List(ctx, o) }, c.Watch}
	case source.ServiceCIDRs:
		c := f.c.NetworkingV1().ServiceCIDRs()
		k = lw{func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return c.List(ctx, o) }, c.Watch}
	}
	return cache.ToListWatcherWithWatchListSemantics(tweaked(k.list, k.watch, tweak), f.c)
}

// start runs a Source on a fake clientset holding objs until the test ends.
func start(t *testing.T, objs ...runtime.Object) (kubernetes.Interface, *sourcetest.Recorder) {
	t.Helper()
	client := fake.NewClientset(objs...)
	return client, run(t, fakeLister{client})
}

// run runs a Source on api until the test ends.
func run(t *testing.T, api Lister) *sourcetest.Recorder {
	t.Helper()
	rec := sourcetest.NewRecorder()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- New(api, "node-a", time.Hour, rec, ktesting.NewLogger(t, ktesting.NewConfig())).Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v", err)
		}
	})
	return rec
}

func TestInitialList(t *testing.T) {
	_, rec := start(t,
		service("a", "198.18.0.1"),
		service("headless", "None"),
		service("external", "198.18.0.2", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeExternalName }),
		service("other-proxy", "198.18.0.3", func(s *corev1.Service) { s.Labels = map[string]string{objects.LabelServiceProxyName: "x"} }),
		endpointSlice("a-1", "a"),
		endpointSlice("headless-1", "headless", objects.LabelHeadless),
		node("node-a", "z1"), node("node-b", "z2"),
		serviceCIDR("kubernetes", "198.18.128.0/17", "fd00:0:0:ffff::/112"),
	)
	got := rec.WaitFor(t, "synced Services", "synced EndpointSlices", "synced Node", "synced ServiceCIDRs")
	slices.Sort(got)
	want := []string{"node node-a", "service ns/a", "servicecidr kubernetes", "slice ns/a-1",
		"synced EndpointSlices", "synced Node", "synced ServiceCIDRs", "synced Services"}
	if !slices.Equal(got, want) {
		t.Errorf("events = %q, want %q", got, want)
	}
	rec.Do(func(r *sourcetest.Recorder) {
		if r.Node.Zone() != "z1" || r.Services[objects.Key{Namespace: "ns", Name: "a"}].ClusterIPs[0] != "198.18.0.1" {
			t.Errorf("objects: node %+v services %+v", r.Node, r.Services)
		}
	})
}

func TestServiceEvents(t *testing.T) {
	client, rec := start(t)
	rec.WaitFor(t, "synced Services")
	ctx := context.Background()
	svcs := client.CoreV1().Services("ns")
	mustDo(t, func() error {
		_, err := svcs.Create(ctx, service("a", "198.18.0.1"), metav1.CreateOptions{})
		return err
	})
	rec.WaitFor(t, "service ns/a")

	mustDo(t, func() error {
		_, err := svcs.Update(ctx, service("a", "198.18.0.1", func(s *corev1.Service) { s.Spec.Ports[0].Port = 81 }), metav1.UpdateOptions{})
		return err
	})
	rec.WaitFor(t, "service ns/a")
	rec.Do(func(r *sourcetest.Recorder) {
		if p := r.Services[objects.Key{Namespace: "ns", Name: "a"}].Ports[0].Port; p != 81 {
			t.Errorf("port = %d after update", p)
		}
	})

	// Gaining the proxy-name label or becoming ExternalName reads as a deletion.
	mustDo(t, func() error {
		_, err := svcs.Update(ctx, service("a", "198.18.0.1", func(s *corev1.Service) { s.Labels = map[string]string{objects.LabelServiceProxyName: "x"} }), metav1.UpdateOptions{})
		return err
	})
	rec.WaitFor(t, "service-deleted ns/a")
	mustDo(t, func() error {
		_, err := svcs.Create(ctx, service("b", "198.18.0.2"), metav1.CreateOptions{})
		return err
	})
	rec.WaitFor(t, "service ns/b")
	mustDo(t, func() error {
		_, err := svcs.Update(ctx, service("b", "198.18.0.2", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeExternalName }), metav1.UpdateOptions{})
		return err
	})
	rec.WaitFor(t, "service-deleted ns/b")
	mustDo(t, func() error { return svcs.Delete(ctx, "a", metav1.DeleteOptions{}) })
	rec.WaitFor(t, "service-deleted ns/a")
}

func TestSliceEvents(t *testing.T) {
	client, rec := start(t)
	rec.WaitFor(t, "synced EndpointSlices")
	ctx := context.Background()
	eps := client.DiscoveryV1().EndpointSlices("ns")
	mustDo(t, func() error { _, err := eps.Create(ctx, endpointSlice("a-1", "a"), metav1.CreateOptions{}); return err })
	rec.WaitFor(t, "slice ns/a-1")
	mustDo(t, func() error {
		_, err := eps.Update(ctx, endpointSlice("a-1", "a", objects.LabelHeadless), metav1.UpdateOptions{})
		return err
	})
	rec.WaitFor(t, "slice-deleted ns/a-1")
	mustDo(t, func() error { _, err := eps.Create(ctx, endpointSlice("b-1", "b"), metav1.CreateOptions{}); return err })
	rec.WaitFor(t, "slice ns/b-1")
	mustDo(t, func() error { return eps.Delete(ctx, "b-1", metav1.DeleteOptions{}) })
	rec.WaitFor(t, "slice-deleted ns/b-1")
}

func TestNodeEvents(t *testing.T) {
	client, rec := start(t, node("node-a", "z1"))
	rec.WaitFor(t, "synced Node", "node node-a")
	ctx := context.Background()
	nodes := client.CoreV1().Nodes()
	mustDo(t, func() error { _, err := nodes.Create(ctx, node("node-b", "z1"), metav1.CreateOptions{}); return err })
	mustDo(t, func() error { _, err := nodes.Update(ctx, node("node-a", "z2"), metav1.UpdateOptions{}); return err })
	rec.WaitFor(t, "node node-a")
	rec.Do(func(r *sourcetest.Recorder) {
		if r.Node.Zone() != "z2" {
			t.Errorf("zone = %q after update", r.Node.Zone())
		}
	})
	mustDo(t, func() error { return nodes.Delete(ctx, "node-b", metav1.DeleteOptions{}) })
	mustDo(t, func() error { return nodes.Delete(ctx, "node-a", metav1.DeleteOptions{}) })
	got := rec.WaitFor(t, "node-deleted")
	if n := len(slices.DeleteFunc(got, func(s string) bool { return s != "node-deleted" })); n != 1 {
		t.Errorf("node-deleted %d times, want once (node-b is not ours)", n)
	}
}

func TestServiceCIDREvents(t *testing.T) {
	client, rec := start(t, serviceCIDR("kubernetes", "198.18.128.0/17"))
	rec.WaitFor(t, "synced ServiceCIDRs", "servicecidr kubernetes")
	ctx := context.Background()
	cidrs := client.NetworkingV1().ServiceCIDRs()
	mustDo(t, func() error {
		_, err := cidrs.Create(ctx, serviceCIDR("extra", "198.18.200.0/24"), metav1.CreateOptions{})
		return err
	})
	rec.WaitFor(t, "servicecidr extra")
	mustDo(t, func() error {
		_, err := cidrs.Update(ctx, serviceCIDR("extra", "198.18.200.0/24", "fd00:0:0:fffe::/112"), metav1.UpdateOptions{})
		return err
	})
	rec.WaitFor(t, "servicecidr extra")
	rec.Do(func(r *sourcetest.Recorder) {
		if got := r.ServiceCIDRs["extra"].CIDRs; !slices.Equal(got, []string{"198.18.200.0/24", "fd00:0:0:fffe::/112"}) {
			t.Errorf("cidrs after update = %q", got)
		}
	})
	mustDo(t, func() error { return cidrs.Delete(ctx, "extra", metav1.DeleteOptions{}) })
	rec.WaitFor(t, "servicecidr-deleted extra")
}

// As upstream, ServiceCIDRs the source may not list (RBAC, an API server
// without the resource) do not hold back the other kinds.
func TestServiceCIDRsForbidden(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"forbidden", apierrors.NewForbidden(networkingv1.Resource("servicecidrs"), "", errors.New("RBAC says no"))},
		{"not found", apierrors.NewNotFound(networkingv1.Resource("servicecidrs"), "")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset(service("a", "198.18.0.1"), node("node-a", "z1"))
			client.PrependReactor("list", "servicecidrs", func(k8stesting.Action) (bool, runtime.Object, error) {
				return true, nil, tc.err
			})
			rec := run(t, fakeLister{client})
			got := rec.WaitFor(t, "synced Services", "synced EndpointSlices", "synced Node", "service ns/a", "node node-a")
			time.Sleep(100 * time.Millisecond)
			got = append(got, rec.Take()...)
			if slices.Contains(got, "synced ServiceCIDRs") {
				t.Errorf("ServiceCIDRs reported synced although listing them failed: %q", got)
			}
		})
	}
}

func TestTransformsStoreSlimEntries(t *testing.T) {
	obj, _ := slimService(service("a", "198.18.0.1"))
	e, ok := obj.(*entry)
	if !ok {
		t.Fatalf("slimService returned %T", obj)
	}
	if _, ok := e.obj.(*objects.Service); !ok || e.key() != (objects.Key{Namespace: "ns", Name: "a"}) {
		t.Errorf("entry = %+v", e)
	}
	if again, _ := slimService(e); again != e {
		t.Errorf("slimService is not idempotent")
	}
	if k, err := cache.MetaNamespaceKeyFunc(e); err != nil || k != "ns/a" {
		t.Errorf("key = %q, %v", k, err)
	}
	// The key function reads the entry itself: only the key string is allocated.
	if n := testing.AllocsPerRun(100, func() { _, _ = cache.MetaNamespaceKeyFunc(e) }); n > 1 {
		t.Errorf("MetaNamespaceKeyFunc allocates %v times per entry", n)
	}
	obj, _ = slimService(service("h", "None"))
	if obj.(*entry).obj != nil {
		t.Errorf("headless Service cached with its object")
	}
	obj, _ = slimServiceCIDR(serviceCIDR("kubernetes", "198.18.128.0/17"))
	if c, ok := obj.(*entry).obj.(*objects.ServiceCIDR); !ok || c.Name != "kubernetes" || obj.(*entry).key() != (objects.Key{Name: "kubernetes"}) {
		t.Errorf("slimServiceCIDR = %+v", obj)
	}
	if again, _ := slimServiceCIDR(obj); again != obj {
		t.Errorf("slimServiceCIDR is not idempotent")
	}
	obj, _ = slimSlice(endpointSlice("a-1", "a", objects.LabelHeadless))
	if obj.(*entry).obj != nil {
		t.Errorf("headless slice cached with its object")
	}
	s := &Source{nodeName: "node-a"}
	obj, _ = s.slimNode(node("node-b", "z"))
	if obj.(*entry).obj != nil {
		t.Errorf("another node cached with its object")
	}
}

func TestDeletedEntry(t *testing.T) {
	e := &entry{namespace: "ns", name: "a"}
	tests := []struct {
		name string
		obj  any
		want objects.Key
		ok   bool
	}{
		{"entry", e, objects.Key{Namespace: "ns", Name: "a"}, true},
		{"tombstone", cache.DeletedFinalStateUnknown{Key: "ns/a", Obj: e}, objects.Key{Namespace: "ns", Name: "a"}, true},
		{"tombstone of a raw object", cache.DeletedFinalStateUnknown{Key: "ns/b", Obj: service("b", "x")}, objects.Key{Namespace: "ns", Name: "b"}, true},
		{"unknown", "x", objects.Key{}, false},
	}
	for _, tc := range tests {
		got, ok := deletedEntry(tc.obj)
		if ok != tc.ok || (ok && got.key() != tc.want) {
			t.Errorf("%s: deletedEntry = %+v, %v", tc.name, got, ok)
		}
	}
}

func TestNewClient(t *testing.T) {
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	const cfg = `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://198.18.0.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`
	if err := os.WriteFile(kubeconfig, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	logger := ktesting.NewLogger(t, ktesting.NewConfig())
	rc, err := restConfig(kubeconfig, "https://198.18.0.2:6443", logger)
	if err != nil || rc.Host != "https://198.18.0.2:6443" {
		t.Fatalf("restConfig = %+v, %v (want the master override)", rc, err)
	}
	cc := componentbaseconfig.ClientConnectionConfiguration{Kubeconfig: kubeconfig, QPS: 5, Burst: 10, ContentType: "application/vnd.kubernetes.protobuf"}
	if _, err := NewClient(cc, "", logger); err != nil {
		t.Errorf("NewClient: %v", err)
	}
	if _, err := NewClient(componentbaseconfig.ClientConnectionConfiguration{Kubeconfig: filepath.Join(t.TempDir(), "missing")}, "", logger); err == nil {
		t.Errorf("NewClient with a missing kubeconfig succeeded")
	}
}

func mustDo(t *testing.T, f func() error) {
	t.Helper()
	if err := f(); err != nil {
		t.Fatal(err)
	}
}
