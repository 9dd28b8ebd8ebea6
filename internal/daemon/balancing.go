package daemon

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kproxy/kproxy/internal/model"
)

// balancingSupport lists the load-balancing algorithms each proxy mode
// implements (the README's table says why the others are missing).
var balancingSupport = map[string][]model.Balancing{
	ModeNFTables:  {model.BalanceRandom, model.BalanceRoundRobin, model.BalanceSourceHash},
	ModeIPTables:  {model.BalanceRandom, model.BalanceRoundRobin},
	ModeIPVS:      {model.BalanceRandom, model.BalanceRoundRobin, model.BalanceLeastConnections, model.BalanceSourceHash},
	ModeUserspace: {model.BalanceRandom, model.BalanceRoundRobin, model.BalanceLeastConnections, model.BalanceSourceHash},
}

// balancingFor returns what the model needs to know of mode's balancing,
// with name (--load-balancing; "" is random) as the default. A default the mode cannot
// do is an error: every Service would silently get another.
func balancingFor(mode, name string) (model.BalancingOptions, error) {
	if name == "" {
		name = model.BalanceRandom.String()
	}
	def, ok := model.ParseBalancing(name)
	if !ok {
		return model.BalancingOptions{}, fmt.Errorf("--load-balancing=%q: not one of %s", name, strings.Join(model.BalancingNames(), ", "))
	}
	supported, known := balancingSupport[mode]
	if known && !slices.Contains(supported, def) {
		names := make([]string, len(supported))
		for i, b := range supported {
			names[i] = b.String()
		}
		return model.BalancingOptions{}, fmt.Errorf("--load-balancing=%s is not supported in %s mode (it supports %s)", name, mode, strings.Join(names, ", "))
	}
	if !known {
		supported = nil
	}
	return model.BalancingOptions{Default: def, Supported: supported, Mode: mode}, nil
}
