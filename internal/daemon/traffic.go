package daemon

import (
	"context"
	"sync"

	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/metrics"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/traffic"
)

// trafficSupported reports whether --service-traffic-metrics works in the
// mode: the counters key on the DNAT that nftables and iptables modes do
// through conntrack; IPVS forwards without it.
func trafficSupported(mode string) bool { return mode == ModeNFTables || mode == ModeIPTables }

// startTraffic runs the traffic counter tables when the flag is on (and the
// mode supports it), or removes the tables an earlier run left when it is
// off. It returns the observer that hands them each programmed snapshot
// and the reader the metrics scrape (both nil when off).
func (d *daemon) startTraffic(ctx context.Context, wg *sync.WaitGroup) (Observer, metrics.ServiceTrafficReader) {
	logger := klog.FromContext(ctx)
	if !d.o.ServiceTrafficMetrics || !trafficSupported(d.mode) {
		if d.o.ServiceTrafficMetrics {
			logger.Info("Warning: --service-traffic-metrics is not supported in this proxy mode; no Service traffic metrics", "mode", d.mode)
		}
		if d.env.trafficCleanup != nil {
			if err := d.env.trafficCleanup(d.fams); err != nil {
				logger.Error(err, "Removing the Service traffic counters failed")
			}
		}
		return nil, nil
	}
	if d.env.trafficTables == nil {
		return nil, nil
	}
	r := d.env.trafficTables(d.fams, logger.WithName("traffic"))
	wg.Go(func() { r.Run(ctx) })
	fams := d.fams
	return trafficObserver{r}, func() ([]metrics.ServiceTraffic, error) { return readTraffic(fams) }
}

// TrafficTables is the part of traffic.Reconciler the daemon uses.
type TrafficTables interface {
	Update(snap *model.Snapshot)
	Run(ctx context.Context)
}

func newTrafficTables(fams []model.Family, logger klog.Logger) TrafficTables {
	return traffic.NewReconciler(fams, logger)
}

// readTraffic reads the counters for a scrape.
func readTraffic(fams []model.Family) ([]metrics.ServiceTraffic, error) {
	samples, err := traffic.Read(fams)
	if err != nil {
		return nil, err
	}
	out := make([]metrics.ServiceTraffic, len(samples))
	for i, s := range samples {
		out[i] = metrics.ServiceTraffic{
			Namespace: s.ID.Namespace, Name: s.ID.Name, Port: s.ID.Port, Family: s.Family.String(),
			NewConnections: s.NewConnections, Packets: s.Packets, Bytes: s.Bytes,
		}
	}
	return out, nil
}

// trafficObserver hands every programmed snapshot to the traffic tables
// (without waiting: they are written in their own goroutine).
type trafficObserver struct{ t TrafficTables }

func (trafficObserver) Started([]model.Family) {}
func (trafficObserver) Queued([]model.Family)  {}
func (o trafficObserver) Synced(r SyncReport) {
	if r.Err == nil && r.Snapshot != nil {
		o.t.Update(r.Snapshot)
	}
}
