package api

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	"runtime/debug"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	apiwatch "k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/klog/v2"

	componentbaseconfig "k8s.io/component-base/config/v1alpha1"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/source"
)

// Lister is what a Source needs of the API server: the list and watch of
// each kind it follows, with tweak setting the selectors of both. *Client is
// the real one.
type Lister interface {
	ListWatch(kind source.Kind, tweak func(*metav1.ListOptions)) cache.ListerWatcher
}

// Client reads the API server through client-go's REST machinery with a
// scheme of only the three API groups kproxy reads. client-go's Clientset
// would register every group of the Kubernetes API when the process starts:
// ~8 MiB more memory and ~30 ms more start-up, for clients kproxy never calls.
type Client struct {
	core, discovery, networking rest.Interface
}

// The scheme, codecs and parameter codec of the objects kproxy reads.
var (
	apiScheme  = newScheme()
	apiCodecs  = serializer.NewCodecFactory(apiScheme)
	paramCodec = runtime.NewParameterCodec(apiScheme)
)

func newScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, discoveryv1.AddToScheme, networkingv1.AddToScheme} {
		if err := add(s); err != nil {
			panic(fmt.Sprintf("building the API scheme: %v", err))
		}
	}
	// The unversioned meta types (Status, WatchEvent), as client-go's scheme.
	metav1.AddToGroupVersion(s, schema.GroupVersion{Version: "v1"})
	return s
}

// NewClient builds a client as upstream kube-proxy builds its clientset:
// from the kubeconfig file in cc and/or the master URL (which overrides the
// kubeconfig's server), or from the in-cluster config when both are empty;
// then cc's QPS, burst and content types apply. The three API groups share
// one HTTP client and one rate limiter. It does not contact the server.
func NewClient(cc componentbaseconfig.ClientConnectionConfiguration, master string, logger klog.Logger) (*Client, error) {
	cfg, err := restConfig(cc.Kubeconfig, master, logger)
	if err != nil {
		return nil, fmt.Errorf("building the API client config: %w", err)
	}
	cfg.AcceptContentTypes = cc.AcceptContentTypes
	cfg.ContentType = cc.ContentType
	cfg.QPS = cc.QPS
	cfg.Burst = int(cc.Burst)
	c, err := clientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("building the API client: %w", err)
	}
	return c, nil
}

// userAgent is client-go's default form, "command/version (os/arch)
// kubernetes/commit", with the kube-proxy release kproxy stands in for as
// the version (upstream's binary sends its own release) and kproxy's
// commit, so that the API server's audit log and per-client metrics see a
// kube-proxy of the right release.
func userAgent() string {
	commit := "unknown"
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 7 {
				commit = s.Value[:7]
			}
		}
	}
	cmd := "kproxy"
	if len(os.Args) > 0 && os.Args[0] != "" {
		cmd = filepath.Base(os.Args[0])
	}
	return fmt.Sprintf("%s/%s (%s/%s) kubernetes/%s", cmd, config.UpstreamVersion, goruntime.GOOS, goruntime.GOARCH, commit)
}

// clientFor makes the REST clients of core/v1, discovery/v1 and
// networking/v1 from cfg.
func clientFor(cfg *rest.Config) (*Client, error) {
	base := rest.CopyConfig(cfg)
	if base.UserAgent == "" {
		base.UserAgent = userAgent()
	}
	if base.RateLimiter == nil && base.QPS > 0 {
		if base.Burst <= 0 {
			return nil, fmt.Errorf("burst must be positive when QPS is set (QPS %v, burst %d)", base.QPS, base.Burst)
		}
		base.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(base.QPS, base.Burst)
	}
	hc, err := rest.HTTPClientFor(base)
	if err != nil {
		return nil, err
	}
	group := func(gv schema.GroupVersion, apiPath string) (rest.Interface, error) {
		c := rest.CopyConfig(base)
		c.GroupVersion = &gv
		c.APIPath = apiPath
		c.NegotiatedSerializer = rest.CodecFactoryForGeneratedClient(apiScheme, apiCodecs).WithoutConversion()
		return rest.RESTClientForConfigAndClient(c, hc)
	}
	var out Client
	for _, g := range []struct {
		into    *rest.Interface
		gv      schema.GroupVersion
		apiPath string
	}{
		{&out.core, corev1.SchemeGroupVersion, "/api"},
		{&out.discovery, discoveryv1.SchemeGroupVersion, "/apis"},
		{&out.networking, networkingv1.SchemeGroupVersion, "/apis"},
	} {
		if *g.into, err = group(g.gv, g.apiPath); err != nil {
			return nil, err
		}
	}
	return &out, nil
}

func restConfig(kubeconfig, master string, logger klog.Logger) (*rest.Config, error) {
	if kubeconfig == "" && master == "" {
		logger.Info("Neither kubeconfig file nor master URL was specified, using the in-cluster config")
		return rest.InClusterConfig()
	}
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		&clientcmd.ClientConfigLoadingRules{ExplicitPath: kubeconfig},
		&clientcmd.ConfigOverrides{ClusterInfo: clientcmdapi.Cluster{Server: master}},
	).ClientConfig()
}

// ListWatch returns the lister-watcher of kind (listwatch.go).
func (c *Client) ListWatch(kind source.Kind, tweak func(*metav1.ListOptions)) cache.ListerWatcher {
	var l listWatch
	switch kind {
	case source.Services:
		l = listWatch{rc: c.core, resource: "services", items: decodeService}
	case source.EndpointSlices:
		l = listWatch{rc: c.discovery, resource: "endpointslices", items: decodeSlice}
	case source.Nodes:
		l = listWatch{rc: c.core, resource: "nodes"}
	case source.ServiceCIDRs:
		l = listWatch{rc: c.networking, resource: "servicecidrs"}
	default:
		panic(fmt.Sprintf("api: no list for kind %v", kind))
	}
	return tweaked(l.list, l.watch, tweak)
}

// tweaked is the ListWatch of list and watch with tweak applied to the
// options of both.
func tweaked(list cache.ListWithContextFunc, watch cache.WatchFuncWithContext, tweak func(*metav1.ListOptions)) *cache.ListWatch {
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			tweak(&o)
			return list(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (apiwatch.Interface, error) {
			tweak(&o)
			return watch(ctx, o)
		},
	}
}
