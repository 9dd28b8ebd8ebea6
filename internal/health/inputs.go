package health

import (
	"slices"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/objects"
)

// ServiceInputs derives, from one family's snapshot, the arguments of
// SyncServices and SyncEndpoints as upstream computes them:
//   - ports: each Service with a health-check node port (the model sets it
//     for LoadBalancer Services with externalTrafficPolicy=Local);
//   - localReady: per Service with a health-check node port (the only
//     ones answered for), the model's LocalReadyEndpoints: the distinct IPs
//     of ready endpoints on this node over every port of the Service's
//     slices, those of a slice port no Service port names included (an
//     endpoint serving several ports counts once; terminating ones do not
//     count). Upstream counts over its whole endpoints map, which holds
//     every slice port, so a slice whose port names no longer match the
//     Service's (a rename in progress, mirrored Endpoints) still counts.
//
// A nil snapshot yields empty maps.
func ServiceInputs(fs *model.FamilySnapshot) (ports map[objects.Key]uint16, localReady map[objects.Key]int) {
	ports = map[objects.Key]uint16{}
	localReady = map[objects.Key]int{}
	if fs == nil {
		return ports, localReady
	}
	// Only Services with a health-check port are answered for; the model
	// keeps them apart, so a sync at 10k Services does not walk the others.
	for _, p := range fs.HealthChecked() {
		key := p.ID.Service()
		ports[key] = p.HealthCheckNodePort
		if p.LocalReadyEndpoints > 0 {
			localReady[key] = p.LocalReadyEndpoints
		}
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
