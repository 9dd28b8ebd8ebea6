//go:build tools

// Package deps pins the libraries kproxy's packages are built on, so that
// go mod tidy keeps them while packages are being written.
package deps

import (
	_ "github.com/google/nftables"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/prometheus/client_golang/prometheus/promhttp"
	_ "github.com/spf13/cobra"
	_ "github.com/spf13/pflag"
	_ "github.com/vishvananda/netlink"
	_ "k8s.io/api/core/v1"
	_ "k8s.io/api/discovery/v1"
	_ "k8s.io/apimachinery/pkg/apis/meta/v1"
	_ "k8s.io/client-go/informers"
	_ "k8s.io/client-go/kubernetes"
	_ "k8s.io/client-go/kubernetes/fake"
	_ "k8s.io/client-go/tools/clientcmd"
	_ "k8s.io/client-go/tools/record"
	_ "k8s.io/component-base/featuregate"
	_ "k8s.io/component-base/logs"
	_ "k8s.io/component-base/metrics"
	_ "k8s.io/klog/v2"
	_ "k8s.io/kube-proxy/config/v1alpha1"
	_ "k8s.io/utils/clock"
	_ "k8s.io/utils/clock/testing"
	_ "sigs.k8s.io/knftables"
	_ "sigs.k8s.io/yaml"
)
