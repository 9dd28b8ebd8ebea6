package metrics

import (
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"mime"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"time"
)

// The z-pages upstream kube-proxy serves on its metrics address (the
// ComponentStatusz and ComponentFlagz gates, beta and on in v1.36):
// /statusz (start time, uptime, versions, the listed paths) and /flagz
// (every command-line flag's value). Without an Accept header, or asking
// for text/plain, the answer is text for people, whose separators are
// picked at random on each request, as upstream does, so that nobody
// parses it. Asking for application/json with as=Statusz (or Flagz),
// g=config.k8s.io and v=v1beta1 (or the deprecated v1alpha1) gives the
// structured form. Anything else is 406 Not Acceptable.

const zpagesWarning = "Warning: This endpoint is not meant to be machine parseable, has no formatting compatibility guarantees and is for debugging purposes only."

// zpageSeparators are the separators a text page picks from.
var zpageSeparators = []string{":", ": ", "=", " "}

// processStart stands for the process's start time: package variables
// are set before main runs.
var processStart = time.Now()

// zpageVersions are the structured forms' versions; the value says
// whether the version is deprecated.
var zpageVersions = map[string]bool{"v1beta1": false, "v1alpha1": true}

// zpageFormat is what a request's Accept header negotiates.
type zpageFormat struct {
	text    bool   // text/plain
	version string // the structured form's version, with text false
}

// negotiateZpage reads the Accept header for a page whose structured
// kind is kind; ok is false when nothing it accepts can be served.
func negotiateZpage(accept, kind string) (f zpageFormat, ok bool) {
	if strings.TrimSpace(accept) == "" {
		return zpageFormat{text: true}, true
	}
	for _, part := range strings.Split(accept, ",") {
		mt, params, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err != nil {
			continue
		}
		typ, sub, _ := strings.Cut(mt, "/")
		structured := params["as"] != "" || params["g"] != "" || params["v"] != ""
		switch {
		case !structured && (mt == "text/plain" || mt == "text/*" || mt == "*/*"):
			return zpageFormat{text: true}, true
		case structured && (typ == "application" || typ == "*") && (sub == "json" || sub == "*") &&
			params["as"] == kind && params["g"] == "config.k8s.io":
			if _, known := zpageVersions[params["v"]]; known {
				return zpageFormat{version: params["v"]}, true
			}
		}
	}
	return zpageFormat{}, false
}

// serveZpage answers r with the text page (written by text, given the
// separator) or the structured object (made by obj for a version).
func serveZpage(w http.ResponseWriter, r *http.Request, kind string, text func(sep string) string, obj func(version string) any) {
	f, ok := negotiateZpage(r.Header.Get("Accept"), kind)
	if !ok {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotAcceptable)
		_ = json.NewEncoder(w).Encode(map[string]any{
			"kind": "Status", "apiVersion": "v1", "metadata": map[string]any{}, "status": "Failure",
			"message": fmt.Sprintf("only text/plain or application/json;as=%s;g=config.k8s.io;v=v1beta1 can be served", kind),
			"reason":  "NotAcceptable", "code": http.StatusNotAcceptable,
		})
		return
	}
	if f.text {
		textHeaders(w)
		_, _ = fmt.Fprint(w, text(zpageSeparators[rand.IntN(len(zpageSeparators))]))
		return
	}
	b, err := json.Marshal(obj(f.version))
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if zpageVersions[f.version] {
		w.Header().Set("Warning", fmt.Sprintf(`299 - "This version of the %s endpoint is deprecated. Please use a newer version."`, strings.ToLower(kind)))
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	_, _ = w.Write(b)
}

// zpageMeta is the apiVersion, kind and metadata of a structured page.
func zpageMeta(kind, version string) map[string]any {
	return map[string]any{"apiVersion": "config.k8s.io/" + version, "kind": kind, "metadata": map[string]any{"name": componentName}}
}

// Statusz is what /statusz tells besides the times and the Go version.
type Statusz struct {
	// BinaryVersion and EmulationVersion are upstream's version numbers
	// (without "v"; the emulated one major.minor) kproxy stands in for.
	BinaryVersion, EmulationVersion string
}

// componentName is the component the z-pages name (upstream's).
const componentName = "kube-proxy"

// serveStatusz is /statusz.
func (s *Server) serveStatusz(w http.ResponseWriter, r *http.Request) {
	up := max(0, int64(time.Since(processStart).Seconds()))
	binary, emulation := s.cfg.Statusz.BinaryVersion, s.cfg.Statusz.EmulationVersion
	paths := s.listedPaths()
	serveZpage(w, r, "Statusz", func(sep string) string {
		var b strings.Builder
		fmt.Fprintf(&b, "\n%s statusz\n%s\n", componentName, zpagesWarning)
		fmt.Fprintf(&b, "\nStarted%s %s\n", sep, processStart.Format(time.UnixDate))
		fmt.Fprintf(&b, "Up%s %d hr %02d min %02d sec\n", sep, up/3600, up/60%60, up%60)
		fmt.Fprintf(&b, "Go version%s %s\n", sep, runtime.Version())
		fmt.Fprintf(&b, "Binary version%s %s\n", sep, binary)
		if emulation != "" {
			fmt.Fprintf(&b, "Emulation version%s %s\n", sep, emulation)
		}
		fmt.Fprintf(&b, "Paths%s %s\n", sep, strings.Join(paths, " "))
		return b.String()
	}, func(version string) any {
		o := zpageMeta("Statusz", version)
		o["startTime"] = processStart.UTC().Format(time.RFC3339)
		o["uptimeSeconds"] = up
		o["goVersion"] = runtime.Version()
		o["binaryVersion"] = binary
		if emulation != "" {
			o["emulationVersion"] = emulation
		}
		o["paths"] = paths
		return o
	})
}

// serveFlagz is /flagz.
func (s *Server) serveFlagz(w http.ResponseWriter, r *http.Request) {
	flags := s.cfg.Flagz()
	serveZpage(w, r, "Flagz", func(sep string) string {
		var b strings.Builder
		fmt.Fprintf(&b, "\n%s flagz\n%s\n", componentName, zpagesWarning)
		for _, name := range slices.Sorted(maps.Keys(flags)) {
			fmt.Fprintf(&b, "%s%s%s\n", name, sep, flags[name])
		}
		return b.String()
	}, func(version string) any {
		o := zpageMeta("Flagz", version)
		if len(flags) > 0 {
			o["flags"] = flags
		}
		return o
	})
}

// listedPaths are the first segments of the listed routes, as /statusz
// shows them. As upstream's, the list is taken before /statusz is added
// (so it is not in it), and the profiling routes are unlisted.
func (s *Server) listedPaths() []string {
	paths := []string{"/configz", "/healthz", "/metrics", "/proxyMode"}
	if s.cfg.Flagz != nil {
		paths = append(paths, "/flagz")
	}
	slices.Sort(paths)
	return paths
}
