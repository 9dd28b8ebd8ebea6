package jhash

import "testing"

// The IPv4 value is the kernel's: TestPrivilegedBalancing
// (internal/dataplane/nftables) checks that connections from real client
// addresses reach the endpoint this package predicts; the e2e suite's
// source-hash case does the same for IPv6. The values pin the
// implementation against accidental change.
func TestSum(t *testing.T) {
	for _, tc := range []struct {
		key  []byte
		seed uint32
		want uint32
	}{
		{nil, 0, 0xdeadbeef},
		{[]byte{198, 18, 200, 10}, 1, 0x7f338bbf},
		{[]byte{0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, 0x4054985, 0x34b726aa},
	} {
		if got := Sum(tc.key, tc.seed); got != tc.want {
			t.Errorf("Sum(%v, %#x) = %#x, want %#x", tc.key, tc.seed, got, tc.want)
		}
	}
}

func TestBucketInRange(t *testing.T) {
	for i := range 1000 {
		key := []byte{198, 18, byte(i >> 8), byte(i)}
		if b := Bucket(key, 7, 251); b >= 251 {
			t.Fatalf("Bucket(%v) = %d, out of [0, 251)", key, b)
		}
	}
}
