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

	before := clientfeatures.FeatureGates()
	t.Cleanup(func() { clientfeatures.ReplaceFeatureGates(before) })
	for _, tc := range []struct {
		set           map[string]bool
		wantWatchList bool
	}{
		{nil, false}, // kproxy lists unless the watch-list is asked for
		{map[string]bool{"WatchListClient": false}, false},
		{map[string]bool{"WatchListClient": true}, true},
		{map[string]bool{"InOrderInformers": true}, false},
	} {
		gates, err := config.FeatureGateFor(&kpv1alpha1.KubeProxyConfiguration{FeatureGates: tc.set})
		if err != nil {
			t.Fatal(err)
		}
		UseFeatureGates(gates, tc.set)
		if got := clientfeatures.FeatureGates().Enabled(clientfeatures.WatchListClient); got != tc.wantWatchList {
			t.Errorf("%v: client-go's WatchListClient = %v, want %v", tc.set, got, tc.wantWatchList)
		}
		if !clientfeatures.FeatureGates().Enabled(clientfeatures.InOrderInformers) {
			t.Errorf("%v: InOrderInformers (default on) reads as off", tc.set)
		}
		// The metrics' view says what client-go does, and lists every gate.
		eff := EffectiveGates(gates, tc.set)
		if got := eff.Enabled(featuregate.Feature(clientfeatures.WatchListClient)); got != tc.wantWatchList {
			t.Errorf("%v: the published WatchListClient = %v, want %v", tc.set, got, tc.wantWatchList)
		}
		if !eff.Enabled(featuregate.Feature(clientfeatures.InOrderInformers)) {
			t.Errorf("%v: the published InOrderInformers (default on) reads as off", tc.set)
		}
		if !contains(eff, featuregate.Feature(clientfeatures.WatchListClient)) {
			t.Errorf("%v: the published gates do not list WatchListClient", tc.set)
		}
	}
	g := clientGates{gates: defaults, known: map[featuregate.Feature]bool{}, watchListNamed: true, fallback: before}
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
