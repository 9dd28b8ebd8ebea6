package nftables

import (
	"slices"

	"sigs.k8s.io/knftables"
)

// txn accumulates the operations of one transaction in the order the kernel
// needs them: objects before the rules and elements that refer to them.
type txn struct {
	head, sets, chains, rules, dels, adds []op
	// maps are the endpoint-ranges maps sets adds (endpointMapOps).
	maps map[string]bool
	// staging (large full syncs only) sends the port chains the kernel
	// lacks ahead of the transaction, in stages of their own: fresh holds
	// them; those from cut on are not in a stage yet, and pending counts
	// their operations.
	staging bool
	fresh   []*chain
	cut     int
	pending int
	stages  int
	// setsCut is how much of sets the stages cut so far have added.
	setsCut int
	// rendered are the ports rendered for this sync: once it commits,
	// their chains' rules are dropped (see forgetRules).
	rendered []*portState
}

// Staging. A cold sync at 10k Services is one 23 MB batch that the kernel
// takes ~0.65 s to load while kproxy waits, and everything it is made of
// (ops, rule objects, the batch) is alive at once. But a chain the kernel
// lacks is unreachable until a map element or a rule of an existing chain
// points at it, and that happens only in the final transaction. So new
// port chains go first, in stages of ~stageOps operations, each its own
// transaction; the final transaction (fixed objects, rewritten chains,
// elements, deletions) stays one and atomic, so what traffic sees still
// changes at one instant. The stages are a pipeline: a stage is cut as
// soon as its ports are rendered (the rest are rendered meanwhile), then
// encoded in another goroutine while the kernel loads the stage before.
// Elements stay in the final transaction: a transaction that adds to an
// interval map costs the kernel time in proportion to what the map already
// holds, so filling the endpoint-ranges maps over many stages grows
// quadratically (at 10k Services: 35 ms for the first such stage, 395 ms
// for the 17th), and even stages of whole maps made the cold start slower
// (daemon cold starts at 10k, f8bfa28: 2.74 s median with elements in the
// final transaction, 3.09 s with map stages between the chain stages,
// 3.24 s with them after).
// Syncs of fewer than stageMinPorts ports send one transaction.
//
// Rendering runs ahead of the kernel by at most stageQueue stages: a stage
// holds its chains' rules until it is encoded, and the kernel loads stages
// slower than they are rendered, so a queue with room for every stage held
// every rule of the sync at once. A short one costs no time and lowers the
// peak: 10k Services × 100 endpoints with 10 % ClientIP affinity (29
// stages, 200k affinity rules), peak RSS 299 MiB with room for 64 stages,
// 279 with 16, 262 with 4, 266 with 2; cold sync 6.8, 6.5, 6.2, 6.6 s, one
// run each (as root: GOGC=40 KPROXY_SCALE=1 KPROXY_SCALE_SIZES=10000
// KPROXY_SCALE_ENDPOINTS=100 KPROXY_SCALE_AFFINITY=1 go test -run
// 'TestPrivilegedScale$' -v ./internal/dataplane/nftables/).
var (
	stageOps      = 8192
	stageMinPorts = 1000
	stageQueue    = 4
)

// stageChain queues a chain the kernel lacks for the stages.
func (t *txn) stageChain(c *chain) {
	t.fresh = append(t.fresh, c)
	t.pending += 1 + len(c.Rules)
}

// cutStage returns the stage of the chains queued since the last cut (nil
// when there are none). The first stage also adds the table, its sets and
// its fixed chains, which staged rules refer to (adding what exists
// changes nothing); a later one the endpoint-ranges maps added since. A
// stage never splits a port (its chains jump to one another): call it
// between ports.
func (t *txn) cutStage(d *desired) func() opList {
	if t.cut == len(t.fresh) {
		return nil
	}
	part, n := t.fresh[t.cut:], t.pending
	t.cut, t.pending = len(t.fresh), 0
	var prelude []op
	if t.stages == 0 {
		prelude = t.prelude(d)
	} else {
		prelude = setAdds(nil, t.sets[t.setsCut:])
	}
	t.setsCut = len(t.sets)
	t.stages++
	return func() opList {
		ops := opList{prelude, chainOps(part, n)}
		forgetRules(part) // the ops hold them until they are encoded
		return ops
	}
}

// forgetRules drops the rules of port chains once written. A port
// chain's name is a digest of its content, so later syncs diff port chains
// by name alone and write only chains they render afresh: nobody reads the
// text of a written chain again, and staged chains' rules can be
// collected before the sync ends.
func forgetRules(chains []*chain) {
	for _, c := range chains {
		c.Rules = nil
	}
}

// prelude adds the table, every set and every fixed chain, empty (the
// final transaction flushes and fills them; an empty base chain accepts
// everything, like no chain), in the order of a single transaction, so
// that nft lists the table the same either way.
func (t *txn) prelude(d *desired) []op {
	out := setAdds(slices.Clone(t.head), t.sets)
	for _, c := range d.Chains {
		out = append(out, op{verb: opAdd, obj: c.object()})
	}
	return out
}

// setAdds appends the set and map additions among ops to out.
func setAdds(out, ops []op) []op {
	for _, o := range ops {
		switch o.obj.(type) {
		case *knftables.Set, *knftables.Map:
			if o.verb == opAdd {
				out = append(out, o)
			}
		}
	}
	return out
}

// chainOps adds chains, then their rules (n operations in all).
func chainOps(chains []*chain, n int) []op {
	out := make([]op, 0, n)
	for _, c := range chains {
		out = append(out, op{verb: opAdd, obj: c.object()})
	}
	for _, c := range chains {
		for _, r := range c.Rules {
			out = append(out, ruleAdd(c.Name, r))
		}
	}
	return out
}

// ops returns the transaction's operations in order, as parts (not
// copied into one slice: a full sync at 10k Services has 150k of them).
func (t *txn) ops() opList {
	return opList{t.head, t.sets, t.chains, t.rules, t.dels, t.adds}
}

func (t *txn) addChain(c *chain, flush bool) {
	t.chains = append(t.chains, op{verb: opAdd, obj: c.object()})
	if flush {
		t.chains = append(t.chains, op{verb: opFlush, obj: &knftables.Chain{Name: c.Name}})
	}
	for _, r := range c.Rules {
		t.rules = append(t.rules, ruleAdd(c.Name, r))
	}
}
