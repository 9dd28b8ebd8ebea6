//go:build e2e

package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"time"
)

// metricDef is one row of the tables.
type metricDef struct {
	key, label string
	digits     int // decimals printed
}

// metricDefs are the rows, in order.
var metricDefs = []metricDef{
	{"cold_start_s", "cold start: process start → all Services in the kernel and samples answering (s)", 2},
	{"cold_traffic_s", "  of which: sample Services answering (s)", 2},
	{"inputs_s", "  of which: inputs synced, the API's Services and slices in (s; kproxy's log)", 2},
	{"bare_list_s", "a bare client's LIST of the same Services and slices, decoded (s; the floor of the above)", 2},
	{"change_p50_ms", "endpoint change → first fresh connect seeing it, p50 (ms)", 1},
	{"change_p90_ms", "  p90 (ms)", 1},
	{"change_p99_ms", "  p99 (ms)", 1},
	{"change_max_ms", "  max (ms)", 1},
	{"changes", "  changes timed", 0},
	{"watch_p50_ms", "the same change reaching a bare API watcher, p50 (ms; API server floor)", 1},
	{"watch_p99_ms", "  p99 (ms)", 1},
	{"after_watch_p50_ms", "change seen by traffic, minus the bare watcher's arrival, p50 (ms; the proxy's share)", 1},
	{"after_watch_p99_ms", "  p99 (ms)", 1},
	{"prog_mean_ms", "network_programming_duration during the storm, mean (ms)", 1},
	{"prog_p99_ms", "  p99 (ms, bucket-interpolated)", 0},
	{"sync_count", "sync observations during the storm (IPv4 + IPv6)", 0},
	{"sync_p50_ms", "sync_proxy_rules_duration during the storm, p50 (ms)", 1},
	{"sync_p99_ms", "  p99 (ms)", 1},
	{"rss_peak_cold_mib", "peak RSS, cold start (MiB, proxy + children)", 0},
	{"rss_peak_storm_mib", "peak RSS, change storm (MiB)", 0},
	{"rss_steady_mib", "steady RSS after idle (MiB)", 0},
	{"cpu_cold_s", "CPU, cold start (s)", 2},
	{"cpu_storm_s", "CPU, change storm (s)", 2},
	{"storm_s", "  storm wall time (s)", 1},
	{"cpu_idle_s", "CPU, idle period (s)", 2},
	{"conn_rate_10", "new connections/s, 10 Services installed", 0},
	{"conn_rate_n", "new connections/s, all Services installed", 0},
	{"fp_p50_us_10", "first-packet (handshake) latency p50, 10 Services (µs)", 0},
	{"fp_p50_us_n", "  p50, all Services (µs)", 0},
	{"fp_p99_us_10", "  p99, 10 Services (µs)", 0},
	{"fp_p99_us_n", "  p99, all Services (µs)", 0},
}

// entry is the stored result of one configuration at one size.
type entry struct {
	Size    string               `json:"size"`
	Mode    string               `json:"mode"`
	Proxy   string               `json:"proxy"`
	Runs    int                  `json:"runs"`
	Date    string               `json:"date"`
	Machine string               `json:"machine"`
	Etcd    string               `json:"etcd,omitempty"` // the testbed's etcd version; empty: Debian's 3.4.23, before it was recorded
	Load    string               `json:"load"`           // load average when the run began
	Command string               `json:"command"`
	Idle    string               `json:"idle"`
	Gap     string               `json:"changeGap"`
	Values  map[string][]float64 `json:"values"` // one per run that measured it
	Notes   []string             `json:"notes,omitempty"`
}

// etcd is the version of the testbed's etcd. Entries without one were
// measured before it was recorded, when the testbed always ran Debian's
// etcd-server 3.4.23.
func (e entry) etcd() string {
	if e.Etcd == "" {
		return "3.4.23"
	}
	return e.Etcd
}

func (e entry) key() string { return e.Size + "|" + e.Mode + "|" + e.Proxy }

func newEntry(p params, c config, runs []*figures, load string) entry {
	e := entry{Size: p.size(), Mode: c.mode, Proxy: c.proxy, Runs: len(runs),
		Date: time.Now().UTC().Format("2006-01-02 15:04 UTC"), Machine: machine(), Etcd: p.etcd, Load: load,
		Command: p.command, Idle: p.idle.String(), Gap: p.changeGap.String(), Values: map[string][]float64{}}
	if p.balancing > 0 {
		e.Notes = append(e.Notes, "every tenth Service annotated kproxy.io/load-balancing: round-robin or source-hash, half each (BENCH_BALANCING=10)")
	}
	if p.affinity == 0 {
		e.Notes = append(e.Notes, "no Service with ClientIP affinity (BENCH_AFFINITY=0)")
	}
	for i, f := range runs {
		for k, v := range f.values {
			e.Values[k] = append(e.Values[k], v)
		}
		for _, n := range f.notes {
			e.Notes = append(e.Notes, fmt.Sprintf("run %d: %s", i+1, n))
		}
	}
	return e
}

// merge adds the runs of a later invocation of the same configuration.
func (e entry) merge(later entry) entry {
	out := later
	out.Runs = e.Runs + later.Runs
	out.Values = map[string][]float64{}
	for k, v := range e.Values {
		out.Values[k] = append(out.Values[k], v...)
	}
	for k, v := range later.Values {
		out.Values[k] = append(out.Values[k], v...)
	}
	out.Date = e.Date + " and " + later.Date
	out.Load = e.Load + " / " + later.Load
	if e.etcd() != later.etcd() {
		out.Etcd = e.etcd() + " / " + later.etcd()
	}
	out.Notes = append(slices.Clone(e.Notes), later.Notes...)
	return out
}

// stat is the median, min and max of a metric over runs.
type stat struct {
	med, lo, hi float64
	n           int
}

func summarize(v []float64) (stat, bool) {
	if len(v) == 0 {
		return stat{}, false
	}
	s := slices.Clone(v)
	slices.Sort(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return stat{med: med, lo: s[0], hi: s[len(s)-1], n: len(s)}, true
}

func (s stat) format(digits int) string {
	f := func(v float64) string { return fmt.Sprintf("%.*f", digits, v) }
	if s.n == 1 || s.lo == s.hi {
		return f(s.med)
	}
	return fmt.Sprintf("%s (%s–%s)", f(s.med), f(s.lo), f(s.hi))
}

// cell is a metric of an entry as a table cell; "—" when not measured,
// "DNF" when a note says that phase did not finish.
func (e *entry) cell(d metricDef) string {
	if e == nil {
		return "not run"
	}
	s, ok := summarize(e.Values[d.key])
	if !ok {
		if len(e.Notes) > 0 {
			return "DNF"
		}
		return "—"
	}
	out := s.format(d.digits)
	if s.n < e.Runs {
		out += fmt.Sprintf(" [%d/%d runs]", s.n, e.Runs)
	}
	return out
}

// ratio is upstream's median over kproxy's.
func ratio(k, u *entry, d metricDef) string {
	if k == nil || u == nil {
		return ""
	}
	ks, ok1 := summarize(k.Values[d.key])
	us, ok2 := summarize(u.Values[d.key])
	if !ok1 || !ok2 || ks.med == 0 {
		return ""
	}
	return fmt.Sprintf("%.2f×", us.med/ks.med)
}

// table renders the metrics of one size and mode, kproxy and upstream side
// by side.
func table(w io.Writer, size, mode string, k, u *entry) {
	fmt.Fprintf(w, "### %s Services × endpoints, %s\n\n", strings.ReplaceAll(size, "×", " × "), mode)
	fmt.Fprintf(w, "| metric | kproxy | upstream v1.36.3 | upstream ÷ kproxy |\n|---|---|---|---|\n")
	for _, d := range metricDefs {
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", d.label, k.cell(d), u.cell(d), ratio(k, u, d))
	}
	fmt.Fprintln(w)
	for _, e := range []*entry{k, u} {
		if e == nil {
			continue
		}
		fmt.Fprintf(w, "- %s: %d run(s), %s, %s, etcd %s, load average at start %s, idle %s, pause between changes %s; `%s`\n",
			e.Proxy, e.Runs, e.Date, e.Machine, e.etcd(), e.Load, e.Idle, e.Gap, e.Command)
		for _, n := range e.Notes {
			fmt.Fprintf(w, "  - %s\n", n)
		}
	}
	fmt.Fprintln(w)
}

// store is the JSON file of every entry measured so far.
type store map[string]entry

func loadStore(path string) (store, error) {
	s := store{}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return nil, err
	}
	return s, json.Unmarshal(b, &s)
}

func (s store) save(path string) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// render writes a table for every size and mode in the store.
func (s store) render(w io.Writer) {
	type group struct{ size, mode string }
	seen := map[group]bool{}
	var groups []group
	for _, e := range s {
		g := group{e.Size, e.Mode}
		if !seen[g] {
			seen[g] = true
			groups = append(groups, g)
		}
	}
	sort.Slice(groups, func(i, j int) bool {
		a, b := groups[i], groups[j]
		if na, nb := sizeServices(a.size), sizeServices(b.size); na != nb {
			return na < nb
		}
		if a.size != b.size {
			return a.size < b.size
		}
		return a.mode > b.mode // nftables (the default) first
	})
	for _, g := range groups {
		table(w, g.size, g.mode, s.get(g.size, g.mode, "kproxy"), s.get(g.size, g.mode, "upstream"))
	}
}

func (s store) get(size, mode, proxy string) *entry {
	e, ok := s[size+"|"+mode+"|"+proxy]
	if !ok {
		return nil
	}
	return &e
}

func sizeServices(size string) int {
	var n, m int
	fmt.Sscanf(strings.ReplaceAll(size, "×", " "), "%d %d", &n, &m)
	return n*1000 + m
}

// Markers around the generated part of the document.
const (
	docBegin = "<!-- bench:results:begin (generated by test/bench; edit around it) -->"
	docEnd   = "<!-- bench:results:end -->"
)

// updateDoc replaces the generated part of the markdown file at path (or
// appends it) with the store's tables.
func updateDoc(path string, s store) error {
	old, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	var gen strings.Builder
	gen.WriteString(docBegin + "\n\n")
	s.render(&gen)
	gen.WriteString(docEnd)
	text := string(old)
	i, j := strings.Index(text, docBegin), strings.Index(text, docEnd)
	switch {
	case i >= 0 && j > i:
		text = text[:i] + gen.String() + text[j+len(docEnd):]
	default:
		if text == "" {
			text = "# kproxy performance\n\n"
		}
		text += "\n" + gen.String() + "\n"
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(text), 0o644)
}

// machine describes this machine: cores, CPU model, memory, kernel.
func machine() string {
	model := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	kernel := "?"
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		kernel = strings.TrimSpace(string(b))
	}
	mem := ""
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb float64
		fmt.Sscanf(strings.TrimPrefix(strings.SplitN(string(b), "\n", 2)[0], "MemTotal:"), "%f", &kb)
		mem = fmt.Sprintf(", %.0f GiB", kb/(1<<20))
	}
	return fmt.Sprintf("%d cores (%s)%s, kernel %s", runtime.NumCPU(), model, mem, kernel)
}

// loadAverage is /proc/loadavg's first three fields.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
