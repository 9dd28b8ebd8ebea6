package api

import (
	"testing"

	clientfeatures "k8s.io/client-go/features"
	"k8s.io/component-base/featuregate"
	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"

	"github.com/kproxy/kproxy/internal/config"
)

// registry records the gates client-go registers.
type registry map[featuregate.Feature]featuregate.FeatureSpec

func (r registry) Add(m map[clientfeatures.Feature]clientfeatures.FeatureSpec) error {
	for f, s := range m {
		r[featuregate.Feature(f)] = featuregate.FeatureSpec{Default: s.Default}
	}
	return nil
}

// Every client-go gate is one kproxy knows (upstream registers them all
// with kube-proxy's gate), with client-go's default, and --feature-gates
// reaches client-go.
func TestUseFeatureGates(t *testing.T) {
	defaults, err := config.FeatureGateFor(&kpv1alpha1.KubeProxyConfiguration{})
	if err != nil {
		t.Fatal(err)
	}
	client := registry{}
	if err := clientfeatures.AddFeaturesToExistingFeatureGates(client); err != nil {
		t.Fatal(err)
	}
	for f, spec := range client {
		if !contains(defaults, f) {
			t.Errorf("client-go gate %s unknown to kproxy", f)
			continue
		}
		if got := defaults.Enabled(f); got != spec.Default {
			t.Errorf("%s: kproxy default %v, client-go's %v", f, got, spec.Default)
		}
	}

	off, err := config.FeatureGateFor(&kpv1alpha1.KubeProxyConfiguration{FeatureGates: map[string]bool{"WatchListClient": false}})
	if err != nil {
		t.Fatal(err)
	}
	before := clientfeatures.FeatureGates()
	t.Cleanup(func() { clientfeatures.ReplaceFeatureGates(before) })
	UseFeatureGates(off)
	if clientfeatures.FeatureGates().Enabled(clientfeatures.WatchListClient) {
		t.Error("WatchListClient=false did not reach client-go")
	}
	if !clientfeatures.FeatureGates().Enabled(clientfeatures.InOrderInformers) {
		t.Error("InOrderInformers (default on) reads as off")
	}
	g := clientGates{gates: off, known: map[featuregate.Feature]bool{}, fallback: before}
	if !g.Enabled(clientfeatures.WatchListClient) {
		t.Error("a gate kproxy does not know should keep client-go's default (on)")
	}
}

func contains(g featuregate.FeatureGate, f featuregate.Feature) bool {
	all, ok := g.(interface {
		GetAll() map[featuregate.Feature]featuregate.FeatureSpec
	})
	if !ok {
		return false
	}
	_, known := all.GetAll()[f]
	return known
}
