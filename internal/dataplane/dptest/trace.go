package dptest

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
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

// Explore runs p through run once per branch, that is per combination of
// the answers of Choose, and merges the outcomes: the verdict (every
// branch must end with the same one, or the test fails), every DNAT
// target, and whether any branch masqueraded. run returns the verdict of
// one branch. More than 1000 branches fail the test.
func Explore(t testing.TB, p Packet, run func(*Branch) string) Result {
	var res Result
	queue := [][]bool{nil}
	targets, verdicts := map[string]bool{}, map[string]bool{}
	for runs := 0; len(queue) > 0; runs++ {
		if runs > 1000 {
			t.Fatalf("trace of %+v does not terminate", p)
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
		t.Fatalf("branches of %+v end differently: %v", p, verdicts)
	}
	for v := range verdicts {
		res.Verdict = v
	}
	for tg := range targets {
		res.DNAT = append(res.DNAT, tg)
	}
	slices.Sort(res.DNAT)
	return res
}
