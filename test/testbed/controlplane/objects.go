package controlplane

import (
	"context"
	"fmt"
	"net/netip"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// Helpers that build and apply the objects kproxy watches. No
// controller-manager runs, so tests write Nodes and EndpointSlices directly.
// Apply* create the object, or replace it when it exists; Delete* treat a
// missing object as deleted.

// ZoneLabel is the well-known topology label NewNode sets.
const ZoneLabel = "topology.kubernetes.io/zone"

// NewNode returns a Node with the given pod CIDRs (spec.podCIDR is the
// first), InternalIP addresses, hostname label and, if zone is set, zone
// label.
func NewNode(name string, podCIDRs []netip.Prefix, internalIPs []netip.Addr, zone string) *v1.Node {
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{
		Name:   name,
		Labels: map[string]string{v1.LabelHostname: name},
	}}
	if zone != "" {
		n.Labels[ZoneLabel] = zone
	}
	for _, p := range podCIDRs {
		n.Spec.PodCIDRs = append(n.Spec.PodCIDRs, p.String())
	}
	if len(n.Spec.PodCIDRs) > 0 {
		n.Spec.PodCIDR = n.Spec.PodCIDRs[0]
	}
	for _, a := range internalIPs {
		n.Status.Addresses = append(n.Status.Addresses, v1.NodeAddress{Type: v1.NodeInternalIP, Address: a.String()})
	}
	n.Status.Addresses = append(n.Status.Addresses, v1.NodeAddress{Type: v1.NodeHostName, Address: name})
	return n
}

// CreateNode applies NewNode(name, podCIDRs, internalIPs, zone).
func (cp *ControlPlane) CreateNode(ctx context.Context, name string, podCIDRs []netip.Prefix, internalIPs []netip.Addr, zone string) (*v1.Node, error) {
	return cp.ApplyNode(ctx, NewNode(name, podCIDRs, internalIPs, zone))
}

// ApplyNode creates node, or replaces its labels, spec and status.
func (cp *ControlPlane) ApplyNode(ctx context.Context, node *v1.Node) (*v1.Node, error) {
	nodes := cp.Client.CoreV1().Nodes()
	out, err := nodes.Create(ctx, node, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		out, err = nodes.Get(ctx, node.Name, metav1.GetOptions{})
		if err == nil {
			want := node.DeepCopy()
			want.ResourceVersion = out.ResourceVersion
			out, err = nodes.Update(ctx, want, metav1.UpdateOptions{})
		}
		if err == nil {
			want := out.DeepCopy()
			want.Status = node.Status
			out, err = nodes.UpdateStatus(ctx, want, metav1.UpdateOptions{})
		}
	}
	if err != nil {
		return nil, fmt.Errorf("controlplane: apply node %s: %w", node.Name, err)
	}
	return out, nil
}

// DeleteNode deletes a Node; a missing one is not an error.
func (cp *ControlPlane) DeleteNode(ctx context.Context, name string) error {
	err := cp.Client.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{})
	return ignoreNotFound(err, "node", name)
}

// EnsureNamespace creates namespace name unless it exists.
func (cp *ControlPlane) EnsureNamespace(ctx context.Context, name string) error {
	ns := &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	_, err := cp.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("controlplane: create namespace %s: %w", name, err)
	}
	return nil
}

// ServicePort returns a port of a Service; targetPort 0 means port.
func ServicePort(name string, proto v1.Protocol, port, targetPort int32) v1.ServicePort {
	if targetPort == 0 {
		targetPort = port
	}
	return v1.ServicePort{Name: name, Protocol: proto, Port: port, TargetPort: intstr.FromInt32(targetPort)}
}

// NewService returns a ClusterIP Service. With clusterIPs (at most one per
// family, primary first) the Service asks for exactly those addresses and
// families; without, the API server allocates one address per family
// (PreferDualStack). Change Spec.Type etc. on the result as needed.
func NewService(namespace, name string, clusterIPs []netip.Addr, ports ...v1.ServicePort) *v1.Service {
	s := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec:       v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, Ports: ports},
	}
	switch len(clusterIPs) {
	case 0:
		s.Spec.IPFamilyPolicy = ptr.To(v1.IPFamilyPolicyPreferDualStack)
		return s
	case 1:
		s.Spec.IPFamilyPolicy = ptr.To(v1.IPFamilyPolicySingleStack)
	default:
		s.Spec.IPFamilyPolicy = ptr.To(v1.IPFamilyPolicyRequireDualStack)
	}
	for _, ip := range clusterIPs {
		s.Spec.ClusterIPs = append(s.Spec.ClusterIPs, ip.String())
		s.Spec.IPFamilies = append(s.Spec.IPFamilies, family(ip))
	}
	s.Spec.ClusterIP = s.Spec.ClusterIPs[0]
	return s
}

func family(ip netip.Addr) v1.IPFamily {
	if ip.Is4() {
		return v1.IPv4Protocol
	}
	return v1.IPv6Protocol
}

// ApplyService creates svc (and its namespace), or updates it in place. An
// update keeps the allocated ClusterIPs and node ports that svc leaves empty.
func (cp *ControlPlane) ApplyService(ctx context.Context, svc *v1.Service) (*v1.Service, error) {
	if err := cp.EnsureNamespace(ctx, svc.Namespace); err != nil {
		return nil, err
	}
	services := cp.Client.CoreV1().Services(svc.Namespace)
	out, err := services.Create(ctx, svc, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		out, err = services.Get(ctx, svc.Name, metav1.GetOptions{})
		if err == nil {
			out, err = services.Update(ctx, mergeService(svc, out), metav1.UpdateOptions{})
		}
	}
	if err != nil {
		return nil, fmt.Errorf("controlplane: apply service %s/%s: %w", svc.Namespace, svc.Name, err)
	}
	return out, nil
}

// mergeService returns want with the server-side fields of cur that want
// leaves empty (resource version, ClusterIPs, families, node ports).
func mergeService(want, cur *v1.Service) *v1.Service {
	s := want.DeepCopy()
	s.ResourceVersion = cur.ResourceVersion
	if len(s.Spec.ClusterIPs) == 0 {
		s.Spec.ClusterIP, s.Spec.ClusterIPs = cur.Spec.ClusterIP, cur.Spec.ClusterIPs
		s.Spec.IPFamilies, s.Spec.IPFamilyPolicy = cur.Spec.IPFamilies, cur.Spec.IPFamilyPolicy
	}
	for i := range s.Spec.Ports {
		for _, c := range cur.Spec.Ports {
			if s.Spec.Ports[i].NodePort == 0 && c.Name == s.Spec.Ports[i].Name && c.Protocol == s.Spec.Ports[i].Protocol {
				s.Spec.Ports[i].NodePort = c.NodePort
			}
		}
	}
	if s.Spec.HealthCheckNodePort == 0 {
		s.Spec.HealthCheckNodePort = cur.Spec.HealthCheckNodePort
	}
	return s
}

// DeleteService deletes a Service; a missing one is not an error.
func (cp *ControlPlane) DeleteService(ctx context.Context, namespace, name string) error {
	err := cp.Client.CoreV1().Services(namespace).Delete(ctx, name, metav1.DeleteOptions{})
	return ignoreNotFound(err, "service", namespace+"/"+name)
}

// EndpointPort returns a port of an EndpointSlice.
func EndpointPort(name string, proto v1.Protocol, port int32) discoveryv1.EndpointPort {
	return discoveryv1.EndpointPort{Name: ptr.To(name), Protocol: ptr.To(proto), Port: ptr.To(port)}
}

// ReadyEndpoint returns a ready, serving, not terminating endpoint on node
// (and zone, if set).
func ReadyEndpoint(addr netip.Addr, node, zone string) discoveryv1.Endpoint {
	ep := discoveryv1.Endpoint{
		Addresses:  []string{addr.String()},
		Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
	}
	if node != "" {
		ep.NodeName = ptr.To(node)
	}
	if zone != "" {
		ep.Zone = ptr.To(zone)
	}
	return ep
}

// NewEndpointSlice returns an EndpointSlice named name of Service service
// (label kubernetes.io/service-name) for one address family.
func NewEndpointSlice(namespace, service, name string, fam discoveryv1.AddressType, ports []discoveryv1.EndpointPort, endpoints ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: namespace,
			Name:      name,
			Labels: map[string]string{
				discoveryv1.LabelServiceName: service,
				discoveryv1.LabelManagedBy:   "kproxy-testbed",
			},
		},
		AddressType: fam,
		Ports:       ports,
		Endpoints:   endpoints,
	}
}

// ApplyEndpointSlice creates slice (and its namespace), or replaces it.
func (cp *ControlPlane) ApplyEndpointSlice(ctx context.Context, slice *discoveryv1.EndpointSlice) (*discoveryv1.EndpointSlice, error) {
	if err := cp.EnsureNamespace(ctx, slice.Namespace); err != nil {
		return nil, err
	}
	slices := cp.Client.DiscoveryV1().EndpointSlices(slice.Namespace)
	out, err := slices.Create(ctx, slice, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		out, err = slices.Get(ctx, slice.Name, metav1.GetOptions{})
		if err == nil {
			want := slice.DeepCopy()
			want.ResourceVersion = out.ResourceVersion
			out, err = slices.Update(ctx, want, metav1.UpdateOptions{})
		}
	}
	if err != nil {
		return nil, fmt.Errorf("controlplane: apply endpointslice %s/%s: %w", slice.Namespace, slice.Name, err)
	}
	return out, nil
}

// DeleteEndpointSlice deletes an EndpointSlice; a missing one is not an error.
func (cp *ControlPlane) DeleteEndpointSlice(ctx context.Context, namespace, name string) error {
	err := cp.Client.DiscoveryV1().EndpointSlices(namespace).Delete(ctx, name, metav1.DeleteOptions{})
	return ignoreNotFound(err, "endpointslice", namespace+"/"+name)
}

func ignoreNotFound(err error, kind, name string) error {
	if err == nil || apierrors.IsNotFound(err) {
		return nil
	}
	return fmt.Errorf("controlplane: delete %s %s: %w", kind, name, err)
}
