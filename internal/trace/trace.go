// Package trace runs the first packet of a connection through a ruleset
// that a tracer reads (the rules a dataplane renders, or the rules read
// back from the kernel), exploring every branch of the rules'
// probabilistic matches. The tracers themselves live with the dataplane
// whose rules they read; what is here is the same for all of them: the
// packet, the merged result, and the branch explorer.
//
// A tracer that meets a rule it does not understand calls Failf; Explore
// turns that into its error, so `kproxy explain --verify` reports it
// instead of guessing and the dataplane tests fail on it.
package trace

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
)

// Packet is the first packet of a connection, as a rule tracer sees it.
type Packet struct {
	Src, Dst netip.Addr
	Proto    string // "tcp", "udp", ...
	DPort    uint16
	Iif      string // input interface; "" for the host's own packets
	FromHost bool   // sent by a host-network process (output path)
}

// Result is what happened to a packet over every branch of the rules.
type Result struct {
	Verdict string   // accept, drop or reject
	DNAT    []string // every possible DNAT target (addr:port), sorted; nil when none
	Masq    bool     // masqueraded on at least one branch
}

func (r Result) String() string {
	return fmt.Sprintf("%s dnat=%v masq=%v", r.Verdict, r.DNAT, r.Masq)
}

// Branch is the state of one packet along one path through the rules. A
// tracer changes the packet fields as NAT does, and asks Choose at each
// probabilistic match (statistic, numgen, recent).
type Branch struct {
	Packet
	Mark    uint32
	DNATted bool
	Masq    bool
	choices []bool // decisions to take, in order
	taken   []bool // decisions taken
}

// Choose returns the next decision of this branch: the prescribed one, or
// true past the prescribed ones.
func (b *Branch) Choose() bool {
	c := true
	if len(b.taken) < len(b.choices) {
		c = b.choices[len(b.taken)]
	}
	b.taken = append(b.taken, c)
	return c
}

// Verification is one packet traced twice: through the rules kproxy
// renders from its model (what it means the kernel to hold) and through
// the rules the kernel holds, read back.
type Verification struct {
	Model Result
	// Kernel is the kernel's outcome; KernelErr says why there is none
	// (a rule kproxy does not write on the packet's path, say).
	Kernel    Result
	KernelErr error
	// Notes are the differences seen on the packet's path: chains or
	// rules missing or added, set elements missing or added, other
	// proxies' rules.
	Notes []string
}

// Agree reports whether the kernel does what kproxy's rules mean to do,
// with nothing different on the way.
func (v Verification) Agree() bool {
	return v.KernelErr == nil && len(v.Notes) == 0 && v.Kernel.String() == v.Model.String()
}

// failure is what Failf panics with and Explore recovers.
type failure struct{ err error }

// Failf stops the trace: the rules hold something the tracer cannot
// evaluate. Only tracers running under Explore may call it.
func Failf(format string, args ...any) {
	panic(failure{fmt.Errorf(format, args...)})
}

// maxBranches bounds the exploration: kproxy's rules branch once per
// endpoint (and once for affinity), so a Service port with N endpoints
// takes about N runs.
const maxBranches = 100_000

// Explore runs p through run once per branch, that is per combination of
// the answers of Choose, and merges the outcomes: the verdict (every
// branch must end with the same one), every DNAT target, and whether any
// branch masqueraded. run returns the verdict of one branch. A Failf in
// run, branches that end differently, or more than maxBranches branches
// are an error.
func Explore(p Packet, run func(*Branch) string) (res Result, err error) {
	defer func() {
		if r := recover(); r != nil {
			f, ok := r.(failure)
			if !ok {
				panic(r)
			}
			res, err = Result{}, f.err
		}
	}()
	queue := [][]bool{nil}
	targets, verdicts := map[string]bool{}, map[string]bool{}
	for runs := 0; len(queue) > 0; runs++ {
		if runs > maxBranches {
			return Result{}, fmt.Errorf("trace of %+v takes more than %d branches", p, maxBranches)
		}
		prefix := queue[0]
		queue = queue[1:]
		b := &Branch{Packet: p, choices: prefix}
		verdicts[run(b)] = true
		if b.DNATted {
			targets[netip.AddrPortFrom(b.Dst, b.DPort).String()] = true
		}
		res.Masq = res.Masq || b.Masq
		for i := len(prefix); i < len(b.taken); i++ {
			if b.taken[i] {
				queue = append(queue, append(slices.Clone(b.taken[:i]), false))
			}
		}
	}
	if len(verdicts) != 1 {
		return Result{}, fmt.Errorf("branches of %+v end differently: %v", p, slices.Sorted(maps.Keys(verdicts)))
	}
	for v := range verdicts {
		res.Verdict = v
	}
	for tg := range targets {
		res.DNAT = append(res.DNAT, tg)
	}
	slices.Sort(res.DNAT)
	return res, nil
}
