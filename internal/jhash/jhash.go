// Package jhash computes what the kernel's nft_hash expression (`jhash …
// mod M seed S offset B`) computes: Bob Jenkins' lookup3 hash as
// include/linux/jhash.h has it, scaled into [0, M) by multiplication
// (reciprocal_scale), plus the offset. kproxy's source-hash balancing uses it
// so that the tools can say which endpoint a client goes to, and the
// userspace mode picks the endpoint the nftables mode would.
package jhash

import (
	"encoding/binary"
	"math/bits"
)

// initval is JHASH_INITVAL, an arbitrary value.
const initval = 0xdeadbeef

// Sum is jhash(key, len(key), seed): key is read as the kernel reads it on
// a little-endian machine (the registers of nf_tables hold packet bytes in
// wire order).
func Sum(key []byte, seed uint32) uint32 {
	a := initval + uint32(len(key)) + seed
	b, c := a, a
	for len(key) > 12 {
		a += binary.LittleEndian.Uint32(key)
		b += binary.LittleEndian.Uint32(key[4:])
		c += binary.LittleEndian.Uint32(key[8:])
		a, b, c = mix(a, b, c)
		key = key[12:]
	}
	if len(key) == 0 {
		return c
	}
	// The last 1-12 bytes, each added at its place (the kernel's switch
	// falls through from the length down to 1).
	var words [3]uint32
	for i, k := range key {
		words[i/4] += uint32(k) << (8 * (i % 4))
	}
	a += words[0]
	b += words[1]
	c += words[2]
	return final(a, b, c)
}

func mix(a, b, c uint32) (uint32, uint32, uint32) {
	a -= c
	a ^= bits.RotateLeft32(c, 4)
	c += b
	b -= a
	b ^= bits.RotateLeft32(a, 6)
	a += c
	c -= b
	c ^= bits.RotateLeft32(b, 8)
	b += a
	a -= c
	a ^= bits.RotateLeft32(c, 16)
	c += b
	b -= a
	b ^= bits.RotateLeft32(a, 19)
	a += c
	c -= b
	c ^= bits.RotateLeft32(b, 4)
	b += a
	return a, b, c
}

func final(a, b, c uint32) uint32 {
	c ^= b
	c -= bits.RotateLeft32(b, 14)
	a ^= c
	a -= bits.RotateLeft32(c, 11)
	b ^= a
	b -= bits.RotateLeft32(a, 25)
	c ^= b
	c -= bits.RotateLeft32(b, 16)
	a ^= c
	a -= bits.RotateLeft32(c, 4)
	b ^= a
	b -= bits.RotateLeft32(a, 14)
	c ^= b
	c -= bits.RotateLeft32(b, 24)
	return c
}

// Bucket is the value of `jhash KEY mod m seed seed` (offset 0): the hash
// scaled into [0, m) as the kernel's reciprocal_scale does.
func Bucket(key []byte, seed, m uint32) uint32 {
	return uint32(uint64(Sum(key, seed)) * uint64(m) >> 32)
}
