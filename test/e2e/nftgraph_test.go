//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// nftGraph is one network namespace's nftables ruleset (from
// `nft -j list ruleset`) as objects and the references between them, so a
// test can tell which chains, sets and maps can still affect a packet:
// those reachable from a base chain through jumps, gotos, set lookups and
// the verdicts of map elements. Anything else is inert.
type nftGraph struct {
	objects map[string]*nftObject // by "family table kind name"
}

// nftObject is a chain (with its rules), a set or a map (with its elements).
type nftObject struct {
	family, table, kind, name string
	base                      bool              // a chain with a hook
	body                      []json.RawMessage // rules of a chain, elements of a set or map
}

func (o *nftObject) key() string { return nftKey(o.family, o.table, o.kind, o.name) }

func (o *nftObject) String() string {
	return fmt.Sprintf("%s %s %s %s", o.kind, o.family, o.table, o.name)
}

func nftKey(family, table, kind, name string) string {
	if kind == "map" {
		kind = "set" // one namespace: a rule's @name may be either
	}
	return family + " " + table + " " + kind + " " + name
}

// parseNFTGraph reads the output of `nft -j list ruleset`.
func parseNFTGraph(out string) (*nftGraph, error) {
	var doc struct {
		Nftables []map[string]json.RawMessage `json:"nftables"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		return nil, fmt.Errorf("parsing nft -j output: %w", err)
	}
	g := &nftGraph{objects: map[string]*nftObject{}}
	type head struct {
		Family string            `json:"family"`
		Table  string            `json:"table"`
		Name   string            `json:"name"`
		Chain  string            `json:"chain"`
		Hook   string            `json:"hook"`
		Elem   []json.RawMessage `json:"elem"`
		Expr   json.RawMessage   `json:"expr"`
	}
	var rules []head
	for _, item := range doc.Nftables {
		for kind, raw := range item {
			if kind != "chain" && kind != "set" && kind != "map" && kind != "rule" {
				continue
			}
			var h head
			if err := json.Unmarshal(raw, &h); err != nil {
				return nil, fmt.Errorf("parsing nft %s: %w", kind, err)
			}
			if kind == "rule" {
				rules = append(rules, h)
				continue
			}
			o := &nftObject{family: h.Family, table: h.Table, kind: kind, name: h.Name, base: h.Hook != "", body: h.Elem}
			g.objects[o.key()] = o
		}
	}
	for _, r := range rules {
		if c := g.objects[nftKey(r.Family, r.Table, "chain", r.Chain)]; c != nil {
			c.body = append(c.body, r.Expr)
		}
	}
	return g, nil
}

// refs are the objects o refers to: jump and goto targets, and sets named
// with @ (in rules, and in the verdicts of a map's elements).
func (g *nftGraph) refs(o *nftObject) []*nftObject {
	var out []*nftObject
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if k == "jump" || k == "goto" {
					if m, ok := x.(map[string]any); ok {
						if target, ok := m["target"].(string); ok {
							if c := g.objects[nftKey(o.family, o.table, "chain", target)]; c != nil {
								out = append(out, c)
							}
						}
					}
				}
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		case string:
			if name, ok := strings.CutPrefix(v, "@"); ok {
				if s := g.objects[nftKey(o.family, o.table, "set", name)]; s != nil {
					out = append(out, s)
				}
			}
		}
	}
	for _, raw := range o.body {
		var v any
		if json.Unmarshal(raw, &v) == nil {
			walk(v)
		}
	}
	return out
}

// reachable returns the objects that can affect a packet: base chains and
// everything they refer to, transitively.
func (g *nftGraph) reachable() map[string]*nftObject {
	seen := map[string]*nftObject{}
	var visit func(o *nftObject)
	visit = func(o *nftObject) {
		if seen[o.key()] != nil {
			return
		}
		seen[o.key()] = o
		for _, r := range g.refs(o) {
			visit(r)
		}
	}
	for _, o := range g.objects {
		if o.base {
			visit(o)
		}
	}
	return seen
}

// inert returns the objects of table (either family) that nothing
// reachable refers to, sorted.
func (g *nftGraph) inert(table string) []*nftObject {
	live := g.reachable()
	var out []*nftObject
	for k, o := range g.objects {
		if o.table == table && live[k] == nil {
			out = append(out, o)
		}
	}
	slices.SortFunc(out, func(a, b *nftObject) int { return strings.Compare(a.key(), b.key()) })
	return out
}

// liveText is the JSON of every reachable object's rules or elements, one
// line per rule or element, for searching addresses in.
func (g *nftGraph) liveText() []string {
	var out []string
	for _, o := range g.reachable() {
		for _, raw := range o.body {
			out = append(out, o.String()+": "+string(raw))
		}
	}
	return out
}
