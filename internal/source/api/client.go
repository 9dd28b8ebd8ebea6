package api

import (
	"fmt"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/klog/v2"

	componentbaseconfig "k8s.io/component-base/config/v1alpha1"
)

// NewClient builds a clientset as upstream kube-proxy does: from the
// kubeconfig file in cc and/or the master URL (which overrides the
// kubeconfig's server), or from the in-cluster config when both are empty;
// then cc's QPS, burst and content types apply. It does not contact the
// server.
func NewClient(cc componentbaseconfig.ClientConnectionConfiguration, master string, logger klog.Logger) (kubernetes.Interface, error) {
	cfg, err := restConfig(cc.Kubeconfig, master, logger)
	if err != nil {
		return nil, fmt.Errorf("building the API client config: %w", err)
	}
	cfg.AcceptContentTypes = cc.AcceptContentTypes
	cfg.ContentType = cc.ContentType
	cfg.QPS = cc.QPS
	cfg.Burst = int(cc.Burst)
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("building the API client: %w", err)
	}
	return client, nil
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
