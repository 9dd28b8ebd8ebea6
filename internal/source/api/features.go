package api

import (
	"k8s.io/component-base/featuregate"

	clientfeatures "k8s.io/client-go/features"
)

// UseFeatureGates makes client-go read its feature gates (WatchListClient,
// InOrderInformers, ClientsAllowCBOR, ...) from gates, kproxy's
// --feature-gates, as upstream kube-proxy's client-go reads them from its
// own: `--feature-gates WatchListClient=false` makes the informers LIST
// instead of asking for a watch-list. client-go's gates are process-wide:
// call it once, before NewClient. A gate that gates does not know keeps
// client-go's default.
func UseFeatureGates(gates featuregate.FeatureGate) {
	known := map[featuregate.Feature]bool{}
	if all, ok := gates.(interface {
		GetAll() map[featuregate.Feature]featuregate.FeatureSpec
	}); ok {
		for f := range all.GetAll() {
			known[f] = true
		}
	}
	clientfeatures.ReplaceFeatureGates(clientGates{gates: gates, known: known, fallback: clientfeatures.FeatureGates()})
}

// clientGates answers client-go's gate queries from kproxy's gates.
type clientGates struct {
	gates    featuregate.FeatureGate
	known    map[featuregate.Feature]bool
	fallback clientfeatures.Gates
}

func (g clientGates) Enabled(f clientfeatures.Feature) bool {
	if k := featuregate.Feature(f); g.known[k] {
		return g.gates.Enabled(k)
	}
	return g.fallback.Enabled(f)
}
