package metrics

import (
	"testing"
)

// TestRelays: each endpoint of a Service port has the relay gauge and
// counters, bytes split by direction.
func TestRelays(t *testing.T) {
	read := func() []Relays {
		return []Relays{{Namespace: "ns", Name: "web", Port: "http", Family: "IPv4", Endpoint: "198.18.17.10:8080",
			Active: 2, Total: 7, BytesToEndpoint: 100, BytesFromEndpoint: 900, ConnectErrors: 1, Retries: 1}}
	}
	reg := NewRegistry()
	if _, err := New(reg, Options{Mode: "userspace", Relays: read}); err != nil {
		t.Fatal(err)
	}
	fams := scrape(t, NewServer(ServerConfig{Gatherer: reg}))
	for name, want := range map[string]float64{RelayTotal: 7, RelayConnectErrors: 1, RelayRetries: 1} {
		mf := fams[name]
		if mf == nil || len(mf.GetMetric()) != 1 || mf.GetMetric()[0].GetCounter().GetValue() != want {
			t.Errorf("%s: %v, want %v", name, mf, want)
		}
	}
	if mf := fams[RelayActive]; mf == nil || mf.GetMetric()[0].GetGauge().GetValue() != 2 {
		t.Errorf("%s: %v", RelayActive, mf)
	}
	if mf := fams[RelayBytes]; mf == nil || len(mf.GetMetric()) != 2 {
		t.Errorf("%s: %v, want both directions", RelayBytes, mf)
	}
}
