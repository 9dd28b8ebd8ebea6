package main

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/yaml"
)

// TestExamplesDecode checks that every document in examples/*.yaml is a
// well-formed Node, Service or EndpointSlice (strict: no unknown fields).
func TestExamplesDecode(t *testing.T) {
	files, err := filepath.Glob("../../examples/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no examples: %v", err)
	}
	for _, f := range files {
		for i, doc := range documents(t, f) {
			var meta struct{ Kind string }
			if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
				t.Fatalf("%s doc %d: %v", f, i, err)
			}
			var obj any
			switch meta.Kind {
			case "Node":
				obj = &v1.Node{}
			case "Service":
				obj = &v1.Service{}
			case "EndpointSlice":
				obj = &discoveryv1.EndpointSlice{}
			default:
				t.Fatalf("%s doc %d: unexpected kind %q", f, i, meta.Kind)
			}
			if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
				t.Errorf("%s doc %d (%s): %v", f, i, meta.Kind, err)
			}
		}
	}
}

// TestDemoObjectsMatchSandbox checks that examples/demo.yaml's endpoints are
// the addresses netbed gives the demo's pods, and its node is the demo node.
func TestDemoObjectsMatchSandbox(t *testing.T) {
	l := sandboxLayout()
	node := l.Nodes[0]
	var want []string
	for i := range podNames {
		want = append(want, nth(node.PodCIDR4, 10+i), nth(node.PodCIDR6, 10+i))
	}
	slices.Sort(want)
	for _, doc := range documents(t, "../../examples/demo.yaml") {
		var s discoveryv1.EndpointSlice
		if err := yaml.Unmarshal([]byte(doc), &s); err != nil || s.Kind != "EndpointSlice" {
			continue
		}
		var got []string
		for _, ep := range s.Endpoints {
			got = append(got, ep.Addresses...)
			if ep.NodeName == nil || *ep.NodeName != nodeName {
				t.Errorf("slice %s: endpoint %v not on %s", s.Name, ep.Addresses, nodeName)
			}
		}
		for _, a := range got {
			if !slices.Contains(want, a) {
				t.Errorf("slice %s: %s is not a demo pod address %v", s.Name, a, want)
			}
		}
	}
	text := readFile(t, "../../examples/demo.yaml")
	for _, want := range []string{"address: " + node.IP4.String(), clusterIP4.String(), `"` + clusterIP6.String() + `"`,
		"nodePort: " + strconv.Itoa(nodePort), "name: " + nodeName} {
		if !strings.Contains(text, want) {
			t.Errorf("demo.yaml does not contain %q, which the demo uses", want)
		}
	}
}

func nth(p netip.Prefix, n int) string {
	a := p.Masked().Addr()
	for range n {
		a = a.Next()
	}
	return a.String()
}

func documents(t *testing.T, path string) []string {
	var out []string
	for _, d := range strings.Split(readFile(t, path), "\n---\n") {
		if strings.TrimSpace(d) != "" {
			out = append(out, d)
		}
	}
	return out
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
