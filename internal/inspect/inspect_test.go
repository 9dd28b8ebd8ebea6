package inspect

import (
	"context"
	"errors"
	"net"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/explain"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/objects"
)

func snapshot(t *testing.T) *model.Snapshot {
	t.Helper()
	svc := &objects.Service{Namespace: "ns", Name: "web", Type: "NodePort", ClusterIPs: []string{"198.18.130.1"},
		Ports: []objects.ServicePort{{Name: "http", Protocol: "TCP", Port: 80, NodePort: 30080}}, ExternalTrafficPolicy: "Local"}
	yes, no := objects.CondTrue, objects.CondFalse
	slice := &objects.EndpointSlice{Namespace: "ns", Name: "web-1", ServiceName: "web", AddressType: "IPv4",
		Ports: []objects.EndpointPort{{Name: "http", Protocol: "TCP", Port: 8080}},
		Endpoints: []objects.Endpoint{
			{Addr: netip.MustParseAddr("198.18.17.10"), Node: objects.OnNode("node1"), HasAddress: true, Ready: yes, Serving: yes, Terminating: no},
			{Addr: netip.MustParseAddr("198.18.18.10"), Node: objects.OnNode("node2"), HasAddress: true, Ready: no, Serving: yes, Terminating: yes},
		}}
	snap, probs := model.Build(model.Input{NodeName: "node1",
		Node:     &objects.Node{Name: "node1", InternalIPs: []string{"198.18.0.11"}},
		Services: map[objects.Key]*objects.Service{svc.Key(): svc},
		Slices:   map[objects.Key][]*objects.EndpointSlice{svc.Key(): {slice}}})
	if len(probs) > 0 {
		t.Fatal(probs)
	}
	return snap
}

func TestRecorderState(t *testing.T) {
	r := NewRecorder("node1", "nftables", []model.Family{model.IPv4}, nil)
	if st := r.State(time.Now()); st.LastSync != nil || len(st.Services) != 0 {
		t.Fatalf("before any sync: %+v", st)
	}
	at := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	ops := 12
	r.Synced(Sync{Time: at, Duration: 3 * time.Millisecond, Full: true, Reason: "initial", KernelOps: &ops}, snapshot(t))
	r.Synced(Sync{Time: at.Add(time.Second), Reason: "change", Error: "boom"}, nil)
	r.Synced(Sync{Time: at.Add(2 * time.Second), Full: true, Reason: "drift"}, snapshot(t))
	r.Pending(2, 5)
	st := r.State(at.Add(3 * time.Second))
	if st.Syncs != 3 || st.FailedSyncs != 1 || st.DriftRepairs != 1 || st.PendingServices != 2 || st.PendingEndpoints != 5 {
		t.Errorf("counters %+v", st)
	}
	if f := st.FirstSuccess; f == nil || f.Reason != "initial" || f.KernelOps == nil || *f.KernelOps != 12 || st.LastSuccess.Reason != "drift" {
		t.Errorf("first success %+v, last %+v; want the initial sync's 12 operations, then drift", f, st.LastSuccess)
	}
	if len(st.Services) != 1 {
		t.Fatalf("services %+v", st.Services)
	}
	s := st.Services[0]
	if s.Objects != -1 {
		t.Errorf("objects %d without a counter, want -1", s.Objects)
	}
	r.CountObjects(func(fs *model.FamilySnapshot, _ model.NodeInfo) map[model.PortID]int {
		out := map[model.PortID]int{}
		for _, p := range fs.Ports {
			out[p.ID] = 7
		}
		return out
	})
	st = r.State(at.Add(3 * time.Second))
	s = st.Services[0]
	if s.Objects != 7 {
		t.Errorf("objects %d, want the counter's 7", s.Objects)
	}
	if s.Service != "ns/web:http" || strings.Join(s.Frontends, ",") != "198.18.130.1:80,NodePort 30080" ||
		s.ClusterEndpoints != 1 || s.LocalEndpoints != 1 || s.Policies != "ETP=Local" || len(s.Endpoints) != 2 ||
		s.Endpoints[1].State != "serving-terminating" || !s.Endpoints[0].Local {
		t.Errorf("service %+v", s)
	}
	var b strings.Builder
	if err := WriteTable(&b, st); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"node node1, nftables mode (IPv4)", "full (drift)", "syncs 3 (failed 1, drift repairs 1)",
		"ns/web:http", "198.18.17.10:8080* 198.18.18.10:8080(serving-terminating)", "  7  ", "OBJECTS", "ETP=Local"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}

func TestHandlerAndClient(t *testing.T) {
	r := NewRecorder("node1", "nftables", []model.Family{model.IPv4}, func(snap *model.Snapshot, req explain.Request) (*explain.Answer, error) {
		return explain.Explain(explain.Input{Snapshot: snap, Mode: "nftables"}, req)
	})
	srv := httptest.NewServer(r.Handler())
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	ctx := context.Background()
	req := explain.Request{From: netip.MustParseAddr("198.18.100.1"), To: netip.MustParseAddrPort("198.18.130.1:80"), Protocol: model.TCP}
	if _, err := Explain(ctx, addr, req); err == nil || !strings.Contains(err.Error(), "no snapshot") {
		t.Errorf("explain before a sync: %v", err)
	}
	r.Synced(Sync{Time: time.Now(), Full: true}, snapshot(t))
	st, err := Fetch(ctx, addr)
	if err != nil || len(st.Services) != 1 {
		t.Fatalf("fetch: %v %+v", err, st)
	}
	a, err := Explain(ctx, addr, req)
	if err != nil || a.Verdict != explain.Forward || len(a.Endpoints) != 1 {
		t.Errorf("explain: %v %+v", err, a)
	}
}

func TestServerLoopbackOnly(t *testing.T) {
	s := &Server{Addr: "0.0.0.0:10259", Recorder: NewRecorder("n", "nftables", nil, nil)}
	if err := s.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "loopback") {
		t.Errorf("non-loopback address: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- (&Server{Addr: addr, Recorder: NewRecorder("n", "nftables", nil, nil)}).Run(ctx) }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := Fetch(context.Background(), addr); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("run: %v", err)
	}
}
