package conntrack

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"testing"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/objects"
)

func ep(addr string, serving bool) *model.Endpoint {
	ap := netip.MustParseAddrPort(addr)
	return &model.Endpoint{IP: ap.Addr(), Port: ap.Port(), Ready: serving, Serving: serving, Terminating: !serving}
}

// svc builds a service port; name is also the port's Service name.
func svc(name string, proto model.Protocol, clusterIP string, port, nodePort uint16, eps ...*model.Endpoint) *model.ServicePort {
	return &model.ServicePort{
		ID:        model.PortID{Namespace: "ns", Name: name, Protocol: proto},
		Family:    model.IPv4,
		Protocol:  proto,
		Port:      port,
		NodePort:  nodePort,
		ClusterIP: netip.MustParseAddr(clusterIP),
		Endpoints: eps,
	}
}

func fam(ports ...*model.ServicePort) *model.FamilySnapshot {
	f := &model.FamilySnapshot{Family: model.IPv4}
	f.Ports = append(f.Ports, ports...)
	return f
}

func flow(proto model.Protocol, dst, replySrc string) Flow {
	return Flow{Protocol: proto, OrigDst: netip.MustParseAddrPort(dst), ReplySrc: netip.MustParseAddrPort(replySrc)}
}

func TestPlanStale(t *testing.T) {
	dns := svc("dns", model.UDP, "198.18.0.10", 53, 0, ep("198.19.1.1:53", true), ep("198.19.1.2:53", false))
	dnsTCP := svc("dns", model.TCP, "198.18.0.10", 53, 0, ep("198.19.1.1:53", true))
	np := svc("np", model.UDP, "198.18.0.20", 80, 30080, ep("198.19.2.1:8080", true))
	np.ExternalIPs = []netip.Addr{netip.MustParseAddr("198.18.100.1")}
	np.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("198.18.200.1")}
	sctp := svc("sctp", model.SCTP, "198.18.0.30", 9000, 0, ep("198.19.3.1:9000", true))
	none := svc("none", model.UDP, "198.18.0.40", 30080, 0)
	next := fam(dns, dnsTCP, np, sctp, none)

	tests := []struct {
		name string
		f    Flow
		want bool
	}{
		{"DNATed to a serving endpoint", flow(model.UDP, "198.18.0.10:53", "198.19.1.1:53"), false},
		{"DNATed to a gone endpoint", flow(model.UDP, "198.18.0.10:53", "198.19.9.9:53"), true},
		{"DNATed to a terminating, not serving endpoint", flow(model.UDP, "198.18.0.10:53", "198.19.1.2:53"), true},
		{"not DNATed (created while no endpoint)", flow(model.UDP, "198.18.0.10:53", "198.18.0.10:53"), true},
		{"same IP, other port", flow(model.UDP, "198.18.0.10:54", "198.19.9.9:54"), false},
		{"TCP DNATed to a gone endpoint is left alone", flow(model.TCP, "198.18.0.10:53", "198.19.9.9:53"), false},
		{"TCP established, not DNATed, is left alone", flow(model.TCP, "198.18.0.10:53", "198.18.0.10:53"), false},
		{"TCP SYN_SENT not DNATed (before the rules) is cleaned", Flow{model.TCP, netip.MustParseAddrPort("198.18.0.10:53"), netip.MustParseAddrPort("198.18.0.10:53"), true}, true},
		{"TCP SYN_SENT DNATed is left alone", Flow{model.TCP, netip.MustParseAddrPort("198.18.0.10:53"), netip.MustParseAddrPort("198.19.1.1:53"), true}, false},
		{"external IP", flow(model.UDP, "198.18.100.1:80", "198.19.9.9:8080"), true},
		{"load-balancer IP", flow(model.UDP, "198.18.200.1:80", "198.19.9.9:8080"), true},
		{"load-balancer IP, serving", flow(model.UDP, "198.18.200.1:80", "198.19.2.1:8080"), false},
		{"node port on any address", flow(model.UDP, "198.18.50.5:30080", "198.19.9.9:8080"), true},
		{"node port, serving", flow(model.UDP, "198.18.50.5:30080", "198.19.2.1:8080"), false},
		{"node port number on a Service IP judged by that Service", flow(model.UDP, "198.18.0.40:30080", "198.18.0.40:30080"), false},
		{"SCTP too", flow(model.SCTP, "198.18.0.30:9000", "198.19.9.9:9000"), true},
		{"SCTP serving", flow(model.SCTP, "198.18.0.30:9000", "198.19.3.1:9000"), false},
		{"service without serving endpoints is left alone", flow(model.UDP, "198.18.0.40:30080", "198.19.9.9:1"), false},
		{"unknown destination", flow(model.UDP, "198.18.9.9:53", "198.19.9.9:53"), false},
		{"IPv4-mapped addresses", Flow{model.UDP, netip.MustParseAddrPort("[::ffff:198.18.0.10]:53"), netip.MustParseAddrPort("[::ffff:198.19.9.9]:53"), false}, true},
	}
	plan := NewPlan(nil, next, false)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := plan.Stale(tc.f); got != tc.want {
				t.Errorf("Stale(%+v) = %v, want %v", tc.f, got, tc.want)
			}
		})
	}
}

// Flows that cannot be stale (established TCP, other protocols) are judged
// without building the frontend index; the first that could be builds it.
func TestPlanIndexesOnFirstCandidate(t *testing.T) {
	tcp := svc("web", model.TCP, "198.18.0.10", 80, 30080, ep("198.19.1.1:8080", true))
	udp := svc("dns", model.UDP, "198.18.0.11", 53, 0, ep("198.19.1.2:53", true))
	plan := NewPlan(nil, fam(udp, tcp), true)
	if plan.Empty() {
		t.Fatal("a full plan with serving frontends is empty")
	}
	for _, f := range []Flow{
		flow(model.TCP, "198.18.0.10:80", "198.19.1.1:8080"),
		{Protocol: model.TCP, OrigDst: netip.MustParseAddrPort("198.18.0.10:80"), ReplySrc: netip.MustParseAddrPort("198.19.1.1:8080"), SynSent: true},
		flow(model.TCP, "198.18.0.10:80", "198.18.0.10:80"),
		{Protocol: "ICMP", OrigDst: netip.MustParseAddrPort("198.18.0.10:0"), ReplySrc: netip.MustParseAddrPort("198.18.0.10:0")},
	} {
		if plan.Stale(f) {
			t.Errorf("Stale(%+v) = true", f)
		}
	}
	if plan.indexed {
		t.Errorf("the index was built for flows that cannot be stale")
	}
	if !plan.Stale(flow(model.UDP, "198.18.0.11:53", "198.19.9.9:53")) || !plan.indexed {
		t.Errorf("a stale UDP flow: not found, or found without the index (indexed %v)", plan.indexed)
	}
	if !plan.Stale(Flow{Protocol: model.TCP, OrigDst: netip.MustParseAddrPort("198.18.50.1:30080"), ReplySrc: netip.MustParseAddrPort("198.18.50.1:30080"), SynSent: true}) {
		t.Errorf("an un-DNATed SYN to the node port is not stale")
	}
	if p := NewPlan(fam(udp, tcp), fam(udp, tcp), false); !p.Empty() {
		t.Errorf("a partial plan between equal snapshots is not empty")
	}
}

func TestPlanPartial(t *testing.T) {
	a1 := svc("a", model.UDP, "198.18.0.1", 53, 0, ep("198.19.0.1:53", true))
	b := svc("b", model.UDP, "198.18.0.2", 53, 0, ep("198.19.0.2:53", true))
	staleA := flow(model.UDP, "198.18.0.1:53", "198.19.0.99:53")
	staleB := flow(model.UDP, "198.18.0.2:53", "198.19.0.99:53")

	a2 := *a1 // a copy with equal content: not a change
	a3 := *a1
	a3.Endpoints = []*model.Endpoint{ep("198.19.0.3:53", true)}
	a4 := *a1
	a4.ExternalIPs = []netip.Addr{netip.MustParseAddr("198.18.100.1")}
	a5 := *a1
	a5.Endpoints = []*model.Endpoint{ep("198.19.0.1:53", true), ep("198.19.0.3:53", true)}
	noEP := *a1
	noEP.Endpoints = nil
	b2 := *b
	b2.Endpoints = []*model.Endpoint{ep("198.19.0.4:53", true)}

	tests := []struct {
		name       string
		prev, next *model.FamilySnapshot
		full       bool
		empty      bool
		wantA      bool
		wantB      bool
	}{
		{"first sync: everything", nil, fam(a1, b), false, false, true, true},
		{"shared ports: nothing to do", fam(a1, b), fam(a1, b), false, true, false, false},
		{"equal copy: nothing to do", fam(a1, b), fam(&a2, b), false, true, false, false},
		{"full sync cleans unchanged ports", fam(a1, b), fam(a1, b), true, false, true, true},
		{"endpoint replaced", fam(a1, b), fam(&a3, b), false, false, true, false},
		{"endpoint added", fam(a1, b), fam(&a5, b), false, false, true, false},
		{"frontend added", fam(a1, b), fam(&a4, b), false, false, true, false},
		{"endpoints after none", fam(&noEP, b), fam(a1, b), false, false, true, false},
		{"new service", fam(b), fam(a1, b), false, false, true, false},
		{"service lost its endpoints: left alone", fam(a1, b), fam(&noEP, b), false, true, false, false},
		{"one removed, the next changed", fam(a1, b), fam(&b2), false, false, false, true},
		{"one removed, the next unchanged", fam(a1, b), fam(b), false, true, false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			plans := map[string]*Plan{"NewPlan": NewPlan(tc.prev, tc.next, tc.full)}
			if !tc.full {
				// Every Service listed as changed: the same plan.
				plans["NewPartialPlan"] = NewPartialPlan(tc.prev, tc.next, serviceKeys(tc.prev, tc.next))
			}
			for name, p := range plans {
				if p.Empty() != tc.empty {
					t.Errorf("%s: Empty() = %v, want %v", name, p.Empty(), tc.empty)
				}
				if got := p.Stale(staleA); got != tc.wantA {
					t.Errorf("%s: Stale(flow to a) = %v, want %v", name, got, tc.wantA)
				}
				if got := p.Stale(staleB); got != tc.wantB {
					t.Errorf("%s: Stale(flow to b) = %v, want %v", name, got, tc.wantB)
				}
			}
		})
	}
	// A partial plan compares the listed Services only: b's change is not
	// looked at when only a is listed, a's when only b is.
	if p := NewPartialPlan(fam(a1, b), fam(&a3, &b2), []objects.Key{{Namespace: "ns", Name: "a"}}); !p.Stale(staleA) || p.Stale(staleB) {
		t.Errorf("partial plan of a: Stale(a) = %v, Stale(b) = %v, want true, false", p.Stale(staleA), p.Stale(staleB))
	}
	if p := NewPartialPlan(fam(a1, b), fam(&a3, &b2), []objects.Key{{Namespace: "ns", Name: "b"}}); p.Stale(staleA) || !p.Stale(staleB) {
		t.Errorf("partial plan of b: Stale(a) = %v, Stale(b) = %v, want false, true", p.Stale(staleA), p.Stale(staleB))
	}
	if p := NewPartialPlan(fam(a1, b), fam(&a3, &b2), nil); !p.Empty() {
		t.Errorf("partial plan of no Service is not empty")
	}
}

// serviceKeys lists the Services of the ports in fams, sorted, each once.
func serviceKeys(fams ...*model.FamilySnapshot) []objects.Key {
	seen := map[objects.Key]bool{}
	for _, f := range fams {
		if f == nil {
			continue
		}
		for _, p := range f.Ports {
			seen[p.ID.Service()] = true
		}
	}
	return slices.SortedFunc(maps.Keys(seen), objects.Key.Compare)
}

func TestCountCPUList(t *testing.T) {
	for in, want := range map[string]int{"0": 1, "0-1": 2, "0-3,8,10-11": 7, "": 0, "x": 0, "3-1": 0} {
		if got := countCPUList(in); got != want {
			t.Errorf("countCPUList(%q) = %d, want %d", in, got, want)
		}
	}
}

// TestPlanTCPBeforeRules: an un-DNATed SYN_SENT flow is cleaned only when its
// TCP frontend just became reachable, never on an unrelated partial sync.
func TestPlanTCPBeforeRules(t *testing.T) {
	web := svc("web", model.TCP, "198.18.0.80", 80, 0, ep("198.19.8.1:8080", true))
	noEP := *web
	noEP.Endpoints = nil
	moved := *web
	moved.Endpoints = []*model.Endpoint{ep("198.19.8.2:8080", true)}
	synSent := Flow{model.TCP, netip.MustParseAddrPort("198.18.0.80:80"), netip.MustParseAddrPort("198.18.0.80:80"), true}
	for _, tc := range []struct {
		name       string
		prev, next *model.FamilySnapshot
		want       bool
	}{
		{"new Service", nil, fam(web), true},
		{"first serving endpoint", fam(&noEP), fam(web), true},
		{"unchanged", fam(web), fam(web), false},
		{"endpoint moved, was reachable", fam(web), fam(&moved), false},
		{"no serving endpoint yet", nil, fam(&noEP), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := NewPlan(tc.prev, tc.next, false).Stale(synSent); got != tc.want {
				t.Errorf("Stale = %v, want %v", got, tc.want)
			}
			if got := NewPartialPlan(tc.prev, tc.next, serviceKeys(tc.prev, tc.next)).Stale(synSent); got != tc.want {
				t.Errorf("partial plan: Stale = %v, want %v", got, tc.want)
			}
			if got := NewSYNPlan(tc.prev, tc.next, false).Stale(synSent); got != tc.want {
				t.Errorf("SYN plan: Stale = %v, want %v", got, tc.want)
			}
			if got := NewPartialSYNPlan(tc.prev, tc.next, serviceKeys(tc.prev, tc.next)).Stale(synSent); got != tc.want {
				t.Errorf("partial SYN plan: Stale = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestSYNPlanJudgesSYNsOnly: a SYN plan covers the TCP part of the plan
// and nothing else, whatever the table shows it (a kernel that ignores the
// dump filter shows everything).
func TestSYNPlanJudgesSYNsOnly(t *testing.T) {
	dnsOld, dnsNew, web, staleUDP, syn := synCase()
	dnatedSYN := synFlow("198.18.0.80:80", "198.19.8.1:8080")

	for _, full := range []bool{false, true} {
		t.Run(fmt.Sprintf("full=%v", full), func(t *testing.T) {
			// Both Services changed: the full plan cleans both
			// protocols, the SYN plan TCP only.
			plan := NewPlan(fam(dnsOld), fam(dnsNew, web), full)
			synPlan := NewSYNPlan(fam(dnsOld), fam(dnsNew, web), full)
			if !plan.Stale(staleUDP) || !plan.Stale(syn) {
				t.Fatalf("plan: the stale UDP flow and the un-DNATed SYN must both be stale")
			}
			if synPlan.Stale(staleUDP) || !synPlan.Stale(syn) || synPlan.Stale(dnatedSYN) {
				t.Errorf("SYN plan: Stale(UDP, SYN, DNATed SYN) = %v, %v, %v; want false, true, false",
					synPlan.Stale(staleUDP), synPlan.Stale(syn), synPlan.Stale(dnatedSYN))
			}
			if got, want := synPlan.Scopes(), []Scope{{Protocol: model.TCP, Unreplied: true}}; !slices.Equal(got, want) {
				t.Errorf("SYN plan scopes = %v, want %v", got, want)
			}
		})
	}

	// Only the UDP Service changed: nothing for a SYN plan to do.
	if p := NewSYNPlan(fam(dnsOld, web), fam(dnsNew, web), false); !p.Empty() || len(p.Scopes()) != 0 {
		t.Errorf("SYN plan of a UDP-only change: empty=%v scopes=%v, want empty", p.Empty(), p.Scopes())
	}
}

// synCase is a UDP Service whose endpoint moved and a new TCP Service
// (198.18.0.80:80, NodePort 30080), with a flow each that a plan from
// before to after finds stale: one to the UDP endpoint gone, and a SYN
// to the TCP Service that was never DNATed.
func synCase() (dnsOld, dnsNew, web *model.ServicePort, staleUDP, syn Flow) {
	dnsOld = svc("dns", model.UDP, "198.18.0.10", 53, 0, ep("198.19.1.1:53", true))
	dnsNew = svc("dns", model.UDP, "198.18.0.10", 53, 0, ep("198.19.1.2:53", true))
	web = svc("web", model.TCP, "198.18.0.80", 80, 30080, ep("198.19.8.1:8080", true))
	return dnsOld, dnsNew, web, flow(model.UDP, "198.18.0.10:53", "198.19.1.1:53"), synFlow("198.18.0.80:80", "198.18.0.80:80")
}

// synFlow is an unanswered TCP flow.
func synFlow(dst, replySrc string) Flow {
	return Flow{model.TCP, netip.MustParseAddrPort(dst), netip.MustParseAddrPort(replySrc), true}
}
