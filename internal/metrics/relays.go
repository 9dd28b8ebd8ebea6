package metrics

import (
	"k8s.io/klog/v2"

	k8smetrics "k8s.io/component-base/metrics"
)

// Names of the userspace mode's relay metrics.
const (
	RelayActive        = "kproxy_userspace_connections_active"
	RelayTotal         = "kproxy_userspace_connections_total"
	RelayBytes         = "kproxy_userspace_bytes_total"
	RelayConnectErrors = "kproxy_userspace_connect_errors_total"
	RelayRetries       = "kproxy_userspace_retries_total"
)

// Relays is what the userspace mode counted for one endpoint of one
// Service port (all its frontends together).
type Relays struct {
	Namespace, Name, Port, Family, Endpoint string
	Active                                  int64  // open relays (UDP: sessions)
	Total                                   uint64 // relays opened
	BytesToEndpoint, BytesFromEndpoint      uint64
	ConnectErrors                           uint64 // connects to it that failed
	Retries                                 uint64 // relays that reached it after another endpoint failed
}

// RelayReader reads every endpoint's relay counters; it runs at each
// scrape.
type RelayReader func() []Relays

type relayCollector struct {
	k8smetrics.BaseStableCollector
	read                                   RelayReader
	active, total, nbytes, errors, retries *k8smetrics.Desc
}

var _ k8smetrics.StableCollector = &relayCollector{}

var relayLabels = []string{"namespace", "name", "port", labelFamily, "endpoint"}

func newRelayCollector(read RelayReader) *relayCollector {
	desc := func(name, help string, extra ...string) *k8smetrics.Desc {
		return k8smetrics.NewDesc(name, help, append(append([]string{}, relayLabels...), extra...), nil, k8smetrics.ALPHA, "")
	}
	return &relayCollector{
		read:    read,
		active:  desc(RelayActive, "Relays (TCP connections, UDP sessions) open to the endpoint of the Service port"),
		total:   desc(RelayTotal, "Relays opened to the endpoint of the Service port"),
		nbytes:  desc(RelayBytes, "Payload bytes relayed to (direction=to_endpoint) and from (from_endpoint) the endpoint", "direction"),
		errors:  desc(RelayConnectErrors, "Connects to the endpoint that failed (refused, unreachable or timed out)"),
		retries: desc(RelayRetries, "Relays that reached the endpoint after a connect to another endpoint failed"),
	}
}

// DescribeWithStability implements k8smetrics.StableCollector.
func (c *relayCollector) DescribeWithStability(ch chan<- *k8smetrics.Desc) {
	for _, d := range []*k8smetrics.Desc{c.active, c.total, c.nbytes, c.errors, c.retries} {
		ch <- d
	}
}

// CollectWithStability implements k8smetrics.StableCollector.
func (c *relayCollector) CollectWithStability(ch chan<- k8smetrics.Metric) {
	emit := func(d *k8smetrics.Desc, typ k8smetrics.ValueType, v float64, labels ...string) {
		if m, err := k8smetrics.NewConstMetric(d, typ, v, labels...); err == nil && m != nil {
			ch <- m
		} else if err != nil {
			klog.Background().V(4).Info("Dropping a relay sample", "err", err)
		}
	}
	for _, r := range c.read() {
		l := []string{r.Namespace, r.Name, r.Port, r.Family, r.Endpoint}
		emit(c.active, k8smetrics.GaugeValue, float64(r.Active), l...)
		emit(c.total, k8smetrics.CounterValue, float64(r.Total), l...)
		emit(c.nbytes, k8smetrics.CounterValue, float64(r.BytesToEndpoint), append(l, "to_endpoint")...)
		emit(c.nbytes, k8smetrics.CounterValue, float64(r.BytesFromEndpoint), append(l, "from_endpoint")...)
		emit(c.errors, k8smetrics.CounterValue, float64(r.ConnectErrors), l...)
		emit(c.retries, k8smetrics.CounterValue, float64(r.Retries), l...)
	}
}
