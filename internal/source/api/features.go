package api

import (
	"k8s.io/component-base/featuregate"

	clientfeatures "k8s.io/client-go/features"
)

// UseFeatureGates makes client-go read its feature gates (WatchListClient,
// InOrderInformers, ClientsAllowCBOR, ...) from gates, kproxy's
// --feature-gates, as upstream kube-proxy's client-go reads them from its
// own. set holds the gates the operator named (the configuration's
// featureGates): client-go's gates are process-wide, so call it once,
// before NewClient. A gate that gates does not know keeps client-go's
// default.
//
// One default differs from upstream's: the informers LIST unless
// WatchListClient is named and true. A Service or EndpointSlice list is
// streamed and slimmed item by item (stream.go), which bounds kproxy's
// memory as a watch-list does and takes the initial objects in a third to
// a half of a watch-list's time: at 10k Services x 10 endpoints the inputs
// were synced in 0.38 s against 1.10 s, at 10k x 100 in 1.2-1.4 s against
// 1.8-2.1 s, each about the API server's own LIST (`make bench-scale
// SERVICES=10000 ENDPOINTS=10 MODE=nftables PROXY=kproxy`, its inputs_s and
// bare_list_s; docs/performance.md, "Lists instead of watch-lists").
// `--feature-gates WatchListClient=true` asks for the watch-list again.
func UseFeatureGates(gates featuregate.FeatureGate, set map[string]bool) {
	known := map[featuregate.Feature]bool{}
	if gates != nil {
		if all, ok := gates.(interface {
			GetAll() map[featuregate.Feature]featuregate.FeatureSpec
		}); ok {
			for f := range all.GetAll() {
				known[f] = true
			}
		}
	}
	_, watchListNamed := set[string(clientfeatures.WatchListClient)]
	clientfeatures.ReplaceFeatureGates(clientGates{gates: gates, known: known, watchListNamed: watchListNamed, fallback: clientfeatures.FeatureGates()})
}

// clientGates answers client-go's gate queries from kproxy's gates.
type clientGates struct {
	gates          featuregate.FeatureGate
	known          map[featuregate.Feature]bool
	watchListNamed bool
	fallback       clientfeatures.Gates
}

func (g clientGates) Enabled(f clientfeatures.Feature) bool {
	if f == clientfeatures.WatchListClient && !g.watchListNamed {
		return false
	}
	if k := featuregate.Feature(f); g.known[k] {
		return g.gates.Enabled(k)
	}
	return g.fallback.Enabled(f)
}

// EffectiveGates is gates as this process uses them: WatchListClient reads
// false unless set names it (UseFeatureGates), every other gate as gates
// has it. The metrics publish it, so that kubernetes_feature_enabled says
// whether kproxy's informers ask for watch-lists.
func EffectiveGates(gates featuregate.FeatureGate, set map[string]bool) featuregate.FeatureGate {
	if _, named := set[string(clientfeatures.WatchListClient)]; named || gates == nil {
		return gates
	}
	return listingGates{gates}
}

// listingGates is a gate whose WatchListClient is off.
type listingGates struct{ featuregate.FeatureGate }

func (g listingGates) Enabled(f featuregate.Feature) bool {
	return f != featuregate.Feature(clientfeatures.WatchListClient) && g.FeatureGate.Enabled(f)
}

// GetAll lists the wrapped gate's features (the metrics' list of series).
func (g listingGates) GetAll() map[featuregate.Feature]featuregate.FeatureSpec {
	if all, ok := g.FeatureGate.(interface {
		GetAll() map[featuregate.Feature]featuregate.FeatureSpec
	}); ok {
		return all.GetAll()
	}
	return nil
}
