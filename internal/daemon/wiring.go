package daemon

import (
	"fmt"
	"sync"

	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/changes"
	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/dataplane"
	"github.com/kproxy/kproxy/internal/dataplane/iptables"
	"github.com/kproxy/kproxy/internal/dataplane/ipvs"
	"github.com/kproxy/kproxy/internal/dataplane/nftables"
	"github.com/kproxy/kproxy/internal/dataplane/userspace"
	"github.com/kproxy/kproxy/internal/metrics"
	"github.com/kproxy/kproxy/internal/nfacct"
	"github.com/kproxy/kproxy/internal/objects"
	"github.com/kproxy/kproxy/internal/source/api"
	"github.com/kproxy/kproxy/internal/source/file"
)

// This file connects the daemon's consumer-side interfaces (ports.go) to the
// packages that implement them.

// defaultInputs builds the file or API source and the change tracker.
func defaultInputs(o *config.Options, nodeName string, notify func()) (Inputs, error) {
	logger := klog.Background()
	obs := &lateObserver{}
	t := changes.NewTracker(nodeName, notify, changes.WithLogger(logger.WithName("changes")), changes.WithObserver(obs))
	tr := trackerAdapter{t}
	if o.SourceFile != "" {
		src := file.New(o.SourceFile, nodeName, t, logger.WithName("file-source"))
		return Inputs{Source: src, Tracker: tr, ObserveChanges: obs.set}, nil
	}
	cfg := o.Config
	api.UseFeatureGates(o.FeatureGate, cfg.FeatureGates) // client-go's gates follow --feature-gates, as upstream's
	client, err := api.NewClient(cfg.ClientConnection, o.Master, logger)
	if err != nil {
		return Inputs{}, fmt.Errorf("connecting to the API server: %w", err)
	}
	src := api.New(client, nodeName, cfg.ConfigSyncPeriod.Duration, t, logger.WithName("api-source"))
	events := api.NewEvents(client, nodeName, logger.WithName("events"))
	return Inputs{Source: src, Tracker: tr, NodeExpected: true, ObserveChanges: obs.set, Events: events}, nil
}

// lateObserver is the tracker's changes.Observer: it forwards to an
// observer set later (the metrics). Events before that are counted and
// replayed when the observer arrives, so the totals match upstream's.
type lateObserver struct {
	mu                    sync.Mutex
	o                     ChangeObserver
	svc, eps              int
	svcPending, epPending int
	pending               *[2]int
}

func (l *lateObserver) set(o ChangeObserver) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for range l.svc {
		o.ServiceChanged(l.svcPending)
	}
	for range l.eps {
		o.EndpointsChanged(l.epPending)
	}
	if l.pending != nil {
		o.ChangesPending(l.pending[0], l.pending[1])
	}
	l.o = o
}

func (l *lateObserver) ServiceChanged(pending int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.o == nil {
		l.svc, l.svcPending = l.svc+1, pending
		return
	}
	l.o.ServiceChanged(pending)
}

func (l *lateObserver) EndpointsChanged(pending int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.o == nil {
		l.eps, l.epPending = l.eps+1, pending
		return
	}
	l.o.EndpointsChanged(pending)
}

func (l *lateObserver) ChangesPending(services, endpoints int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.o == nil {
		l.pending = &[2]int{services, endpoints}
		return
	}
	l.o.ChangesPending(services, endpoints)
}

// trackerAdapter presents a *changes.Tracker as the daemon's Tracker.
type trackerAdapter struct{ t *changes.Tracker }

func (a trackerAdapter) Synced() bool { return a.t.Synced() }

func (a trackerAdapter) NodeSynced() bool { return a.t.NodeSynced() }

func (a trackerAdapter) Node() *objects.Node { return a.t.Node() }

func (a trackerAdapter) Take() *Batch {
	cb := a.t.TakeChanges()
	return &Batch{
		Input: cb.Input, Changed: cb.Changed, NodeChanged: cb.NodeChanged,
		ServiceCIDRsChanged: cb.ServiceCIDRsChanged,
		TriggerTimes:        cb.TriggerTimes, orig: cb,
	}
}

func (a trackerAdapter) Done(b *Batch, ok bool) { a.t.Done(b.orig.(*changes.Batch), ok) }

// defaultDataplanes lists the backends this binary has.
func defaultDataplanes() map[string]DataplaneFunc {
	return map[string]DataplaneFunc{
		ModeNFTables: func(cfg dataplane.Config) (dataplane.Dataplane, error) { return nftables.New(cfg) },
		ModeIPTables: func(cfg dataplane.Config) (dataplane.Dataplane, error) { return iptables.New(cfg) },
		ModeIPVS:     func(cfg dataplane.Config) (dataplane.Dataplane, error) { return ipvs.New(cfg) },
		ModeUserspace: func(cfg dataplane.Config) (dataplane.Dataplane, error) {
			return userspace.New(cfg)
		},
	}
}

// nfacctReader reads the nfacct counters of the iptables mode's packet
// metrics; nil in the other modes, and when the kernel has no nfacct
// (upstream then leaves the metrics out too).
func nfacctReader(dp dataplane.Dataplane) metrics.NFAcctReader {
	if _, ok := dp.(*iptables.Proxier); !ok {
		return nil
	}
	if err := nfacct.Supported(); err != nil {
		klog.Background().Error(err, "The iptables packet metrics read from nfacct will not be served")
		return nil
	}
	return nfacct.Packets
}

// relayReader reads the userspace mode's relay counters; nil for the
// other modes.
func relayReader(dp dataplane.Dataplane) metrics.RelayReader {
	us, ok := dp.(*userspace.Proxier)
	if !ok {
		return nil
	}
	return func() []metrics.Relays {
		stats := us.Stats()
		out := make([]metrics.Relays, len(stats))
		for i, s := range stats {
			out[i] = metrics.Relays{
				Namespace: s.Port.Namespace, Name: s.Port.Name, Port: s.Port.Port, Family: s.Family.String(),
				Endpoint: s.Endpoint.String(), Active: s.Active, Total: s.Total,
				BytesToEndpoint: s.BytesIn, BytesFromEndpoint: s.BytesOut, ConnectErrors: s.ConnectErrors, Retries: s.Retries,
			}
		}
		return out
	}
}
