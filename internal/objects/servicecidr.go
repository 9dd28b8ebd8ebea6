package objects

import networkingv1 "k8s.io/api/networking/v1"

// ServiceCIDR is the slim form of a cluster-scoped networking.k8s.io/v1
// ServiceCIDR: the Service IP ranges it adds to the cluster.
type ServiceCIDR struct {
	Name            string
	ResourceVersion string
	// CIDRs is spec.cidrs as written (at most one per family); the model
	// parses them.
	CIDRs []string
}

// Key returns the ServiceCIDR's name (its namespace is always empty).
func (c *ServiceCIDR) Key() Key { return Key{Name: c.Name} }

// FromServiceCIDR returns the slim form of c. Every ServiceCIDR counts, also
// one being deleted (its range may still hold allocated ClusterIPs), as
// upstream kube-proxy counts it until the object is gone.
func FromServiceCIDR(c *networkingv1.ServiceCIDR) *ServiceCIDR {
	return &ServiceCIDR{Name: c.Name, ResourceVersion: c.ResourceVersion, CIDRs: cloneStrings(c.Spec.CIDRs)}
}
