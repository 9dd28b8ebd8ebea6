package file

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/kproxy/kproxy/internal/objects"
)

// Objects is what one read of the file yields: the Services and
// EndpointSlices kproxy proxies, and every Node and ServiceCIDR, in file
// order.
type Objects struct {
	Services     []*objects.Service
	Slices       []*objects.EndpointSlice
	Nodes        []*objects.Node
	ServiceCIDRs []*objects.ServiceCIDR
}

// DocError is a problem with one document of the file; the document is
// skipped and the others still load.
type DocError struct {
	Doc  int // 1-based index of the document in the file
	Line int // the document's first line
	Item int // 1-based index in a kind: List document, 0 otherwise
	// Kind, Namespace and Name identify the object when they could be read.
	Kind, Namespace, Name string
	Err                   error
}

func (e *DocError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "document %d (line %d", e.Doc, e.Line)
	if e.Item > 0 {
		fmt.Fprintf(&b, ", item %d", e.Item)
	}
	if e.Kind != "" {
		b.WriteString(", " + e.Kind)
		if e.Name != "" {
			b.WriteString(" " + objects.Key{Namespace: e.Namespace, Name: e.Name}.String())
		}
	}
	fmt.Fprintf(&b, "): %v", e.Err)
	return b.String()
}

func (e *DocError) Unwrap() error { return e.Err }

// header is the part of every object read before its kind is known.
type header struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"metadata"`
}

// Parse reads a multi-document YAML file of Services, EndpointSlices, Nodes
// and ServiceCIDRs (standard Kubernetes objects: apiVersion v1,
// discovery.k8s.io/v1 and networking.k8s.io/v1; a v1 kind: List holding them
// also works). Each malformed document (bad
// YAML, wrong types, unknown or duplicate fields, missing names, unsupported
// kinds) yields a *DocError and is skipped. Services and EndpointSlices
// without a namespace get "default". Objects kproxy does not proxy (headless
// or ExternalName Services, Services with a service-proxy-name label,
// slices of headless Services or with FQDN addresses) are dropped silently,
// as the API source drops them. Resource versions are cleared: the file's
// content is what counts.
func Parse(data []byte) (Objects, []error) {
	p := &parser{seen: map[string]string{}}
	for i, d := range splitDocuments(data) {
		p.doc = &DocError{Doc: i + 1, Line: d.line}
		p.document(d.data)
	}
	return p.objs, p.problems
}

type parser struct {
	objs     Objects
	problems []error
	doc      *DocError         // the document being read
	seen     map[string]string // "Kind ns/name" -> where it was first seen
}

// fail records a problem with the current document (or List item).
func (p *parser) fail(h *header, item int, err error) {
	e := *p.doc
	e.Item, e.Err = item, err
	if h != nil {
		e.Kind, e.Namespace, e.Name = h.Kind, h.Metadata.Namespace, h.Metadata.Name
	}
	p.problems = append(p.problems, &e)
}

func (p *parser) document(data []byte) {
	var h header
	if err := yaml.Unmarshal(data, &h); err != nil {
		p.fail(nil, 0, fmt.Errorf("not a Kubernetes object: %w", cleanErr(err)))
		return
	}
	if h.Kind != "List" {
		p.object(data, &h, 0)
		return
	}
	var list struct {
		Items []json.RawMessage `json:"items"`
	}
	if err := yaml.Unmarshal(data, &list); err != nil {
		p.fail(&h, 0, fmt.Errorf("items: %w", cleanErr(err)))
		return
	}
	for i, raw := range list.Items {
		var ih header
		if err := json.Unmarshal(raw, &ih); err != nil {
			p.fail(nil, i+1, fmt.Errorf("not a Kubernetes object: %w", err))
			continue
		}
		p.object(raw, &ih, i+1)
	}
}

// object decodes one Service, EndpointSlice, Node or ServiceCIDR.
func (p *parser) object(data []byte, h *header, item int) {
	if (h.Kind == "Service" || h.Kind == "EndpointSlice") && h.Metadata.Name != "" && h.Metadata.Namespace == "" {
		h.Metadata.Namespace = "default"
	}
	var err error
	switch {
	case h.Kind == "Service" && h.APIVersion == "v1":
		err = p.service(data, h)
	case h.Kind == "EndpointSlice" && h.APIVersion == "discovery.k8s.io/v1":
		err = p.slice(data, h)
	case h.Kind == "Node" && h.APIVersion == "v1":
		err = p.node(data, h)
	case h.Kind == "ServiceCIDR" && h.APIVersion == "networking.k8s.io/v1":
		err = p.serviceCIDR(data, h)
	case h.Kind == "":
		err = errors.New("kind: missing")
	case h.Kind == "Service" || h.Kind == "EndpointSlice" || h.Kind == "Node" || h.Kind == "ServiceCIDR":
		err = fmt.Errorf("apiVersion: %q is not supported for %s", h.APIVersion, h.Kind)
	default:
		err = fmt.Errorf("kind: %q is not supported (want Service, EndpointSlice, Node or ServiceCIDR)", h.Kind)
	}
	if err != nil {
		p.fail(h, item, err)
	}
}

func (p *parser) service(data []byte, h *header) error {
	var svc corev1.Service
	if err := decode(data, &svc); err != nil {
		return err
	}
	if err := p.identify(h, &svc.ObjectMeta.Namespace, svc.Name); err != nil {
		return err
	}
	if objects.ServiceProxied(&svc) {
		s := objects.FromService(&svc)
		s.ResourceVersion = ""
		p.objs.Services = append(p.objs.Services, s)
	}
	return nil
}

func (p *parser) slice(data []byte, h *header) error {
	var es discoveryv1.EndpointSlice
	if err := decode(data, &es); err != nil {
		return err
	}
	if es.Labels[objects.LabelServiceName] == "" {
		return fmt.Errorf("metadata.labels: missing %s (the Service the slice belongs to)", objects.LabelServiceName)
	}
	if err := p.identify(h, &es.ObjectMeta.Namespace, es.Name); err != nil {
		return err
	}
	if objects.SliceProxied(&es) {
		s := objects.FromEndpointSlice(&es)
		s.ResourceVersion = ""
		p.objs.Slices = append(p.objs.Slices, s)
	}
	return nil
}

func (p *parser) node(data []byte, h *header) error {
	var n corev1.Node
	if err := decode(data, &n); err != nil {
		return err
	}
	ns := ""
	if err := p.identify(h, &ns, n.Name); err != nil {
		return err
	}
	node := objects.FromNode(&n)
	node.ResourceVersion = ""
	p.objs.Nodes = append(p.objs.Nodes, node)
	return nil
}

func (p *parser) serviceCIDR(data []byte, h *header) error {
	var c networkingv1.ServiceCIDR
	if err := decode(data, &c); err != nil {
		return err
	}
	ns := ""
	if err := p.identify(h, &ns, c.Name); err != nil {
		return err
	}
	sc := objects.FromServiceCIDR(&c)
	sc.ResourceVersion = ""
	p.objs.ServiceCIDRs = append(p.objs.ServiceCIDRs, sc)
	return nil
}

// clusterScoped names the kinds without a namespace.
func clusterScoped(kind string) bool { return kind == "Node" || kind == "ServiceCIDR" }

// identify checks the name, defaults a namespaced object's namespace
// and rejects a second object with the same kind and key.
func (p *parser) identify(h *header, namespace *string, name string) error {
	if name == "" {
		return errors.New("metadata.name: missing")
	}
	if !clusterScoped(h.Kind) && *namespace == "" {
		*namespace = "default"
		h.Metadata.Namespace = "default"
	}
	id := h.Kind + " " + objects.Key{Namespace: *namespace, Name: name}.String()
	here := fmt.Sprintf("document %d", p.doc.Doc)
	if first, ok := p.seen[id]; ok {
		return fmt.Errorf("duplicate %s (first in %s); this one is ignored", id, first)
	}
	p.seen[id] = here
	return nil
}

// decode reads data into obj, converting YAML scalars to the target types as
// kubectl does, then rejects unknown and duplicate fields, naming them.
func decode(data []byte, obj any) error {
	if err := yaml.Unmarshal(data, obj); err != nil {
		return cleanErr(err)
	}
	j, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return cleanErr(err)
	}
	scratch := newLike(obj)
	strict, _ := sigsjson.UnmarshalStrict(j, scratch, sigsjson.DisallowUnknownFields, sigsjson.DisallowDuplicateFields)
	if len(strict) > 0 {
		return errors.Join(strict...)
	}
	return nil
}

func newLike(obj any) any {
	switch obj.(type) {
	case *corev1.Service:
		return &corev1.Service{}
	case *discoveryv1.EndpointSlice:
		return &discoveryv1.EndpointSlice{}
	case *corev1.Node:
		return &corev1.Node{}
	case *networkingv1.ServiceCIDR:
		return &networkingv1.ServiceCIDR{}
	}
	return &map[string]any{}
}

// cleanErr drops the decoders' generic prefixes, keeping the part that names
// the field.
func cleanErr(err error) error {
	msg := strings.ReplaceAll(err.Error(), "\n  ", " ")
	for _, prefix := range []string{"error unmarshaling JSON: ", "while decoding JSON: ", "error converting YAML to JSON: "} {
		msg = strings.TrimPrefix(msg, prefix)
	}
	if msg == err.Error() {
		return err
	}
	return errors.New(msg)
}

type document struct {
	data []byte
	line int
}

var separator = regexp.MustCompile(`^---(\s.*)?$`)

// splitDocuments cuts data at "---" lines and drops documents holding only
// blanks and comments.
func splitDocuments(data []byte) []document {
	var docs []document
	var cur bytes.Buffer
	start, line := 1, 0
	flush := func(next int) {
		if !blank(cur.Bytes()) {
			docs = append(docs, document{data: bytes.Clone(cur.Bytes()), line: start})
		}
		cur.Reset()
		start = next
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, len(data)+1)
	for sc.Scan() {
		line++
		if separator.Match(sc.Bytes()) {
			flush(line + 1)
			continue
		}
		if cur.Len() == 0 {
			start = line
		}
		cur.Write(sc.Bytes())
		cur.WriteByte('\n')
	}
	flush(line + 1)
	return docs
}

func blank(doc []byte) bool {
	for l := range strings.SplitSeq(string(doc), "\n") {
		l = strings.TrimSpace(l)
		if l != "" && !strings.HasPrefix(l, "#") {
			return false
		}
	}
	return true
}
