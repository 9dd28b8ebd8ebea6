package nftables

import (
	"fmt"
	"math/bits"
	"strconv"
	"strings"
)

// slotAlloc hands out blocks of keys of the shared endpoints map. A policy
// chain picks its endpoint with `numgen random mod M offset BASE map
// @endpoints`, and the endpoints themselves are the elements BASE..BASE+M-1.
// So an endpoint change with the same count changes map elements only; no
// rule, no chain, and no kernel table validation. Blocks are powers of two
// so that a chain keeps its block while its endpoint count varies a little.
type slotAlloc struct {
	next  uint32
	free  map[uint32][]uint32 // block size -> free bases
	owner map[string]block    // chain key -> block
	// used marks the slots of reserved blocks until compact.
	used map[uint32]bool
}

type block struct{ base, size uint32 }

// maxSlot bounds the blocks accepted from kernel chain names (compact walks
// every slot below the highest one).
const maxSlot = 1 << 24

func newSlotAlloc() *slotAlloc {
	return &slotAlloc{next: 1, free: map[uint32][]uint32{}, owner: map[string]block{}}
}

func blockSize(m int) uint32 {
	if m <= 1 {
		return 1
	}
	return 1 << bits.Len32(uint32(m-1))
}

// get returns key's block, (re)allocating it when it is missing or too small
// for m endpoints.
func (a *slotAlloc) get(key string, m int) block {
	size := blockSize(m)
	if b, ok := a.owner[key]; ok {
		if b.size >= size {
			return b
		}
		a.release(key)
	}
	var b block
	if list := a.free[size]; len(list) > 0 {
		b = block{base: list[len(list)-1], size: size}
		a.free[size] = list[:len(list)-1]
	} else {
		b = block{base: a.next, size: size}
		a.next += size
	}
	a.owner[key] = b
	return b
}

// release returns key's block, if any, to the free list.
func (a *slotAlloc) release(key string) {
	if b, ok := a.owner[key]; ok {
		delete(a.owner, key)
		a.free[b.size] = append(a.free[b.size], b.base)
	}
}

// reserve records a block found in the kernel (from a chain name) so that a
// restarted proxy keeps it. It returns false when the block is unusable.
func (a *slotAlloc) reserve(key string, b block) bool {
	if _, ok := a.owner[key]; ok || b.size == 0 || b.size&(b.size-1) != 0 || b.base == 0 || b.base+b.size > maxSlot {
		return false
	}
	if a.used == nil {
		a.used = map[uint32]bool{}
	}
	for i := b.base; i < b.base+b.size; i++ {
		if a.used[i] {
			return false
		}
	}
	for i := b.base; i < b.base+b.size; i++ {
		a.used[i] = true
	}
	a.owner[key] = b
	a.next = max(a.next, b.base+b.size)
	return true
}

// compact rebuilds the free lists after reservations: every gap below next
// becomes free blocks of size one (the simplest always-correct choice).
func (a *slotAlloc) compact() {
	a.free = map[uint32][]uint32{}
	for i := uint32(1); i < a.next; i++ {
		if !a.used[i] {
			a.free[1] = append(a.free[1], i)
		}
	}
	a.used = nil
}

// blockSuffix is how a policy chain's name records its block.
func blockSuffix(b block) string { return fmt.Sprintf("/%d.%d", b.base, b.size) }

// parseBlockName splits a policy chain name "svc-HASH-human/BASE.SIZE" into
// the allocator key ("svc human") and block.
func parseBlockName(name string) (string, block, bool) {
	prefix, rest, ok := strings.Cut(name, "-")
	if !ok || (prefix != "svc" && prefix != "loc") {
		return "", block{}, false
	}
	_, human, ok := strings.Cut(rest, "-")
	i := strings.LastIndex(human, "/")
	if !ok || i < 0 {
		return "", block{}, false
	}
	baseS, sizeS, ok := strings.Cut(human[i+1:], ".")
	base, err1 := strconv.ParseUint(baseS, 10, 32)
	size, err2 := strconv.ParseUint(sizeS, 10, 32)
	if !ok || err1 != nil || err2 != nil {
		return "", block{}, false
	}
	return prefix + " " + human[:i], block{base: uint32(base), size: uint32(size)}, true
}
