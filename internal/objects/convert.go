package objects

import (
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// FromService returns the slim form of svc. It copies what it keeps, so svc
// may be changed or dropped afterwards. spec.clusterIP stands in for an empty
// spec.clusterIPs (objects written before dual-stack).
func FromService(svc *corev1.Service) *Service {
	spec := &svc.Spec
	out := &Service{
		Namespace:                svc.Namespace,
		Name:                     svc.Name,
		UID:                      string(svc.UID),
		ResourceVersion:          svc.ResourceVersion,
		Type:                     string(spec.Type),
		ClusterIPs:               cloneStrings(spec.ClusterIPs),
		Ports:                    servicePorts(spec.Ports),
		ExternalIPs:              cloneStrings(spec.ExternalIPs),
		LoadBalancerIngress:      lbIngress(svc.Status.LoadBalancer.Ingress),
		LoadBalancerSourceRanges: cloneStrings(spec.LoadBalancerSourceRanges),
		SessionAffinity:          string(spec.SessionAffinity),
		ExternalTrafficPolicy:    string(spec.ExternalTrafficPolicy),
		HealthCheckNodePort:      spec.HealthCheckNodePort,
		IPVSScheduler:            svc.Annotations[AnnotationIPVSScheduler],
		LoadBalancing:            svc.Annotations[AnnotationLoadBalancing],
	}
	if len(out.ClusterIPs) == 0 && spec.ClusterIP != "" {
		out.ClusterIPs = []string{spec.ClusterIP}
	}
	if c := spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
		out.SessionAffinityTimeout = *c.ClientIP.TimeoutSeconds
	}
	if spec.InternalTrafficPolicy != nil {
		out.InternalTrafficPolicy = string(*spec.InternalTrafficPolicy)
	}
	if spec.TrafficDistribution != nil {
		out.TrafficDistribution = *spec.TrafficDistribution
	}
	return out
}

func servicePorts(in []corev1.ServicePort) []ServicePort {
	if len(in) == 0 {
		return nil
	}
	out := make([]ServicePort, len(in))
	for i, p := range in {
		out[i] = ServicePort{Name: p.Name, Protocol: string(p.Protocol), Port: p.Port, NodePort: p.NodePort}
	}
	return out
}

// lbIngress keeps the ingress entries that carry an IP (hostname-only
// entries cannot be proxied).
func lbIngress(in []corev1.LoadBalancerIngress) []LoadBalancerIngress {
	var out []LoadBalancerIngress
	for _, ing := range in {
		if ing.IP == "" {
			continue
		}
		e := LoadBalancerIngress{IP: ing.IP}
		if ing.IPMode != nil {
			e.IPMode = string(*ing.IPMode)
		}
		out = append(out, e)
	}
	return out
}

// FromEndpointSlice returns the slim form of es. It copies what it keeps.
func FromEndpointSlice(es *discoveryv1.EndpointSlice) *EndpointSlice {
	out := &EndpointSlice{
		Namespace:       es.Namespace,
		Name:            es.Name,
		ResourceVersion: es.ResourceVersion,
		ServiceName:     es.Labels[LabelServiceName],
		AddressType:     string(es.AddressType),
		TriggerTime:     es.Annotations[AnnotationTriggerTime],
	}
	if len(es.Ports) > 0 {
		out.Ports = make([]EndpointPort, len(es.Ports))
		for i, p := range es.Ports {
			out.Ports[i] = endpointPort(p)
		}
	}
	if len(es.Endpoints) > 0 {
		out.Endpoints = make([]Endpoint, len(es.Endpoints))
		ip := es.AddressType != discoveryv1.AddressTypeFQDN
		for i := range es.Endpoints {
			var bad string
			out.Endpoints[i], bad = endpoint(&es.Endpoints[i], ip)
			if bad != "" {
				if out.BadAddresses == nil {
					out.BadAddresses = map[int]string{}
				}
				out.BadAddresses[i] = bad
			}
		}
	}
	return out
}

func endpointPort(p discoveryv1.EndpointPort) EndpointPort {
	var out EndpointPort
	if p.Name != nil {
		out.Name = *p.Name
	}
	if p.Protocol != nil {
		out.Protocol = string(*p.Protocol)
	}
	if p.Port != nil {
		out.Port = *p.Port
	}
	return out
}

// endpoint converts one endpoint; with ip (an IPv4 or IPv6 slice) it
// parses the first address, returning its text as bad when it does not
// parse.
func endpoint(ep *discoveryv1.Endpoint, ip bool) (out Endpoint, bad string) {
	out = Endpoint{
		Ready:       CondOf(ep.Conditions.Ready),
		Serving:     CondOf(ep.Conditions.Serving),
		Terminating: CondOf(ep.Conditions.Terminating),
		HasAddress:  len(ep.Addresses) > 0,
	}
	if out.HasAddress && ip {
		var ok bool
		if out.Addr, ok = ParseAddr(ep.Addresses[0]); !ok {
			bad = ep.Addresses[0]
		}
	}
	if ep.NodeName != nil {
		// One copy per node name, not one per endpoint: at 10k Services
		// × 100 endpoints the decoded names held 16 MB.
		out.Node = OnNode(*ep.NodeName)
	}
	if h := ep.Hints; h != nil && len(h.ForZones)+len(h.ForNodes) > 0 {
		out.Hints = &Hints{}
		for _, z := range h.ForZones {
			out.Hints.Zones = append(out.Hints.Zones, z.Name)
		}
		for _, n := range h.ForNodes {
			out.Hints.Nodes = append(out.Hints.Nodes, n.Name)
		}
	}
	return out, bad
}

// FromNode returns the slim form of n: the zone label, pod CIDRs (spec.podCIDR
// stands in for an empty spec.podCIDRs), internal and external addresses,
// deletion and the cluster autoscaler's ToBeDeleted taint.
func FromNode(n *corev1.Node) *Node {
	out := &Node{
		Name:            n.Name,
		ResourceVersion: n.ResourceVersion,
		PodCIDRs:        cloneStrings(n.Spec.PodCIDRs),
		Deleting:        n.DeletionTimestamp != nil,
	}
	if zone, ok := n.Labels[LabelTopologyZone]; ok {
		out.Labels = map[string]string{LabelTopologyZone: zone}
	}
	if len(out.PodCIDRs) == 0 && n.Spec.PodCIDR != "" {
		out.PodCIDRs = []string{n.Spec.PodCIDR}
	}
	for _, a := range n.Status.Addresses {
		switch a.Type {
		case corev1.NodeInternalIP:
			out.InternalIPs = append(out.InternalIPs, a.Address)
		case corev1.NodeExternalIP:
			out.ExternalIPs = append(out.ExternalIPs, a.Address)
		}
	}
	for _, t := range n.Spec.Taints {
		if t.Key == TaintToBeDeletedByCA {
			out.ToBeDeleted = true
		}
	}
	return out
}

// cloneStrings copies s; empty and nil both become nil so that equal objects
// compare deep-equal whatever way they were decoded.
func cloneStrings(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return append([]string(nil), s...)
}

// ServiceProxied reports whether kproxy proxies svc, as upstream decides: not
// headless (spec.clusterIP "None" or empty), not ExternalName, and without
// the service.kubernetes.io/service-proxy-name label (another proxy owns it).
func ServiceProxied(svc *corev1.Service) bool {
	if _, ok := svc.Labels[LabelServiceProxyName]; ok {
		return false
	}
	if svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == ClusterIPNone {
		return false
	}
	return svc.Spec.Type != corev1.ServiceTypeExternalName
}

// SliceProxied reports whether kproxy reads es: it names its Service with
// the kubernetes.io/service-name label, has no service.kubernetes.io/headless
// label, and holds IP addresses (FQDN slices are not proxied).
func SliceProxied(es *discoveryv1.EndpointSlice) bool {
	_, headless := es.Labels[LabelHeadless]
	return SliceFieldsProxied(headless, es.Labels[LabelServiceName], string(es.AddressType))
}

// SliceFieldsProxied is SliceProxied for a slice read field by field:
// whether it carries the headless label, its service-name label and its
// address type.
func SliceFieldsProxied(headless bool, serviceName, addressType string) bool {
	return !headless && serviceName != "" && (addressType == AddressTypeIPv4 || addressType == AddressTypeIPv6)
}
