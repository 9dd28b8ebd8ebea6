package file

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"

	"github.com/kproxy/kproxy/internal/objects"
	"github.com/kproxy/kproxy/internal/source/sourcetest"
)

const (
	svcA = `apiVersion: v1
kind: Service
metadata: {name: a, namespace: ns}
spec: {clusterIP: 198.18.0.1, ports: [{port: PORT}]}
`
	svcB = `apiVersion: v1
kind: Service
metadata: {name: b, namespace: ns}
spec: {clusterIP: 198.18.0.2, ports: [{port: 80}]}
`
	sliceA = `apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: a-1, namespace: ns, labels: {kubernetes.io/service-name: a}}
addressType: IPv4
endpoints: [{addresses: [198.18.1.1]}]
`
	nodeA = `apiVersion: v1
kind: Node
metadata: {name: node-a, labels: {topology.kubernetes.io/zone: ZONE}}
`
	nodeB = `apiVersion: v1
kind: Node
metadata: {name: node-b}
`
	cidrDefault = `apiVersion: networking.k8s.io/v1
kind: ServiceCIDR
metadata: {name: kubernetes}
spec: {cidrs: [CIDRS]}
`
)

func docs(d ...string) string { return strings.Join(d, "---\n") }

// write replaces the file by renaming a new one over it, as editors do.
func write(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func startFile(t *testing.T, content string) (string, *sourcetest.Recorder) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "objects.yaml")
	write(t, path, content)
	rec := sourcetest.NewRecorder()
	s := New(path, "node-a", rec, ktesting.NewLogger(t, ktesting.NewConfig()))
	s.interval = 10 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return path, rec
}

func sorted(s []string) []string { slices.Sort(s); return s }

func TestFileSource(t *testing.T) {
	path, rec := startFile(t, docs(strings.Replace(svcA, "PORT", "80", 1), svcB, sliceA, nodeB))
	got := sorted(rec.WaitFor(t, "synced Services", "synced EndpointSlices", "synced Node", "synced ServiceCIDRs"))
	want := []string{"service ns/a", "service ns/b", "slice ns/a-1", "synced EndpointSlices", "synced Node", "synced ServiceCIDRs", "synced Services"}
	if !slices.Equal(got, want) {
		t.Fatalf("first read: %q, want %q", got, want)
	}

	steps := []struct {
		name    string
		content string
		want    []string
	}{
		{"update one, delete one, add our node", docs(strings.Replace(svcA, "PORT", "81", 1), sliceA, nodeA, nodeB),
			[]string{"node node-a", "service ns/a", "service-deleted ns/b"}},
		{"node label changes", docs(strings.Replace(svcA, "PORT", "81", 1), sliceA, strings.Replace(nodeA, "ZONE", "z2", 1)),
			[]string{"node node-a"}},
		{"malformed document deletes its object only", docs(strings.Replace(svcA, "PORT", "http", 1), sliceA, strings.Replace(nodeA, "ZONE", "z2", 1)),
			[]string{"service-deleted ns/a"}},
		{"node and slice removed, ServiceCIDR added", docs(strings.Replace(svcA, "PORT", "81", 1), strings.Replace(cidrDefault, "CIDRS", "198.18.128.0/17", 1)),
			[]string{"node-deleted", "service ns/a", "servicecidr kubernetes", "slice-deleted ns/a-1"}},
		{"ServiceCIDR grows", docs(strings.Replace(svcA, "PORT", "81", 1), strings.Replace(cidrDefault, "CIDRS", "198.18.128.0/17, fd00:0:0:ffff::/112", 1)),
			[]string{"servicecidr kubernetes"}},
		{"ServiceCIDR removed", docs(strings.Replace(svcA, "PORT", "81", 1)),
			[]string{"servicecidr-deleted kubernetes"}},
	}
	for _, st := range steps {
		write(t, path, st.content)
		got := sorted(rec.WaitFor(t, st.want...))
		time.Sleep(50 * time.Millisecond) // a few more polls: nothing else may arrive
		got = sorted(append(got, rec.Take()...))
		if !slices.Equal(got, st.want) {
			t.Errorf("%s: events %q, want %q", st.name, got, st.want)
		}
	}
	rec.Do(func(r *sourcetest.Recorder) {
		a := r.Services[objects.Key{Namespace: "ns", Name: "a"}]
		if len(r.Services) != 1 || a == nil || a.Ports[0].Port != 81 || len(r.Slices) != 0 || r.Node != nil || len(r.ServiceCIDRs) != 0 {
			t.Errorf("final state: services %v slices %v node %v serviceCIDRs %v", r.Services, r.Slices, r.Node, r.ServiceCIDRs)
		}
	})
}

func TestFileSourceKeepsStateWhenFileVanishes(t *testing.T) {
	path, rec := startFile(t, docs(strings.Replace(svcA, "PORT", "80", 1)))
	rec.WaitFor(t, "synced Services", "service ns/a")
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if ev := rec.Take(); len(ev) != 0 {
		t.Errorf("events after the file vanished: %q", ev)
	}
	// Same content written back: nothing to report.
	write(t, path, docs(strings.Replace(svcA, "PORT", "80", 1)))
	time.Sleep(50 * time.Millisecond)
	if ev := rec.Take(); len(ev) != 0 {
		t.Errorf("events after the same content came back: %q", ev)
	}
}

func TestFileSourceMissingFile(t *testing.T) {
	s := New(filepath.Join(t.TempDir(), "missing.yaml"), "node-a", sourcetest.NewRecorder(), ktesting.NewLogger(t, ktesting.NewConfig()))
	if err := s.Run(context.Background()); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Run = %v, want a not-exist error", err)
	}
}
