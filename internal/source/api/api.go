// Package api is kproxy's Kubernetes API source: client-go shared informers
// for Services, EndpointSlices, this node's Node and the ServiceCIDRs,
// selecting as upstream
// kube-proxy does, converting every object to its slim form before it is
// cached, and reporting events to a source.Handler.
package api

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/objects"
	"github.com/kproxy/kproxy/internal/source"
)

// Source watches the API server. Create it with New; Run starts it.
type Source struct {
	client   kubernetes.Interface
	nodeName string
	resync   time.Duration
	h        source.Handler
	logger   klog.Logger
}

// New returns a Source that reports to h the Services and EndpointSlices kproxy
// proxies, the Node called nodeName and every ServiceCIDR. resync is the informers' resync period
// (configSyncPeriod; 0 disables resyncs). New starts nothing.
func New(client kubernetes.Interface, nodeName string, resync time.Duration, h source.Handler, logger klog.Logger) *Source {
	return &Source{client: client, nodeName: nodeName, resync: resync, h: h, logger: logger}
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
	factories, watches, err := s.informers()
	if err != nil {
		return err
	}
	regs := make([]cache.ResourceEventHandlerRegistration, len(watches))
	for i, w := range watches {
		if regs[i], err = w.informer.AddEventHandlerWithResyncPeriod(w.handler, s.resync); err != nil {
			return fmt.Errorf("watching %s: %w", w.kind, err)
		}
	}
	for _, f := range factories {
		f.Start(ctx.Done())
	}
	defer func() {
		for _, f := range factories {
			f.Shutdown()
		}
	}()
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

// informers makes one factory per selection, as upstream: Services without a
// service-proxy-name label and with a cluster IP, EndpointSlices without the
// headless label, the Node called nodeName, and all ServiceCIDRs.
func (s *Source) informers() ([]informers.SharedInformerFactory, []watch, error) {
	noProxyName, err := labels.NewRequirement(objects.LabelServiceProxyName, selection.DoesNotExist, nil)
	if err != nil {
		return nil, nil, err
	}
	noHeadless, err := labels.NewRequirement(objects.LabelHeadless, selection.DoesNotExist, nil)
	if err != nil {
		return nil, nil, err
	}
	svcTweak := func(o *metav1.ListOptions) {
		o.LabelSelector = labels.NewSelector().Add(*noProxyName).String()
		o.FieldSelector = fields.OneTermNotEqualSelector("spec.clusterIP", objects.ClusterIPNone).String()
	}
	sliceTweak := func(o *metav1.ListOptions) {
		o.LabelSelector = labels.NewSelector().Add(*noHeadless).String()
	}
	svcF := informers.NewSharedInformerFactoryWithOptions(s.client, s.resync, informers.WithTweakListOptions(svcTweak))
	sliceF := informers.NewSharedInformerFactoryWithOptions(s.client, s.resync, informers.WithTweakListOptions(sliceTweak))
	svcInformer, sliceInformer := bigInformers(s.client, svcF, sliceF, svcTweak, sliceTweak)
	nodeF := informers.NewSharedInformerFactoryWithOptions(s.client, s.resync,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", s.nodeName).String()
		}))
	// All ServiceCIDRs. If the server lacks the resource or RBAC forbids
	// it, this informer keeps retrying (logging each failure) and never
	// syncs; nothing waits for it.
	cidrF := informers.NewSharedInformerFactoryWithOptions(s.client, s.resync)
	watches := []watch{
		{source.Services, svcInformer, s.serviceHandler()},
		{source.EndpointSlices, sliceInformer, s.sliceHandler()},
		{source.Nodes, nodeF.Core().V1().Nodes().Informer(), s.nodeHandler()},
		{source.ServiceCIDRs, cidrF.Networking().V1().ServiceCIDRs().Informer(), s.serviceCIDRHandler()},
	}
	transforms := []cache.TransformFunc{slimService, slimSlice, s.slimNode, slimServiceCIDR}
	for i, w := range watches {
		if err := w.informer.SetTransform(transforms[i]); err != nil {
			return nil, nil, fmt.Errorf("watching %s: %w", w.kind, err)
		}
	}
	return []informers.SharedInformerFactory{svcF, sliceF, nodeF, cidrF}, watches, nil
}

// bigInformers returns the Services and EndpointSlices informers of the
// factories: for a real API server with streamed lists (stream.go), for a
// fake clientset (which has no HTTP body to stream) the factories' own.
func bigInformers(client kubernetes.Interface, svcF, sliceF informers.SharedInformerFactory, svcTweak, sliceTweak func(*metav1.ListOptions)) (svc, slices cache.SharedIndexInformer) {
	if _, ok := client.(*kubernetes.Clientset); !ok {
		return svcF.Core().V1().Services().Informer(), sliceF.Discovery().V1().EndpointSlices().Informer()
	}
	svc = svcF.InformerFor(&corev1.Service{}, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		return streamedServices(c).informer(&corev1.Service{}, svcTweak, c.CoreV1().Services("").Watch, resync)
	})
	slices = sliceF.InformerFor(&discoveryv1.EndpointSlice{}, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		return streamedSlices(c).informer(&discoveryv1.EndpointSlice{}, sliceTweak, c.DiscoveryV1().EndpointSlices("").Watch, resync)
	})
	return svc, slices
}
