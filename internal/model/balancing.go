package model

import (
	"slices"
	"strings"

	"github.com/kproxy/kproxy/internal/objects"
)

// Balancing is how a service port picks an endpoint for a new connection
// (or a new UDP flow) that session affinity does not already place.
type Balancing uint8

const (
	// BalanceRandom picks uniformly at random: upstream kube-proxy's
	// nftables and iptables modes, and the default.
	BalanceRandom Balancing = iota
	// BalanceRoundRobin picks the endpoints in turn.
	BalanceRoundRobin
	// BalanceLeastConnections picks an endpoint with the fewest open
	// connections.
	BalanceLeastConnections
	// BalanceSourceHash picks by a hash of the client address into a
	// table that changes little when an endpoint comes or goes
	// (SourceHashTable).
	BalanceSourceHash
)

// balancingNames are the values of objects.AnnotationLoadBalancing and of
// --load-balancing, in Balancing order.
var balancingNames = [...]string{"random", "round-robin", "least-connections", "source-hash"}

// BalancingNames returns the accepted names, in order.
func BalancingNames() []string { return slices.Clone(balancingNames[:]) }

func (b Balancing) String() string {
	if int(b) < len(balancingNames) {
		return balancingNames[b]
	}
	return "unknown"
}

// IPVSScheduler is the IPVS scheduler doing b: rr, lc, or mh (Maglev
// hashing of the client address); "" for random, which IPVS has no
// scheduler for and which means the configured one (upstream's behaviour).
func (b Balancing) IPVSScheduler() string {
	switch b {
	case BalanceRoundRobin:
		return "rr"
	case BalanceLeastConnections:
		return "lc"
	case BalanceSourceHash:
		return "mh"
	}
	return ""
}

// ParseBalancing reads a name as the annotation and the flag spell it.
func ParseBalancing(s string) (Balancing, bool) {
	i := slices.Index(balancingNames[:], s)
	return Balancing(max(i, 0)), i >= 0
}

// BalancingOptions is what the proxy mode offers: the algorithm of Services
// without the annotation, and which algorithms it can do.
type BalancingOptions struct {
	// Default is used for Services without (or with an unusable)
	// objects.AnnotationLoadBalancing.
	Default Balancing
	// Supported lists the algorithms the mode implements; nil means all.
	Supported []Balancing
	// Mode names the proxy mode in problems ("nftables").
	Mode string
}

func (o BalancingOptions) supports(b Balancing) bool {
	return o.Supported == nil || slices.Contains(o.Supported, b)
}

func (o BalancingOptions) equal(p BalancingOptions) bool {
	return o.Default == p.Default && o.Mode == p.Mode && slices.Equal(o.Supported, p.Supported)
}

// Event reasons of the balancing problems.
const (
	ReasonUnknownBalancing     = "UnknownLoadBalancing"
	ReasonUnsupportedBalancing = "UnsupportedLoadBalancing"
)

// parseBalancing reads the load-balancing annotation: unset is the
// default; an unknown value, or one the mode cannot do, is a problem and
// the default is used.
func parseBalancing(s string, o BalancingOptions, probs *problemList) Balancing {
	s = strings.TrimSpace(s)
	if s == "" {
		return o.Default
	}
	field := "metadata.annotations[" + objects.AnnotationLoadBalancing + "]"
	b, ok := ParseBalancing(s)
	switch {
	case !ok:
		probs.addEvent(field, ReasonUnknownBalancing, "unknown load-balancing algorithm "+quote(s)+
			" (one of "+strings.Join(balancingNames[:], ", ")+"); using "+o.Default.String())
		return o.Default
	case !o.supports(b):
		mode := o.Mode
		if mode == "" {
			mode = "this"
		}
		probs.addEvent(field, ReasonUnsupportedBalancing, b.String()+" is not supported in "+mode+
			" mode; using "+o.Default.String())
		return o.Default
	}
	return b
}
