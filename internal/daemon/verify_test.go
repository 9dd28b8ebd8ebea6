package daemon

import (
	"slices"
	"testing"

	"github.com/kproxy/kproxy/internal/trace"
)

func TestEndpointNotes(t *testing.T) {
	model := trace.Result{Verdict: "accept", DNAT: []string{"198.18.64.10:8080", "198.18.64.11:8080"}}
	kernel := trace.Result{Verdict: "accept", DNAT: []string{"198.18.64.11:8080", "198.18.64.99:8080"}}
	got := endpointNotes(model, kernel)
	want := []string{
		"the kernel still sends to 198.18.64.99:8080, which is not an endpoint in kproxy's rules",
		"the kernel does not send to 198.18.64.10:8080, an endpoint in kproxy's rules",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("notes %q, want %q", got, want)
	}
	if n := endpointNotes(model, model); len(n) != 0 {
		t.Fatalf("same endpoints: %q", n)
	}
}
