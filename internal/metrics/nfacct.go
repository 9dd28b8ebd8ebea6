package metrics

import (
	"k8s.io/klog/v2"

	k8smetrics "k8s.io/component-base/metrics"

	"github.com/kproxy/kproxy/internal/nfacct"
)

// Names of the nfacct counters the iptables backend attaches to its rules;
// the two iptables-mode packet metrics read them at scrape time.
const (
	NFAcctCTStateInvalidDropped      = nfacct.CTStateInvalidDropped
	NFAcctLocalhostNodePortsAccepted = nfacct.LocalhostNodePortsAccepted
)

// NFAcctReader returns the packet count of a named nfacct counter.
type NFAcctReader func(counter string) (packets uint64, err error)

// nfacctCollector exposes one nfacct counter as a Prometheus counter, read
// at each scrape. A failed read is logged and the sample left out.
type nfacctCollector struct {
	k8smetrics.BaseStableCollector
	read    NFAcctReader
	counter string
	desc    *k8smetrics.Desc
	logger  klog.Logger
}

var _ k8smetrics.StableCollector = &nfacctCollector{}

func newNFAcctCollectors(read NFAcctReader, logger klog.Logger) []k8smetrics.StableCollector {
	return []k8smetrics.StableCollector{
		&nfacctCollector{
			read: read, counter: NFAcctCTStateInvalidDropped, logger: logger,
			desc: k8smetrics.NewDesc(subsystem+"_iptables_ct_state_invalid_dropped_packets_total",
				"packets dropped by iptables to work around conntrack problems",
				nil, nil, k8smetrics.ALPHA, ""),
		},
		&nfacctCollector{
			read: read, counter: NFAcctLocalhostNodePortsAccepted, logger: logger,
			desc: k8smetrics.NewDesc(subsystem+"_iptables_localhost_nodeports_accepted_packets_total",
				"Number of packets accepted on nodeports of loopback interface",
				nil, nil, k8smetrics.ALPHA, ""),
		},
	}
}

// DescribeWithStability implements k8smetrics.StableCollector.
func (c *nfacctCollector) DescribeWithStability(ch chan<- *k8smetrics.Desc) { ch <- c.desc }

// CollectWithStability implements k8smetrics.StableCollector.
func (c *nfacctCollector) CollectWithStability(ch chan<- k8smetrics.Metric) {
	packets, err := c.read(c.counter)
	if err != nil {
		c.logger.Error(err, "Reading nfacct counter failed", "counter", c.counter)
		return
	}
	m, err := k8smetrics.NewConstMetric(c.desc, k8smetrics.CounterValue, float64(packets))
	if err != nil {
		c.logger.Error(err, "Creating nfacct metric failed", "counter", c.counter)
		return
	}
	if m != nil {
		ch <- m
	}
}
