package health

import (
	"net/netip"
	"slices"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/objects"
)

// ServiceInputs derives, from one family's snapshot, the arguments of
// SyncServices and SyncEndpoints as upstream computes them:
//   - ports: each Service with a health-check node port (the model sets it
//     for LoadBalancer Services with externalTrafficPolicy=Local);
//   - localReady: per Service with a health-check node port (the only
//     ones answered for), the number of distinct IPs of ready endpoints on
//     this node, over all its ports (an endpoint serving
//     several ports counts once; terminating ones do not count).
//
// A nil snapshot yields empty maps.
func ServiceInputs(fs *model.FamilySnapshot) (ports map[objects.Key]uint16, localReady map[objects.Key]int) {
	ports = map[objects.Key]uint16{}
	localReady = map[objects.Key]int{}
	if fs == nil {
		return ports, localReady
	}
	ips := map[objects.Key]map[netip.Addr]struct{}{}
	// Only Services with a health-check port are answered for; the model
	// keeps them apart, so a sync at 10k Services does not walk the others.
	for _, p := range fs.HealthChecked() {
		key := p.ID.Service()
		ports[key] = p.HealthCheckNodePort
		for _, ep := range p.Endpoints {
			if !ep.IsLocal || !ep.Ready {
				continue
			}
			if ips[key] == nil {
				ips[key] = map[netip.Addr]struct{}{}
			}
			ips[key][ep.IP] = struct{}{}
		}
	}
	for key, set := range ips {
		localReady[key] = len(set)
	}
	return ports, localReady
}

// SyncSnapshot opens and closes ports and sets the endpoint counts for one
// family's programmed snapshot: SyncServices then SyncEndpoints with
// ServiceInputs(fs). Call it after every successful sync. When the
// health-checked ports are the very ones (the model shares unchanged ports
// between snapshots) of the last call, and it succeeded, there is nothing
// to do; a port that failed to open is retried on every call.
func (s *ServiceHealthServer) SyncSnapshot(fs *model.FamilySnapshot) error {
	var checked []*model.ServicePort
	if fs != nil {
		checked = fs.HealthChecked()
	}
	if s.syncedOK && slices.Equal(checked, s.synced) {
		return nil
	}
	ports, localReady := ServiceInputs(fs)
	err := s.SyncServices(ports)
	_ = s.SyncEndpoints(localReady) // never fails
	s.synced, s.syncedOK = checked, err == nil
	return err
}
