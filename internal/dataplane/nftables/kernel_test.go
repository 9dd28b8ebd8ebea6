package nftables

import "testing"

func TestSlotAlloc(t *testing.T) {
	a := newSlotAlloc()
	b1 := a.get("svc a", 3) // size 4
	b2 := a.get("svc b", 1)
	if b1.size != 4 || b2.base != b1.base+4 {
		t.Fatalf("blocks %v %v", b1, b2)
	}
	if again := a.get("svc a", 4); again != b1 {
		t.Errorf("a block that still fits moved: %v -> %v", b1, again)
	}
	grown := a.get("svc a", 5)
	if grown.size != 8 || grown == b1 {
		t.Errorf("grown block %v", grown)
	}
	if reused := a.get("svc c", 4); reused != b1 {
		t.Errorf("freed block not reused: got %v want %v", reused, b1)
	}
	key, b, ok := parseBlockName("svc-ABCDEFGHIJ-ns/name/tcp/p" + blockSuffix(grown))
	if !ok || key != "svc ns/name/tcp/p" || b != grown {
		t.Errorf("parseBlockName = %q %v %v", key, b, ok)
	}
	r := newSlotAlloc()
	if !r.reserve("svc x", block{base: 9, size: 4}) || r.reserve("svc y", block{base: 10, size: 2}) {
		t.Error("overlapping reservation accepted or valid one refused")
	}
	r.compact()
	if got := r.get("svc z", 1); got.base >= 9 {
		t.Errorf("compact did not free the gap below the reservation: %v", got)
	}
}
