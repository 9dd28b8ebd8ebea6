package inspect

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kproxy/kproxy/internal/explain"
)

// client is for the loopback debug endpoint: short timeouts, no proxy.
var client = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{Proxy: nil}}

// Fetch reads the state of the kproxy whose debug endpoint is at addr.
func Fetch(ctx context.Context, addr string) (*State, error) {
	var st State
	if err := get(ctx, "http://"+addr+PathState, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// Explain asks the kproxy at addr to explain req from its live snapshot.
func Explain(ctx context.Context, addr string, req explain.Request) (*explain.Answer, error) {
	q := url.Values{"from": {req.From.String()}, "to": {req.To.String() + "/" + strings.ToLower(string(req.Protocol))}}
	var a explain.Answer
	if err := get(ctx, "http://"+addr+PathExplain+"?"+q.Encode(), &a); err != nil {
		return nil, err
	}
	return &a, nil
}

func get(ctx context.Context, u string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("kproxy debug endpoint: %w (is kproxy running with --debug-bind-address?)", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("kproxy debug endpoint: %s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	return json.Unmarshal(body, v)
}

// WriteTable writes the state as a header and one row per service port.
func WriteTable(w io.Writer, st *State) error {
	var b strings.Builder
	fmt.Fprintf(&b, "node %s, %s mode (%s)", st.Node, st.Mode, strings.Join(st.Families, ", "))
	if s := st.LastSync; s != nil {
		fmt.Fprintf(&b, "; last sync %s ago, %s, took %s", st.Now.Sub(s.Time).Round(time.Millisecond), syncKind(s), s.Duration.Round(time.Microsecond))
		if s.KernelOps != nil {
			fmt.Fprintf(&b, ", %d kernel operations", *s.KernelOps)
		}
		if s.Error != "" {
			fmt.Fprintf(&b, ", FAILED: %s", s.Error)
		}
	} else {
		b.WriteString("; no sync yet")
	}
	fmt.Fprintf(&b, "\nsyncs %d (failed %d, drift repairs %d); pending: %d Service and %d EndpointSlice changes\n\n",
		st.Syncs, st.FailedSyncs, st.DriftRepairs, st.PendingServices, st.PendingEndpoints)
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVICE\tFAMILY\tPROTO\tFRONTENDS\tENDPOINTS\tCLUSTER\tLOCAL\tOBJECTS\tPOLICIES")
	SortServices(st.Services)
	for _, s := range st.Services {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Service, s.Family, s.Protocol,
			strings.Join(s.Frontends, ", "), endpoints(s.Endpoints), count(s.ClusterEndpoints), count(s.LocalEndpoints), count(s.Objects), dash(s.Policies))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func syncKind(s *Sync) string {
	k := "partial"
	if s.Full {
		k = "full"
	}
	if s.Reason != "" {
		k += " (" + s.Reason + ")"
	}
	return k
}

func endpoints(eps []Endpoint) string {
	if len(eps) == 0 {
		return "-"
	}
	parts := make([]string, len(eps))
	for i, e := range eps {
		parts[i] = e.Address
		if e.State != "ready" {
			parts[i] += "(" + e.State + ")"
		}
		if e.Local {
			parts[i] += "*"
		}
	}
	return strings.Join(parts, " ")
}

func count(n int) string {
	if n < 0 {
		return "-"
	}
	return fmt.Sprint(n)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
