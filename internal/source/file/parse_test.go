package file

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/internal/objects"
)

const good = `# a comment before the first document
apiVersion: v1
kind: Service
metadata: {name: web, labels: {version: 1}}
spec:
  clusterIP: 198.18.0.10
  ports: [{name: http, port: 80, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: default
  resourceVersion: "42"
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- addresses: [198.18.1.1]
  conditions: {ready: true}
  nodeName: node-a
--- # comments after separators are fine
---
apiVersion: v1
kind: Node
metadata: {name: node-a, labels: {topology.kubernetes.io/zone: z1}}
spec: {podCIDRs: [198.18.64.0/24]}
`

func TestParseGood(t *testing.T) {
	objs, problems := Parse([]byte(good))
	if len(problems) != 0 {
		t.Fatalf("problems: %v", problems)
	}
	if len(objs.Services) != 1 || len(objs.Slices) != 1 || len(objs.Nodes) != 1 {
		t.Fatalf("objects: %+v", objs)
	}
	svc := objs.Services[0]
	if svc.Key() != (objects.Key{Namespace: "default", Name: "web"}) || svc.Ports[0].Port != 80 || svc.ClusterIPs[0] != "198.18.0.10" {
		t.Errorf("service = %+v", svc)
	}
	es := objs.Slices[0]
	if es.ServiceKey() != svc.Key() || es.ResourceVersion != "" || es.Endpoints[0].Ready != objects.CondTrue {
		t.Errorf("slice = %+v", es)
	}
	if objs.Nodes[0].Zone() != "z1" || objs.Nodes[0].PodCIDRs[0] != "198.18.64.0/24" {
		t.Errorf("node = %+v", objs.Nodes[0])
	}
}

func TestParseList(t *testing.T) {
	const list = `apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: Service, metadata: {name: a, namespace: ns}, spec: {clusterIP: 198.18.0.1}}
- {apiVersion: v1, kind: Service, metadata: {name: b, namespace: ns}, spec: {clusterIP: 198.18.0.2, portz: []}}
- {apiVersion: v1, kind: ConfigMap, metadata: {name: c}}
`
	objs, problems := Parse([]byte(list))
	if len(objs.Services) != 1 || objs.Services[0].Name != "a" {
		t.Errorf("services = %+v", objs.Services)
	}
	want := []string{
		`document 1 (line 1, item 2, Service ns/b): unknown field "spec.portz"`,
		`document 1 (line 1, item 3, ConfigMap c): kind: "ConfigMap" is not supported`,
	}
	checkProblems(t, problems, want)
}

func TestParseProblems(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		want string
	}{
		{"wrong type", "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {ports: [{port: http}]}",
			`document 2 (line 9, Service default/a): json: cannot unmarshal string into Go struct field ServicePort.spec.ports.port of type int32`},
		{"unknown field", "apiVersion: v1\nkind: Service\nmetadata: {name: a, namespace: ns}\nspec: {clusterIp: 198.18.0.1}",
			`document 2 (line 9, Service ns/a): unknown field "spec.clusterIp"`},
		{"duplicate field", "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {clusterIP: 198.18.0.1}\nspec: {}",
			`document 2 (line 9, Service default/a): `},
		{"bad yaml", "kind: [", `document 2 (line 9): not a Kubernetes object: `},
		{"no kind", "apiVersion: v1\nmetadata: {name: a}", `document 2 (line 9): kind: missing`},
		{"old api version", "apiVersion: discovery.k8s.io/v1beta1\nkind: EndpointSlice\nmetadata: {name: s}",
			`document 2 (line 9, EndpointSlice default/s): apiVersion: "discovery.k8s.io/v1beta1" is not supported for EndpointSlice`},
		{"no name", "apiVersion: v1\nkind: Node\nmetadata: {}", `document 2 (line 9, Node): metadata.name: missing`},
		{"servicecidr unknown field", "apiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata: {name: c}\nspec: {cidr: [198.18.128.0/17]}",
			`document 2 (line 9, ServiceCIDR c): unknown field "spec.cidr"`},
		{"servicecidr beta", "apiVersion: networking.k8s.io/v1beta1\nkind: ServiceCIDR\nmetadata: {name: c}",
			`document 2 (line 9, ServiceCIDR c): apiVersion: "networking.k8s.io/v1beta1" is not supported for ServiceCIDR`},
		{"duplicate servicecidr", "apiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata: {name: c}\n---\napiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata: {name: c}",
			`document 3 (line 13, ServiceCIDR c): duplicate ServiceCIDR c (first in document 2)`},
		{"slice without service", "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: s, namespace: ns}\naddressType: IPv4",
			`document 2 (line 9, EndpointSlice ns/s): metadata.labels: missing kubernetes.io/service-name`},
		{"duplicate object", "apiVersion: v1\nkind: Service\nmetadata: {name: ok, namespace: ns}\nspec: {clusterIP: 198.18.0.3}",
			`document 2 (line 9, Service ns/ok): duplicate Service ns/ok (first in document 1)`},
	}
	const first = "apiVersion: v1\nkind: Service\nmetadata: {name: ok, namespace: ns}\nspec: {clusterIP: 198.18.0.1}\n---\n# the second document\n\n---\n"
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			objs, problems := Parse([]byte(first + tc.doc + "\n"))
			checkProblems(t, problems, []string{tc.want})
			if len(objs.Services) != 1 || objs.Services[0].Name != "ok" || objs.Services[0].ClusterIPs[0] != "198.18.0.1" {
				t.Errorf("the good document did not load as it is: %+v", objs.Services)
			}
			var de *DocError
			if len(problems) > 0 && !errors.As(problems[0], &de) {
				t.Errorf("problem is %T, want *DocError", problems[0])
			}
		})
	}
}

func TestParseSkipsUnproxied(t *testing.T) {
	const doc = `apiVersion: v1
kind: Service
metadata: {name: headless}
spec: {clusterIP: None}
---
apiVersion: v1
kind: Service
metadata: {name: other, labels: {service.kubernetes.io/service-proxy-name: x}}
spec: {clusterIP: 198.18.0.1}
---
apiVersion: v1
kind: Service
metadata: {name: ext}
spec: {type: ExternalName, externalName: example.com}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: h, labels: {kubernetes.io/service-name: headless, service.kubernetes.io/headless: ""}}
addressType: IPv4
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: f, labels: {kubernetes.io/service-name: ext}}
addressType: FQDN
`
	objs, problems := Parse([]byte(doc))
	if len(problems) != 0 || len(objs.Services) != 0 || len(objs.Slices) != 0 {
		t.Errorf("objects %+v, problems %v", objs, problems)
	}
}

func checkProblems(t *testing.T, got []error, want []string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("problems = %q, want %d: %q", got, len(want), want)
	}
	for i := range want {
		if !strings.HasPrefix(got[i].Error(), want[i]) {
			t.Errorf("problem %d = %q, want prefix %q", i, got[i], want[i])
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(good))
	f.Add([]byte("apiVersion: v1\nkind: List\nitems: [{kind: Service}]"))
	f.Add([]byte("---\n---\nkind: [\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		objs, problems := Parse(data)
		for _, p := range problems {
			var de *DocError
			if !errors.As(p, &de) || de.Doc < 1 || de.Line < 1 {
				t.Errorf("bad problem %#v", p)
			}
		}
		for _, s := range objs.Services {
			if s.Name == "" || s.Namespace == "" || s.ResourceVersion != "" {
				t.Errorf("bad service %+v", s)
			}
		}
		for _, s := range objs.Slices {
			if s.Name == "" || s.Namespace == "" || s.ServiceName == "" {
				t.Errorf("bad slice %+v", s)
			}
		}
		for _, n := range objs.Nodes {
			if n.Name == "" {
				t.Errorf("bad node %+v", n)
			}
		}
	})
}

func TestParseServiceCIDR(t *testing.T) {
	const doc = `apiVersion: networking.k8s.io/v1
kind: ServiceCIDR
metadata: {name: kubernetes, resourceVersion: "9"}
spec: {cidrs: [198.18.128.0/17, "fd00:0:0:ffff::/112"]}
status: {conditions: [{type: Ready, status: "True", reason: "", message: "", lastTransitionTime: "2026-01-01T00:00:00Z"}]}
---
apiVersion: networking.k8s.io/v1
kind: ServiceCIDR
metadata: {name: extra, namespace: ignored}
spec: {cidrs: [198.18.200.0/24]}
`
	objs, problems := Parse([]byte(doc))
	if len(problems) != 0 {
		t.Fatalf("problems: %v", problems)
	}
	want := []objects.ServiceCIDR{
		{Name: "kubernetes", CIDRs: []string{"198.18.128.0/17", "fd00:0:0:ffff::/112"}},
		{Name: "extra", CIDRs: []string{"198.18.200.0/24"}},
	}
	if len(objs.ServiceCIDRs) != len(want) {
		t.Fatalf("ServiceCIDRs = %+v", objs.ServiceCIDRs)
	}
	for i, c := range objs.ServiceCIDRs {
		if !reflect.DeepEqual(*c, want[i]) {
			t.Errorf("ServiceCIDR %d = %+v, want %+v", i, *c, want[i])
		}
	}
}
