package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/kproxy/kproxy/internal/dataplane/iptables"
	"github.com/kproxy/kproxy/internal/dataplane/nftables"
	"github.com/kproxy/kproxy/internal/explain"
	"github.com/kproxy/kproxy/internal/health"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/trace"
)

// ErrDisagree is returned when explain --verify found the kernel doing
// something else than kproxy's rules mean to do; the report is written.
// kproxy exits 3.
var ErrDisagree = errors.New("explain --verify: the kernel and kproxy's rules differ")

// verifier is a dataplane that can trace a packet through the rules it
// renders and through the kernel's.
type verifier interface {
	Verify(ctx context.Context, snap *model.Snapshot, pkt trace.Packet, isLocal func(netip.Addr) bool) (trace.Verification, error)
}

// VerifiedAnswer is what explain --verify -o json prints: the answer's
// fields and the report under "verify".
type VerifiedAnswer struct {
	*explain.Answer
	Verify *Report `json:"verify"`
}

// Report is what explain --verify adds to the answer.
type Report struct {
	Mode   string `json:"mode"`
	Model  string `json:"model"`
	Kernel string `json:"kernel"`
	// KernelError says why the kernel's rules could not be traced.
	KernelError string   `json:"kernelError,omitempty"`
	Notes       []string `json:"notes,omitempty"`
	Agree       bool     `json:"agree"`
}

// verify traces the request's packet through the rules this node's
// kernel holds and compares with kproxy's rules for the same snapshot and
// with the model's answer a; it also looks for other proxies' rules.
func (d *daemon) verify(ctx context.Context, snap *model.Snapshot, req explain.Request, a explain.Answer) (Report, error) {
	r := Report{Mode: d.mode}
	vf, ok := d.dp.(verifier)
	if !ok {
		return r, fmt.Errorf("%w: --verify reads nftables and iptables rules; %s mode is not supported", ErrExplain, d.mode)
	}
	d.handServiceCIDRs(ctx, snap) // as the running daemon hands them before a sync
	local, err := health.InterfaceAddrs()
	if err != nil {
		return r, err
	}
	isLocal := func(x netip.Addr) bool { return x.IsLoopback() || slices.Contains(local, x) }
	pkt := trace.Packet{Src: req.From, Dst: req.To.Addr(), DPort: req.To.Port(), Proto: strings.ToLower(string(req.Protocol))}
	if a.Source == explain.SourceNode || isLocal(req.From) {
		pkt.FromHost = true
	} else {
		pkt.Iif = inputInterface(req.From)
	}
	v, err := vf.Verify(ctx, snap, pkt, isLocal)
	if err != nil {
		return r, err
	}
	if v.KernelErr == nil {
		v.Notes = append(v.Notes, endpointNotes(v.Model, v.Kernel)...)
	}
	v.Notes = append(v.Notes, answerNotes(a, v.Model)...)
	v.Notes = append(v.Notes, otherProxies(ctx, d.mode, pkt, isLocal)...)
	r.Model, r.Kernel, r.Notes, r.Agree = resultText(v.Model), resultText(v.Kernel), v.Notes, v.Agree()
	if v.KernelErr != nil {
		r.Kernel, r.KernelError = "unknown", v.KernelErr.Error()
	}
	return r, nil
}

func resultText(r trace.Result) string {
	s := r.Verdict
	if len(r.DNAT) > 0 {
		s += ", DNAT to " + strings.Join(r.DNAT, " ")
	}
	if r.Masq {
		s += ", masqueraded"
	}
	return s
}

// endpointNotes names the endpoints the kernel sends to that kproxy's
// rules do not (a stale endpoint), and those it no longer sends to.
func endpointNotes(model, kernel trace.Result) []string {
	var out []string
	for _, e := range kernel.DNAT {
		if !slices.Contains(model.DNAT, e) {
			out = append(out, "the kernel still sends to "+e+", which is not an endpoint in kproxy's rules")
		}
	}
	for _, e := range model.DNAT {
		if !slices.Contains(kernel.DNAT, e) {
			out = append(out, "the kernel does not send to "+e+", an endpoint in kproxy's rules")
		}
	}
	return out
}

// answerNotes compares the model's answer with the trace of kproxy's own
// rules: they come from the same snapshot, so a difference is kproxy's
// bug, reported as such.
func answerNotes(a explain.Answer, m trace.Result) []string {
	var want []string
	verdict := "accept"
	switch a.Verdict {
	case explain.Forward:
		for _, c := range a.Endpoints {
			if c.Probability > 0 {
				want = append(want, c.Endpoint.String())
			}
		}
	case explain.Reject:
		verdict = "reject"
	case explain.Drop:
		verdict = "drop"
	}
	slices.Sort(want)
	if verdict != m.Verdict || !slices.Equal(want, m.DNAT) {
		return []string{fmt.Sprintf("the model answers %s %v but kproxy's rules give %s %v (a kproxy bug: please report it)", verdict, want, m.Verdict, m.DNAT)}
	}
	return nil
}

// otherProxies reports rules of another proxy mode on the node: upstream
// kube-proxy's (or kproxy's) iptables chains while kproxy runs nftables
// mode, a kube-proxy nftables table while it runs iptables mode, and IPVS
// mode's dummy interface. Where the rules can be traced, the note says
// what they do to the packet.
func otherProxies(ctx context.Context, mode string, pkt trace.Packet, isLocal func(netip.Addr) bool) []string {
	var out []string
	fam := model.FamilyOf(pkt.Dst)
	if mode == ModeNFTables {
		base := "iptables"
		if fam == model.IPv6 {
			base = "ip6tables"
		}
		for _, backend := range []string{"nft", "legacy"} {
			tool := base + "-" + backend + "-save"
			saved, err := exec.CommandContext(ctx, tool, "-t", "nat").Output()
			if err != nil || !strings.Contains(string(saved), ":KUBE-SERVICES ") {
				continue
			}
			note := fmt.Sprintf("stale iptables rules of another proxy: KUBE-SERVICES in the nat table (%s)", tool)
			if filter, err := exec.CommandContext(ctx, tool, "-t", "filter").Output(); err == nil {
				saved = append(saved, filter...)
			}
			res, err := iptables.TraceSaved(string(saved), "KUBE-", pkt, isLocal)
			switch {
			case err != nil:
				note += fmt.Sprintf("; cannot trace them (%v)", err)
			case len(res.DNAT) > 0:
				note += "; they DNAT this packet to " + strings.Join(res.DNAT, " ")
			case res.Verdict != "accept":
				note += "; they " + res.Verdict + " this packet"
			default:
				note += "; they do not change this packet"
			}
			out = append(out, note)
		}
	}
	if mode == ModeIPTables {
		if n, err := nftables.TableChains(fam, nftables.DefaultTableName); err == nil && n > 0 {
			out = append(out, fmt.Sprintf("stale nftables table %s %s of another proxy (%d chains)", nftFamilyName(fam), nftables.DefaultTableName, n))
		}
	}
	if _, err := net.InterfaceByName("kube-ipvs0"); err == nil && mode != ModeIPVS {
		out = append(out, "kube-ipvs0, IPVS mode's interface, is still on this node")
	}
	return out
}

func nftFamilyName(f model.Family) string {
	if f == model.IPv6 {
		return "ip6"
	}
	return "ip"
}

// inputInterface is the interface a packet from src comes in on: the one
// of the route back to it ("" when there is none).
func inputInterface(src netip.Addr) string {
	routes, err := netlink.RouteGet(src.AsSlice())
	if err != nil || len(routes) == 0 {
		return ""
	}
	link, err := netlink.LinkByIndex(routes[0].LinkIndex)
	if err != nil {
		return ""
	}
	return link.Attrs().Name
}

// writeReport writes the verify report after the answer's text.
func writeReport(w io.Writer, r Report) error {
	var b strings.Builder
	fmt.Fprintf(&b, "\nKernel check (%s rules read back on this node):\n", r.Mode)
	fmt.Fprintf(&b, "  kproxy's rules: %s\n", r.Model)
	fmt.Fprintf(&b, "  kernel's rules: %s\n", r.Kernel)
	if r.KernelError != "" {
		fmt.Fprintf(&b, "  cannot trace the kernel's rules: %s\n", r.KernelError)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "  - %s\n", n)
	}
	if r.Agree {
		b.WriteString("  The kernel agrees.\n")
	} else {
		b.WriteString("  The kernel DIFFERS.\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}
