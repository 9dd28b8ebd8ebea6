package controlplane

import "testing"

func TestEtcdServesWatchList(t *testing.T) {
	for v, want := range map[string]bool{
		"3.4.23": false, // Debian's etcd-server
		"3.4.31": true,
		"3.5.12": false,
		"3.5.13": true,
		"3.6.0":  true,
		"3.6.8":  true,
		"v3.7.1": true,
		"4.0.0":  true,
		"2.3.8":  false,
		"3.6":    false,
		"":       false,
	} {
		if got := EtcdServesWatchList(v); got != want {
			t.Errorf("EtcdServesWatchList(%q) = %v, want %v", v, got, want)
		}
	}
}
