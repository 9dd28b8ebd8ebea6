package config

import (
	"fmt"

	"k8s.io/component-base/featuregate"
	"k8s.io/klog/v2"
	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
)

// mutableGate is the part of component-base's feature gate kproxy uses.
type mutableGate interface {
	featuregate.MutableVersionedFeatureGate
	SetFromMapWithLogger(logger klog.Logger, m map[string]bool) error
}

// newFeatureGate returns a feature gate that knows every gate upstream
// kube-proxy v1.36.3 knows, with upstream's defaults, pre-release stages and
// locks (upstreamFeatureGates, generated from upstream). As upstream, an
// unknown gate name, or a locked gate set away from its value, is an error;
// setting a GA or deprecated gate logs a warning.
func newFeatureGate() mutableGate {
	gate := featuregate.NewFeatureGate()
	if err := gate.Add(upstreamFeatureGates); err != nil {
		panic(fmt.Sprintf("registering feature gates: %v", err)) // programming error
	}
	if err := gate.AddDependencies(upstreamFeatureDependencies); err != nil {
		panic(fmt.Sprintf("registering feature gate dependencies: %v", err))
	}
	return gate
}

// FeatureGateFor returns the feature gates in effect for cfg: upstream's
// gates at their defaults, overridden by cfg.FeatureGates.
func FeatureGateFor(cfg *kpv1alpha1.KubeProxyConfiguration) (featuregate.FeatureGate, error) {
	gate := newFeatureGate()
	if err := gate.SetFromMap(cfg.FeatureGates); err != nil {
		return nil, fmt.Errorf("featureGates: %w", err)
	}
	return gate, nil
}
