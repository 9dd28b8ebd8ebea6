package dptest

import (
	"testing"

	"github.com/kproxy/kproxy/internal/trace"
)

// The tracers' types, from package trace.
type (
	Packet = trace.Packet
	Result = trace.Result
	Branch = trace.Branch
)

// Explore is trace.Explore that fails the test on an error.
func Explore(t testing.TB, p Packet, run func(*Branch) string) Result {
	t.Helper()
	res, err := trace.Explore(p, run)
	if err != nil {
		t.Fatal(err)
	}
	return res
}
