package metrics

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"runtime"
	"strings"
	"testing"
)

// TestZpages: /statusz and /flagz as upstream serves them: text by
// default and for text/plain or */*, the structured form for its exact
// media type (with a warning for the deprecated version), 406 otherwise;
// absent when not configured.
func TestZpages(t *testing.T) {
	cfg := ServerConfig{
		Statusz: &Statusz{BinaryVersion: "1.36.3", EmulationVersion: "1.36"},
		Flagz: func() map[string]string {
			return map[string]string{"v": "2", "metrics-bind-address": "127.0.0.1:10249"}
		},
	}
	const sep = `(:|: |=| )`
	tests := []struct {
		name, path, accept string
		code               int
		text               *regexp.Regexp // the text form, or nil
		json               map[string]any // fields of the structured form, or nil
		deprecated         bool
	}{
		{name: "statusz text", path: "/statusz", code: 200,
			text: regexp.MustCompile(`^\nkube-proxy statusz\nWarning: .*\n\nStarted` + sep + ` .*\nUp` + sep + ` \d+ hr \d\d min \d\d sec\nGo version` + sep + ` ` + runtime.Version() +
				`\nBinary version` + sep + ` 1\.36\.3\nEmulation version` + sep + ` 1\.36\nPaths` + sep + ` /configz /flagz /healthz /metrics /proxyMode\n$`)},
		{name: "statusz text/plain", path: "/statusz", accept: "text/plain", code: 200, text: regexp.MustCompile(`kube-proxy statusz`)},
		{name: "statusz any", path: "/statusz", accept: "*/*", code: 200, text: regexp.MustCompile(`kube-proxy statusz`)},
		{name: "statusz v1beta1", path: "/statusz", accept: "application/json;as=Statusz;g=config.k8s.io;v=v1beta1", code: 200,
			json: map[string]any{"apiVersion": "config.k8s.io/v1beta1", "kind": "Statusz", "binaryVersion": "1.36.3", "emulationVersion": "1.36",
				"goVersion": runtime.Version(), "metadata": map[string]any{"name": "kube-proxy"},
				"paths": []any{"/configz", "/flagz", "/healthz", "/metrics", "/proxyMode"}}},
		{name: "statusz v1alpha1 after an unservable type", path: "/statusz", accept: "application/xml, application/json;v=v1alpha1;g=config.k8s.io;as=Statusz", code: 200,
			json: map[string]any{"apiVersion": "config.k8s.io/v1alpha1", "kind": "Statusz"}, deprecated: true},
		{name: "statusz plain json", path: "/statusz", accept: "application/json", code: 406},
		{name: "statusz other kind", path: "/statusz", accept: "application/json;as=Flagz;g=config.k8s.io;v=v1beta1", code: 406},
		{name: "statusz unknown version", path: "/statusz", accept: "application/json;as=Statusz;g=config.k8s.io;v=v2", code: 406},
		{name: "flagz text", path: "/flagz", code: 200,
			text: regexp.MustCompile(`^\nkube-proxy flagz\nWarning: .*\nmetrics-bind-address` + sep + `127\.0\.0\.1:10249\nv` + sep + `2\n$`)},
		{name: "flagz v1beta1", path: "/flagz", accept: "application/json;as=Flagz;g=config.k8s.io;v=v1beta1", code: 200,
			json: map[string]any{"apiVersion": "config.k8s.io/v1beta1", "kind": "Flagz", "flags": map[string]any{"v": "2", "metrics-bind-address": "127.0.0.1:10249"}}},
	}
	h := NewServer(cfg).Handler()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodGet, tc.path, nil)
			if tc.accept != "" {
				req.Header.Set("Accept", tc.accept)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			body := rec.Body.String()
			if rec.Code != tc.code {
				t.Fatalf("status %d, want %d: %s", rec.Code, tc.code, body)
			}
			if tc.text != nil && !tc.text.MatchString(body) {
				t.Errorf("text\n%q\ndoes not match %s", body, tc.text)
			}
			if got := rec.Header().Get("Warning") != ""; got != tc.deprecated {
				t.Errorf("deprecation warning %v, want %v", got, tc.deprecated)
			}
			if tc.json == nil {
				return
			}
			var got map[string]any
			if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
				t.Fatalf("%v: %s", err, body)
			}
			for k, want := range tc.json {
				if g, _ := json.Marshal(got[k]); string(g) != mustJSON(t, want) {
					t.Errorf("%s = %s, want %s", k, g, mustJSON(t, want))
				}
			}
		})
	}
	for _, path := range []string{"/statusz", "/flagz"} {
		rec := httptest.NewRecorder()
		NewServer(ServerConfig{}).Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		if rec.Code != http.StatusNotFound {
			t.Errorf("%s without its gate: status %d, want 404", path, rec.Code)
		}
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestDebugFlagsVerbosity: with profiling, PUT /debug/flags/v sets the log
// verbosity through component-base's setter; other methods get 406 and
// nothing is set; without profiling the path is absent.
func TestDebugFlagsVerbosity(t *testing.T) {
	var set []string
	orig := setVerbosity
	setVerbosity = func(v string) (string, error) {
		if v != "4" {
			return "", fmt.Errorf("bad level %q", v)
		}
		set = append(set, v)
		return "successfully set klog.logging.verbosity to " + v, nil
	}
	t.Cleanup(func() { setVerbosity = orig })
	for _, tc := range []struct {
		method, body string
		profiling    bool
		code         int
	}{
		{http.MethodPut, "4\n", true, 200},
		{http.MethodPut, "x", true, 400},
		{http.MethodGet, "", true, 406},
		{http.MethodPut, "4", false, 404},
	} {
		rec := httptest.NewRecorder()
		NewServer(ServerConfig{Profiling: tc.profiling}).Handler().ServeHTTP(rec, httptest.NewRequest(tc.method, "/debug/flags/v", strings.NewReader(tc.body)))
		if rec.Code != tc.code {
			t.Errorf("%s %q (profiling %v): status %d, want %d: %s", tc.method, tc.body, tc.profiling, rec.Code, tc.code, rec.Body)
		}
	}
	if len(set) != 1 {
		t.Errorf("verbosity set %d times, want once: %q", len(set), set)
	}
}
