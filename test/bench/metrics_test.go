//go:build e2e

package bench

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/kproxy/kproxy/test/testbed/netbed"
)

// The proxy's own histograms, scraped from /metrics (Prometheus text
// format) inside the node namespace. Both kproxy and upstream export them.
const (
	metricProgramming = "kubeproxy_network_programming_duration_seconds"
	metricSync        = "kubeproxy_sync_proxy_rules_duration_seconds"
	// kproxy's own, with buckets from 1 ms (upstream's start at 250 ms).
	metricProgrammingFine = "kproxy_network_programming_duration_seconds"
	metricsURL            = "http://127.0.0.1:10249/metrics"
)

// histogram is one histogram summed over its label sets (ip_family).
type histogram struct {
	buckets map[float64]float64 // upper bound -> cumulative count
	sum     float64
	count   float64
	series  int // label sets added up (e.g. 2 for a dual-stack proxy's ip_family)
}

// scrapeHistograms fetches /metrics in ns and returns the named histograms
// (missing ones are empty).
func scrapeHistograms(ctx context.Context, ns *netbed.Netns, names ...string) (map[string]histogram, error) {
	code, body, err := ns.HTTPGet(ctx, metricsURL)
	if err == nil && code != 200 {
		err = fmt.Errorf("GET %s: status %d", metricsURL, code)
	}
	if err != nil {
		return nil, err
	}
	return parseHistograms(body, names...), nil
}

// parseHistograms reads the _bucket, _sum and _count samples of the named
// histograms from Prometheus text, adding up label sets.
func parseHistograms(text string, names ...string) map[string]histogram {
	out := map[string]histogram{}
	for _, n := range names {
		out[n] = histogram{buckets: map[float64]float64{}}
	}
	for _, line := range strings.Split(text, "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		name, labels, value, okLine := splitSample(line)
		if !okLine {
			continue
		}
		for _, n := range names {
			h := out[n]
			switch name {
			case n + "_bucket":
				if le, err := strconv.ParseFloat(labelValue(labels, "le"), 64); err == nil {
					h.buckets[le] += value
				}
			case n + "_sum":
				h.sum += value
			case n + "_count":
				h.count += value
				h.series++
			default:
				continue
			}
			out[n] = h
		}
	}
	return out
}

func splitSample(line string) (name, labels string, value float64, good bool) {
	name = line
	if i := strings.IndexByte(line, '{'); i >= 0 {
		j := strings.LastIndexByte(line, '}')
		if j < i {
			return "", "", 0, false
		}
		name, labels, line = line[:i], line[i+1:j], line[j+1:]
	} else if i := strings.IndexByte(line, ' '); i >= 0 {
		name, line = line[:i], line[i:]
	}
	f := strings.Fields(line)
	if len(f) == 0 {
		return "", "", 0, false
	}
	v, err := strconv.ParseFloat(f[0], 64)
	return name, labels, v, err == nil
}

func labelValue(labels, key string) string {
	for _, kv := range strings.Split(labels, ",") {
		k, v, found := strings.Cut(kv, "=")
		if found && strings.TrimSpace(k) == key {
			return strings.Trim(v, `"`)
		}
	}
	return ""
}

// sub returns h minus an earlier reading of the same histogram.
func (h histogram) sub(before histogram) histogram {
	out := histogram{buckets: map[float64]float64{}, sum: h.sum - before.sum, count: h.count - before.count, series: h.series}
	for le, c := range h.buckets {
		out.buckets[le] = c - before.buckets[le]
	}
	return out
}

// mean is sum/count, NaN when empty.
func (h histogram) mean() float64 {
	if h.count <= 0 {
		return math.NaN()
	}
	return h.sum / h.count
}

// quantile estimates the q-quantile by linear interpolation inside the
// bucket that holds it (as Prometheus' histogram_quantile does); NaN when
// empty. Observations above the last finite bound report that bound.
func (h histogram) quantile(q float64) float64 {
	if h.count <= 0 {
		return math.NaN()
	}
	bounds := make([]float64, 0, len(h.buckets))
	for le := range h.buckets {
		bounds = append(bounds, le)
	}
	sort.Float64s(bounds)
	rank := q * h.count
	prevBound, prevCount := 0.0, 0.0
	for _, le := range bounds {
		c := h.buckets[le]
		if c >= rank {
			if math.IsInf(le, 1) {
				return prevBound
			}
			if c == prevCount {
				return le
			}
			return prevBound + (le-prevBound)*(rank-prevCount)/(c-prevCount)
		}
		prevBound, prevCount = le, c
	}
	return prevBound
}
