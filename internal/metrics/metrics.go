// Package metrics defines kproxy's Prometheus metrics, with upstream
// kube-proxy v1.36's kubeproxy_* names, types, help texts, labels and
// buckets, and serves them (with /proxyMode, /configz, /healthz and pprof) on
// the metrics address.
//
// Every metric lives in a Metrics value registered on a registry the caller
// passes in: there are no package-level metric variables. As upstream does,
// only the metrics of the running proxy mode are registered; calling a method
// whose metric is not registered in that mode is a no-op.
package metrics

import (
	k8smetrics "k8s.io/component-base/metrics"
)

const subsystem = "kubeproxy"

// Proxy modes, as in KubeProxyConfiguration.mode.
const (
	ModeIPTables    = "iptables"
	ModeIPVS        = "ipvs"
	ModeNFTables    = "nftables"
	ModeKernelspace = "kernelspace"
)

// Label names and the values of traffic_policy.
const (
	labelFamily        = "ip_family"
	labelTable         = "table"
	labelTrafficPolicy = "traffic_policy"
	labelCode          = "code"

	PolicyInternal = "internal"
	PolicyExternal = "external"
)

// syncBuckets are upstream's buckets for sync and conntrack durations:
// 1 ms doubling up to ~16 s.
func syncBuckets() []float64 { return k8smetrics.ExponentialBuckets(0.001, 2, 15) }

// programmingBuckets are upstream's buckets for network programming latency:
// 0.25 s, 0.5 s, then every second to 59 s, every 5 s to 115 s, every 30 s
// to 5 min.
func programmingBuckets() []float64 {
	return k8smetrics.MergeBuckets(
		k8smetrics.LinearBuckets(0.25, 0.25, 2),
		k8smetrics.LinearBuckets(1, 1, 59),
		k8smetrics.LinearBuckets(60, 5, 12),
		k8smetrics.LinearBuckets(120, 30, 7),
	)
}

// NetworkProgrammingFine is kproxy's own network programming histogram:
// upstream's first bucket is 250 ms, above most of what kproxy takes, so
// this one starts at 1 ms and doubles to ~65 s.
const NetworkProgrammingFine = "kproxy_network_programming_duration_seconds"

func histogramVec(name, help string, buckets []float64, labels ...string) *k8smetrics.HistogramVec {
	return k8smetrics.NewHistogramVec(&k8smetrics.HistogramOpts{
		Subsystem: subsystem, Name: name, Help: help, Buckets: buckets,
		StabilityLevel: k8smetrics.ALPHA,
	}, labels)
}

func gaugeVec(name, help string, labels ...string) *k8smetrics.GaugeVec {
	return k8smetrics.NewGaugeVec(&k8smetrics.GaugeOpts{
		Subsystem: subsystem, Name: name, Help: help, StabilityLevel: k8smetrics.ALPHA,
	}, labels)
}

func counterVec(name, help string, labels ...string) *k8smetrics.CounterVec {
	return k8smetrics.NewCounterVec(&k8smetrics.CounterOpts{
		Subsystem: subsystem, Name: name, Help: help, StabilityLevel: k8smetrics.ALPHA,
	}, labels)
}

func gauge(name, help string) *k8smetrics.Gauge {
	return k8smetrics.NewGauge(&k8smetrics.GaugeOpts{
		Subsystem: subsystem, Name: name, Help: help, StabilityLevel: k8smetrics.ALPHA,
	})
}

func counter(name, help string) *k8smetrics.Counter {
	return k8smetrics.NewCounter(&k8smetrics.CounterOpts{
		Subsystem: subsystem, Name: name, Help: help, StabilityLevel: k8smetrics.ALPHA,
	})
}

// set holds every kubeproxy_* metric upstream v1.36 defines (the nfacct
// collectors aside, see nfacct.go).
type set struct {
	syncLatency        *k8smetrics.HistogramVec
	syncFullLatency    *k8smetrics.HistogramVec
	syncPartialLatency *k8smetrics.HistogramVec
	lastSync           *k8smetrics.GaugeVec
	lastQueued         *k8smetrics.GaugeVec
	programming        *k8smetrics.HistogramVec
	endpointsPending   *k8smetrics.Gauge
	endpointsTotal     *k8smetrics.Counter
	servicesPending    *k8smetrics.Gauge
	servicesTotal      *k8smetrics.Counter
	noLocalEndpoints   *k8smetrics.GaugeVec
	healthz            *k8smetrics.CounterVec
	livez              *k8smetrics.CounterVec

	iptRestoreFailures        *k8smetrics.CounterVec
	iptPartialRestoreFailures *k8smetrics.CounterVec
	iptRulesTotal             *k8smetrics.GaugeVec
	iptRulesLast              *k8smetrics.GaugeVec
	iptWriter                 *k8smetrics.GaugeVec
	nftSyncFailures           *k8smetrics.CounterVec
	nftCleanupFailures        *k8smetrics.CounterVec

	conntrackLatency *k8smetrics.HistogramVec
	conntrackDeleted *k8smetrics.CounterVec

	programmingFine *k8smetrics.HistogramVec
}

func newSet() *set {
	return &set{
		syncLatency:        histogramVec("sync_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds", syncBuckets(), labelFamily),
		syncFullLatency:    histogramVec("sync_full_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds for full resyncs", syncBuckets(), labelFamily),
		syncPartialLatency: histogramVec("sync_partial_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds for partial resyncs", syncBuckets(), labelFamily),
		lastSync:           gaugeVec("sync_proxy_rules_last_timestamp_seconds", "The last time proxy rules were successfully synced", labelFamily),
		lastQueued:         gaugeVec("sync_proxy_rules_last_queued_timestamp_seconds", "The last time a sync of proxy rules was queued", labelFamily),
		programming:        histogramVec("network_programming_duration_seconds", "In Cluster Network Programming Latency in seconds", programmingBuckets(), labelFamily),
		endpointsPending:   gauge("sync_proxy_rules_endpoint_changes_pending", "Pending proxy rules Endpoint changes"),
		endpointsTotal:     counter("sync_proxy_rules_endpoint_changes_total", "Cumulative proxy rules Endpoint changes"),
		servicesPending:    gauge("sync_proxy_rules_service_changes_pending", "Pending proxy rules Service changes"),
		servicesTotal:      counter("sync_proxy_rules_service_changes_total", "Cumulative proxy rules Service changes"),
		noLocalEndpoints:   gaugeVec("sync_proxy_rules_no_local_endpoints_total", "Number of services with a Local traffic policy and no endpoints", labelTrafficPolicy, labelFamily),
		healthz:            counterVec("proxy_healthz_total", "Cumulative proxy healthz HTTP status", labelCode),
		livez:              counterVec("proxy_livez_total", "Cumulative proxy livez HTTP status", labelCode),

		iptRestoreFailures:        counterVec("sync_proxy_rules_iptables_restore_failures_total", "Cumulative proxy iptables restore failures", labelFamily),
		iptPartialRestoreFailures: counterVec("sync_proxy_rules_iptables_partial_restore_failures_total", "Cumulative proxy iptables partial restore failures", labelFamily),
		iptRulesTotal:             gaugeVec("sync_proxy_rules_iptables_total", "Total number of iptables rules owned by kube-proxy", labelTable, labelFamily),
		iptRulesLast:              gaugeVec("sync_proxy_rules_iptables_last", "Number of iptables rules written by kube-proxy in last sync", labelTable, labelFamily),
		// kproxy's own (no kubeproxy_ prefix): 1 for the writer in use.
		iptWriter: k8smetrics.NewGaugeVec(&k8smetrics.GaugeOpts{Name: IPTablesWriter, StabilityLevel: k8smetrics.ALPHA,
			Help: "How iptables mode writes rules: 1 for the writer in use (netlink, in iptables-nft's encoding, or iptables-restore)"}, []string{"writer"}),
		nftSyncFailures:    counterVec("sync_proxy_rules_nftables_sync_failures_total", "Cumulative proxy nftables sync failures", labelFamily),
		nftCleanupFailures: counterVec("sync_proxy_rules_nftables_cleanup_failures_total", "Cumulative proxy nftables cleanup failures", labelFamily),

		conntrackLatency: histogramVec("conntrack_reconciler_sync_duration_seconds", "ReconcileConntrackFlowsLatency latency in seconds", syncBuckets(), labelFamily),
		conntrackDeleted: counterVec("conntrack_reconciler_deleted_entries_total", "Cumulative conntrack flows deleted by conntrack reconciler", labelFamily),

		programmingFine: k8smetrics.NewHistogramVec(&k8smetrics.HistogramOpts{Name: NetworkProgrammingFine, StabilityLevel: k8smetrics.ALPHA,
			Help:    "In Cluster Network Programming Latency in seconds, from an EndpointSlice's last-change-trigger-time to its rules in the kernel; finer buckets than kubeproxy_network_programming_duration_seconds",
			Buckets: k8smetrics.ExponentialBuckets(0.001, 2, 17)}, []string{labelFamily}),
	}
}

// common are the metrics every mode registers.
func (s *set) common() []k8smetrics.Registerable {
	return []k8smetrics.Registerable{
		s.syncLatency, s.lastQueued, s.lastSync,
		s.endpointsPending, s.endpointsTotal, s.servicesPending, s.servicesTotal,
		s.healthz, s.livez, s.programming, s.noLocalEndpoints,
		s.programmingFine,
	}
}

// forMode are the metrics only some modes register, as upstream v1.36 does.
func (s *set) forMode(mode string) []k8smetrics.Registerable {
	switch mode {
	case ModeIPTables:
		return []k8smetrics.Registerable{
			s.syncFullLatency, s.syncPartialLatency,
			s.iptRestoreFailures, s.iptPartialRestoreFailures, s.iptRulesTotal, s.iptRulesLast, s.iptWriter,
			s.conntrackLatency, s.conntrackDeleted,
		}
	case ModeIPVS:
		return []k8smetrics.Registerable{s.iptRestoreFailures, s.conntrackLatency, s.conntrackDeleted}
	case ModeNFTables:
		return []k8smetrics.Registerable{
			s.syncFullLatency, s.syncPartialLatency,
			s.nftSyncFailures, s.nftCleanupFailures,
			s.conntrackLatency, s.conntrackDeleted,
		}
	}
	return nil
}
