// Package api is kproxy's Kubernetes API source: client-go shared informers,
// over a client of only the API groups it reads, for Services,
// EndpointSlices, this node's Node and the ServiceCIDRs, selecting as
// upstream kube-proxy does, converting every object to its slim form before
// it is cached, and reporting events to a source.Handler.
package api

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/objects"
	"github.com/kproxy/kproxy/internal/source"
)

// Source watches the API server. Create it with New; Run starts it.
type Source struct {
	api      Lister
	nodeName string
	resync   time.Duration
	h        source.Handler
	logger   klog.Logger
}

// New returns a Source that reports to h the Services and EndpointSlices kproxy
// proxies, the Node called nodeName and every ServiceCIDR. resync is the informers' resync period
// (configSyncPeriod; 0 disables resyncs). New starts nothing.
func New(api Lister, nodeName string, resync time.Duration, h source.Handler, logger klog.Logger) *Source {
	return &Source{api: api, nodeName: nodeName, resync: resync, h: h, logger: logger}
}

// watch is one informer and the kind it lists.
type watch struct {
	kind     source.Kind
	informer cache.SharedIndexInformer
	handler  cache.ResourceEventHandler
}

// Run lists and watches until ctx is done, calling the Handler from the
// informers' goroutines, and OnSynced once per kind after its initial list.
// It returns nil when ctx is done, or an error when the informers cannot be
// set up.
func (s *Source) Run(ctx context.Context) error {
	watches, err := s.informers()
	if err != nil {
		return err
	}
	regs := make([]cache.ResourceEventHandlerRegistration, len(watches))
	for i, w := range watches {
		if regs[i], err = w.informer.AddEventHandlerWithResyncPeriod(w.handler, s.resync); err != nil {
			return fmt.Errorf("watching %s: %w", w.kind, err)
		}
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, w := range watches {
		wg.Go(func() { w.informer.RunWithContext(ctx) })
	}
	s.logger.Info("Watching the API server", "node", s.nodeName, "resync", s.resync)
	for i, w := range watches {
		go s.reportSynced(ctx, w.kind, regs[i])
	}
	<-ctx.Done()
	return nil
}

// reportSynced tells the handler once reg's initial list has been delivered.
// It waits on the registration's done channel, not by polling: the first
// sync waits for this, and cache.WaitForCacheSync's 100 ms poll added up to
// 100 ms to every cold start.
func (s *Source) reportSynced(ctx context.Context, kind source.Kind, reg cache.ResourceEventHandlerRegistration) {
	select {
	case <-ctx.Done():
		return
	case <-reg.HasSyncedChecker().Done():
	}
	s.logger.V(2).Info("Initial list complete", "kind", kind)
	s.h.OnSynced(kind)
}

// informers makes one informer per kind, selecting as upstream: Services
// without a service-proxy-name label and with a cluster IP, EndpointSlices
// without the headless label, the Node called nodeName, and all
// ServiceCIDRs. Each slims its objects before caching them (slim.go).
func (s *Source) informers() ([]watch, error) {
	noProxyName, err := labels.NewRequirement(objects.LabelServiceProxyName, selection.DoesNotExist, nil)
	if err != nil {
		return nil, err
	}
	noHeadless, err := labels.NewRequirement(objects.LabelHeadless, selection.DoesNotExist, nil)
	if err != nil {
		return nil, err
	}
	svcTweak := func(o *metav1.ListOptions) {
		o.LabelSelector = labels.NewSelector().Add(*noProxyName).String()
		o.FieldSelector = fields.OneTermNotEqualSelector("spec.clusterIP", objects.ClusterIPNone).String()
	}
	sliceTweak := func(o *metav1.ListOptions) {
		o.LabelSelector = labels.NewSelector().Add(*noHeadless).String()
	}
	nodeTweak := func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", s.nodeName).String()
	}
	// All ServiceCIDRs. If the server lacks the resource or RBAC forbids
	// it, this informer keeps retrying (logging each failure) and never
	// syncs; nothing waits for it.
	allCIDRs := func(*metav1.ListOptions) {}
	kinds := []struct {
		kind      source.Kind
		example   runtime.Object
		tweak     func(*metav1.ListOptions)
		handler   cache.ResourceEventHandler
		transform cache.TransformFunc
	}{
		{source.Services, &corev1.Service{}, svcTweak, s.serviceHandler(), slimService},
		{source.EndpointSlices, &discoveryv1.EndpointSlice{}, sliceTweak, s.sliceHandler(), slimSlice},
		{source.Nodes, &corev1.Node{}, nodeTweak, s.nodeHandler(), s.slimNode},
		{source.ServiceCIDRs, &networkingv1.ServiceCIDR{}, allCIDRs, s.serviceCIDRHandler(), slimServiceCIDR},
	}
	watches := make([]watch, len(kinds))
	for i, k := range kinds {
		inf := cache.NewSharedIndexInformerWithOptions(s.api.ListWatch(k.kind, k.tweak), k.example,
			cache.SharedIndexInformerOptions{ResyncPeriod: s.resync})
		if err := inf.SetTransform(k.transform); err != nil {
			return nil, fmt.Errorf("watching %s: %w", k.kind, err)
		}
		watches[i] = watch{k.kind, inf, k.handler}
	}
	return watches, nil
}
