package trace

import (
	"net/netip"
	"strings"
	"testing"
)

var pkt = Packet{Src: netip.MustParseAddr("198.18.200.5"), Dst: netip.MustParseAddr("198.19.0.10"), DPort: 80, Proto: "tcp"}

// TestExploreBranches: every combination of choices is explored once, and
// the DNAT targets of all branches are merged.
func TestExploreBranches(t *testing.T) {
	backends := []string{"198.18.64.10", "198.18.64.11", "198.18.64.12"}
	runs := 0
	res, err := Explore(pkt, func(b *Branch) string {
		runs++
		for i, a := range backends {
			if i == len(backends)-1 || b.Choose() {
				b.Dst, b.DPort, b.DNATted = netip.MustParseAddr(a), 8080, true
				break
			}
		}
		b.Masq = b.Dst.String() == backends[1]
		return "accept"
	})
	if err != nil {
		t.Fatal(err)
	}
	if runs != 3 || res.String() != "accept dnat=[198.18.64.10:8080 198.18.64.11:8080 198.18.64.12:8080] masq=true" {
		t.Fatalf("%d runs, %v", runs, res)
	}
}

// TestExploreErrors: a tracer's Failf, diverging verdicts and endless
// branching are errors, not panics.
func TestExploreErrors(t *testing.T) {
	for name, run := range map[string]func(*Branch) string{
		"failf": func(*Branch) string { Failf("rule %q not understood", "counter"); return "" },
		"diverging": func(b *Branch) string {
			if b.Choose() {
				return "accept"
			}
			return "drop"
		},
		"endless": func(b *Branch) string {
			for range 20 {
				b.Choose()
			}
			return "accept"
		},
	} {
		if _, err := Explore(pkt, run); err == nil {
			t.Errorf("%s: no error", name)
		} else if name == "failf" && !strings.Contains(err.Error(), `rule "counter" not understood`) {
			t.Errorf("failf: %v", err)
		}
	}
}

func TestVerificationAgree(t *testing.T) {
	r := Result{Verdict: "accept", DNAT: []string{"198.18.64.10:8080"}}
	if !(Verification{Model: r, Kernel: r}).Agree() {
		t.Error("same results do not agree")
	}
	if (Verification{Model: r, Kernel: r, Notes: []string{"x"}}).Agree() {
		t.Error("a note agrees")
	}
	if (Verification{Model: r, Kernel: Result{Verdict: "accept"}}).Agree() {
		t.Error("different results agree")
	}
}
