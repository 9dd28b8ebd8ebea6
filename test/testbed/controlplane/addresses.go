package controlplane

import "net/netip"

// The testbed's address plan. Everything lies in 198.18.0.0/15 (IPv4) and
// fd00::/8 (IPv6), the only space the testbed may use. This file owns the
// Service ranges and the API server's address; the node network and pod
// CIDRs are owned by netbed (test/testbed/netbed, DefaultLayout) and are
// listed here only so the whole plan reads in one place:
//
//	198.18.0.0/24        node network (netbed): root ns .1, nodes .11.., clients .100..
//	198.18.16.0/20       cluster CIDR (netbed): pod CIDRs 198.18.17.0/24, 198.18.18.0/24, ...
//	198.18.64.0/24       LoadBalancer ingress / externalIPs for tests (LoadBalancerCIDR4)
//	198.18.128.0/17      Service ClusterIPs (ServiceCIDR4)
//	198.19.0.0/16        a second Service range, a ServiceCIDR object the scale
//	                     benchmark adds past 32,000 Services (WideServiceCIDR4)
//
//	fd00:0:0:10::/64     node network (netbed)
//	fd00:0:0:100::/56    cluster CIDR (netbed): pod CIDRs fd00:0:0:101::/64, ...
//	fd00:0:0:fffe::/112  LoadBalancer ingress / externalIPs for tests (LoadBalancerCIDR6)
//	fd00:0:0:ffff::/112  Service ClusterIPs (ServiceCIDR6)
//
// fd00::/64 itself is avoided: hosts (this one included) often use it.
var (
	// ServiceCIDR4 and ServiceCIDR6 are the API server's
	// --service-cluster-ip-range (IPv4 primary). The API server allocates
	// ClusterIPs from them; its own "kubernetes" Service gets the first
	// address of ServiceCIDR4 (KubernetesServiceIP4).
	ServiceCIDR4 = netip.MustParsePrefix("198.18.128.0/17")
	ServiceCIDR6 = netip.MustParsePrefix("fd00:0:0:ffff::/112")

	// WideServiceCIDR4 is a second IPv4 Service range for benchmarks that
	// need more ClusterIPs than ServiceCIDR4 holds: not in the API
	// server's flags, added as a networking.k8s.io ServiceCIDR object.
	WideServiceCIDR4 = netip.MustParsePrefix("198.19.0.0/16")

	// KubernetesServiceIP4 is the ClusterIP of default/kubernetes.
	KubernetesServiceIP4 = netip.MustParseAddr("198.18.128.1")

	// LoadBalancerCIDR4 and LoadBalancerCIDR6 are free for tests to use as
	// Service status.loadBalancer.ingress IPs and spec.externalIPs. The API
	// server does not allocate from them.
	LoadBalancerCIDR4 = netip.MustParsePrefix("198.18.64.0/24")
	LoadBalancerCIDR6 = netip.MustParsePrefix("fd00:0:0:fffe::/112")

	// AdvertiseAddress4 is the API server's --advertise-address: the root
	// namespace's address on the node network (netbed's Layout.Host4), so
	// that the default/kubernetes EndpointSlice names an address the node
	// namespaces can reach when the bed links the root namespace in.
	AdvertiseAddress4 = netip.MustParseAddr("198.18.0.1")
)

// ServiceCIDRs returns the Service ranges, IPv4 first.
func ServiceCIDRs() []netip.Prefix { return []netip.Prefix{ServiceCIDR4, ServiceCIDR6} }
