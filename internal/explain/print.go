package explain

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// WriteJSON writes the answer as one indented JSON object.
func WriteJSON(w io.Writer, a *Answer) error { return WriteJSONValue(w, a) }

// WriteJSONValue writes v as one indented JSON object, as the tools print.
func WriteJSONValue(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// WriteText writes the answer for a person: the packet, each step, the
// verdict, the endpoints with their probabilities and the ones left out.
func WriteText(w io.Writer, a *Answer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s -> %s/%s on node %s (%s mode)\n", a.From, a.To, strings.ToLower(string(a.Protocol)), a.Node, a.Mode)
	fmt.Fprintf(&b, "  source:     %s: %s\n", sourceWords(a.Source), a.SourceReason)
	if a.Service != "" {
		fmt.Fprintf(&b, "  service:    %s (%s)\n", a.Service, a.Frontend)
	}
	for _, s := range a.Steps {
		fmt.Fprintf(&b, "  %-11s %s\n", s.Policy+":", s.Result)
	}
	fmt.Fprintf(&b, "  verdict:    %s: %s\n", strings.ToUpper(string(a.Verdict)), a.Reason)
	if len(a.Endpoints) > 0 {
		b.WriteString("  endpoints:\n")
		tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
		for _, c := range a.Endpoints {
			where := "another node"
			if c.Local {
				where = "this node"
			}
			fmt.Fprintf(tw, "    %s\t%.1f%%\t%s\t%s\n", c.Endpoint, 100*c.Probability, c.State, where)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(a.Excluded) > 0 {
		b.WriteString("  left out:\n")
		for _, x := range a.Excluded {
			fmt.Fprintf(&b, "    %s: %s\n", x.Endpoint, x.Reason)
		}
	}
	if a.Verdict == Forward {
		m := "no"
		if a.Masquerade {
			m = "yes"
		}
		fmt.Fprintf(&b, "  masquerade: %s: %s\n", m, a.MasqueradeReason)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
