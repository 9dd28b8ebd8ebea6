package nftables

import "testing"

// TestNormalized: what depends on a kproxy's history (a policy chain's
// block, and so the hashes of port chain names) normalizes away; the
// rest stays.
func TestNormalized(t *testing.T) {
	for in, want := range map[string]string{
		"goto svc-RYL2VZGOFC-e2e/verify-ipv6/tcp/tcp/1":                                               "goto svc-*-e2e/verify-ipv6/tcp/tcp/*",
		"svc-HLLKFANYW2-e2e/verify-ipv6/tcp/tcp/0":                                                    "svc-*-e2e/verify-ipv6/tcp/tcp/*",
		"ip saddr 198.18.64.0/18 goto ext-TS7J7LK2KH-demo/echo-nodeport/tcp/tcp":                      "ip saddr 198.18.64.0/18 goto ext-*-demo/echo-nodeport/tcp/tcp",
		"meta l4proto tcp dnat ip to numgen random mod 1048576 offset 40 map @endpoint-ranges-tcp-07": "meta l4proto tcp dnat ip to numgen random mod 1048576 offset * map @endpoint-ranges-*",
		"jump services":              "jump services",
		"ip daddr @cluster-ips drop": "ip daddr @cluster-ips drop",
	} {
		if got := normalized(in); got != want {
			t.Errorf("normalized(%q) = %q, want %q", in, got, want)
		}
	}
}
