package metrics

import (
	"k8s.io/klog/v2"

	k8smetrics "k8s.io/component-base/metrics"
)

// Names of kproxy's per-Service traffic metrics (--service-traffic-metrics).
const (
	ServiceNewConnections = "kproxy_service_new_connections_total"
	ServicePackets        = "kproxy_service_packets_total"
	ServiceBytes          = "kproxy_service_bytes_total"
)

// IPTablesWriter is how iptables mode writes rules (a kproxy metric).
const IPTablesWriter = "kproxy_iptables_writer"

// ServiceTraffic is what one Service port counted in one IP family.
type ServiceTraffic struct {
	Namespace, Name, Port, Family  string
	NewConnections, Packets, Bytes uint64
}

// ServiceTrafficReader reads every Service port's counters; it runs at
// each scrape.
type ServiceTrafficReader func() ([]ServiceTraffic, error)

// trafficCollector exposes the per-Service counters, read once per scrape.
// A failed read is logged and the samples left out.
type trafficCollector struct {
	k8smetrics.BaseStableCollector
	read                ServiceTrafficReader
	logger              klog.Logger
	conns, pkts, nbytes *k8smetrics.Desc
}

var _ k8smetrics.StableCollector = &trafficCollector{}

var trafficLabels = []string{"namespace", "name", "port", labelFamily}

func newTrafficCollector(read ServiceTrafficReader, logger klog.Logger) *trafficCollector {
	desc := func(name, help string) *k8smetrics.Desc {
		return k8smetrics.NewDesc(name, help, trafficLabels, nil, k8smetrics.ALPHA, "")
	}
	return &trafficCollector{
		read: read, logger: logger,
		conns:  desc(ServiceNewConnections, "New connections kproxy sent to an endpoint of the Service port (first packet of each)"),
		pkts:   desc(ServicePackets, "Packets of the Service port's connections through this node, both directions"),
		nbytes: desc(ServiceBytes, "Bytes (IP headers included) of the Service port's connections through this node, both directions"),
	}
}

// DescribeWithStability implements k8smetrics.StableCollector.
func (c *trafficCollector) DescribeWithStability(ch chan<- *k8smetrics.Desc) {
	ch <- c.conns
	ch <- c.pkts
	ch <- c.nbytes
}

// CollectWithStability implements k8smetrics.StableCollector.
func (c *trafficCollector) CollectWithStability(ch chan<- k8smetrics.Metric) {
	samples, err := c.read()
	if err != nil {
		c.logger.Error(err, "Reading the Service traffic counters failed")
		return
	}
	for _, s := range samples {
		labels := []string{s.Namespace, s.Name, s.Port, s.Family}
		for _, v := range []struct {
			desc *k8smetrics.Desc
			n    uint64
		}{{c.conns, s.NewConnections}, {c.pkts, s.Packets}, {c.nbytes, s.Bytes}} {
			if m, err := k8smetrics.NewConstMetric(v.desc, k8smetrics.CounterValue, float64(v.n), labels...); err == nil && m != nil {
				ch <- m
			}
		}
	}
}
