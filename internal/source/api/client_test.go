package api

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	goruntime "runtime"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
)

// fakeServer is a minimal API server: protobuf (or JSON) lists, rejected
// watch-list requests (as an API server without it), and watches that send
// the path's events (JSON, ADDED) then stay open.
type fakeServer struct {
	json   bool
	lists  map[string]runtime.Object // by path
	pages  map[string]func(i int) (runtime.Object, bool)
	gvs    map[string]schema.GroupVersion
	events map[string][]runtime.Object
}

func (f *fakeServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if q.Get("watch") == "true" || q.Get("watch") == "1" {
		if q.Get("sendInitialEvents") == "true" {
			http.Error(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"BadRequest","code":400}`, http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		for _, obj := range f.events[r.URL.Path] {
			data, err := runtime.Encode(scheme.Codecs.LegacyCodec(f.gvs[r.URL.Path]), obj)
			if err != nil {
				panic(err)
			}
			fmt.Fprintf(w, `{"type":"ADDED","object":%s}`+"\n", data)
		}
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		return
	}
	obj, ok := f.lists[r.URL.Path]
	if page, paged := f.pages[r.URL.Path]; paged {
		// Paginated, as an API server without a watch cache.
		i := 0
		if c := q.Get("continue"); c != "" {
			_, _ = fmt.Sscan(c, &i)
		}
		obj, ok = page(i)
	}
	if !ok {
		http.NotFound(w, r)
		return
	}
	gv := f.gvs[r.URL.Path]
	if f.json {
		data, err := runtime.Encode(scheme.Codecs.LegacyCodec(gv), obj)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(data)
		return
	}
	ps := protobuf.NewSerializer(scheme.Scheme, scheme.Scheme)
	data, err := runtime.Encode(scheme.Codecs.EncoderForVersion(ps, gv), obj)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/vnd.kubernetes.protobuf")
	_, _ = w.Write(data)
}

// The Client lists all four kinds, in protobuf and in JSON, when the
// server refuses watch-list, and its watches decode events.
func TestClientListsAndWatches(t *testing.T) {
	for _, json := range []bool{false, true} {
		t.Run(fmt.Sprintf("json=%v", json), func(t *testing.T) {
			svcs := &corev1.ServiceList{ListMeta: metav1.ListMeta{ResourceVersion: "42"}}
			for i := range 3 {
				svcs.Items = append(svcs.Items, *service(fmt.Sprintf("s%d", i), fmt.Sprintf("198.18.128.%d", i+1)))
			}
			svcs.Items = append(svcs.Items, *service("headless", "None"))
			// The slices come in two pages.
			slicePage := func(i int) (runtime.Object, bool) {
				l := &discoveryv1.EndpointSliceList{Items: []discoveryv1.EndpointSlice{*endpointSlice(fmt.Sprintf("s%d-1", i), fmt.Sprintf("s%d", i))}}
				if i == 0 {
					l.Continue = "1"
				}
				return l, i < 2
			}
			const (
				svcPath   = "/api/v1/services"
				slicePath = "/apis/discovery.k8s.io/v1/endpointslices"
				nodePath  = "/api/v1/nodes"
				cidrPath  = "/apis/networking.k8s.io/v1/servicecidrs"
			)
			f := &fakeServer{json: json,
				lists: map[string]runtime.Object{
					svcPath:  svcs,
					nodePath: &corev1.NodeList{Items: []corev1.Node{*node("node-a", "z1"), *node("node-b", "z2")}},
					cidrPath: &networkingv1.ServiceCIDRList{Items: []networkingv1.ServiceCIDR{*serviceCIDR("kubernetes", "198.18.128.0/17")}},
				},
				pages: map[string]func(int) (runtime.Object, bool){slicePath: slicePage},
				gvs: map[string]schema.GroupVersion{
					svcPath: corev1.SchemeGroupVersion, slicePath: discoveryv1.SchemeGroupVersion,
					nodePath: corev1.SchemeGroupVersion, cidrPath: networkingv1.SchemeGroupVersion,
				},
				events: map[string][]runtime.Object{
					svcPath:   {service("w0", "198.18.128.200")},
					slicePath: {endpointSlice("w0-1", "w0")},
					cidrPath:  {serviceCIDR("extra", "198.18.200.0/24")},
				},
			}
			srv := httptest.NewServer(f)
			t.Cleanup(srv.Close)
			cfg := &rest.Config{Host: srv.URL}
			cfg.ContentType = "application/vnd.kubernetes.protobuf"
			if json {
				cfg.ContentType = "application/json"
			}
			client, err := clientFor(cfg)
			if err != nil {
				t.Fatal(err)
			}
			rec := run(t, client)
			got := rec.WaitFor(t, "synced Services", "synced EndpointSlices", "synced Node", "synced ServiceCIDRs",
				"service ns/w0", "slice ns/w0-1", "servicecidr extra")
			slices.Sort(got)
			want := []string{"node node-a", "service ns/s0", "service ns/s1", "service ns/s2", "service ns/w0",
				"servicecidr extra", "servicecidr kubernetes", "slice ns/s0-1", "slice ns/s1-1", "slice ns/w0-1",
				"synced EndpointSlices", "synced Node", "synced ServiceCIDRs", "synced Services"}
			if !slices.Equal(got, want) {
				t.Errorf("events = %q, want %q", got, want)
			}
		})
	}
}

// TestUserAgent: client-go's default form with the kube-proxy release
// kproxy stands in for, as upstream's binary sends its own.
func TestUserAgent(t *testing.T) {
	re := regexp.MustCompile(`^[^/ ]+/v1\.36\.\d+ \(` + goruntime.GOOS + `/` + goruntime.GOARCH + `\) kubernetes/[0-9a-z]+$`)
	if ua := userAgent(); !re.MatchString(ua) {
		t.Errorf("user agent %q does not match %s", ua, re)
	}
}
