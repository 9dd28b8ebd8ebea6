package metrics

import (
	"errors"
	"slices"
	"testing"
)

// TestServiceTraffic: with a reader, each Service port's counters are
// three counters labelled namespace, name, port and ip_family; a failed
// read leaves them out; without a reader they are not registered.
func TestServiceTraffic(t *testing.T) {
	fail := false
	read := func() ([]ServiceTraffic, error) {
		if fail {
			return nil, errors.New("no table")
		}
		return []ServiceTraffic{
			{Namespace: "ns", Name: "web", Port: "http", Family: "IPv4", NewConnections: 3, Packets: 30, Bytes: 3000},
			{Namespace: "ns", Name: "web", Port: "http", Family: "IPv6", NewConnections: 1, Packets: 10, Bytes: 1000},
		}, nil
	}
	reg := NewRegistry()
	if _, err := New(reg, Options{Mode: ModeNFTables, ServiceTraffic: read}); err != nil {
		t.Fatal(err)
	}
	s := NewServer(ServerConfig{Gatherer: reg})
	fams := scrape(t, s)
	for name, want := range map[string][2]float64{
		ServiceNewConnections: {3, 1}, ServicePackets: {30, 10}, ServiceBytes: {3000, 1000},
	} {
		mf := fams[name]
		if mf == nil || len(mf.GetMetric()) != 2 {
			t.Fatalf("%s: %v", name, mf)
		}
		if got := labelNames(mf); !slices.Equal(got, []string{"ip_family", "name", "namespace", "port"}) {
			t.Errorf("%s labels %v", name, got)
		}
		for i, m := range mf.GetMetric() {
			if m.GetCounter().GetValue() != want[i] {
				t.Errorf("%s[%d] = %v, want %v", name, i, m.GetCounter().GetValue(), want[i])
			}
		}
	}
	fail = true
	if fams := scrape(t, s); fams[ServicePackets] != nil {
		t.Errorf("samples exposed after a failed read")
	}
	reg = NewRegistry()
	if _, err := New(reg, Options{Mode: ModeNFTables}); err != nil {
		t.Fatal(err)
	}
	if fams := scrape(t, NewServer(ServerConfig{Gatherer: reg})); fams[ServicePackets] != nil {
		t.Errorf("traffic metrics registered without a reader")
	}
}
