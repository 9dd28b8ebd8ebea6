package model

import "math/rand/v2"

// Hooks for the external test package (kernelcheck_test.go).
var (
	// RandomInput draws an Input from fuzz bytes, as FuzzBuild does.
	RandomInput = func(data []byte) Input { return (&gen{data: data}).input() }
	// RandomBytes is n random bytes from r.
	RandomBytes = func(r *rand.Rand, n int) []byte { return randomBytes(r, n) }
)
