package model

import (
	"cmp"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/kproxy/kproxy/internal/objects"
)

// defaultAffinityTimeout is the API's default ClientIP affinity timeout.
const defaultAffinityTimeout = 10800

// Topology modes, as spec.trafficDistribution names them.
const (
	TopologyPreferSameZone = "PreferSameZone"
	TopologyPreferSameNode = "PreferSameNode"
)

// famIdx indexes per-family arrays: 0 for IPv4, 1 for IPv6.
func famIdx(f Family) int {
	if f == IPv6 {
		return 1
	}
	return 0
}

var families = [2]Family{IPv4, IPv6}

// svcInfo is what the ports of one Service share, parsed and split by family.
type svcInfo struct {
	clusterIP   [2]netip.Addr // invalid when the Service has none of that family
	externalIPs [2][]netip.Addr
	// extIPsIgnored marks the families whose externalIPs were dropped
	// (ignoreExternalIPs).
	extIPsIgnored [2]bool
	lbIPs         [2][]netip.Addr
	sourceRanges  [2][]netip.Prefix
	affinity      int32
	epl, ipl      bool
	hcPort        uint16
	scheduler     string
	balancing     Balancing
	ports         []portSpec // valid, unique, sorted by name and protocol
}

// portSpec is one valid entry of spec.ports.
type portSpec struct {
	key      portKey
	port     uint16
	nodePort uint16
}

// portKey joins service ports with slice ports: name and protocol.
type portKey struct {
	name  string
	proto Protocol
}

func comparePortKey(a, b portKey) int {
	if c := cmp.Compare(a.name, b.name); c != 0 {
		return c
	}
	return cmp.Compare(a.proto, b.proto)
}

// proxied reports whether the model makes ports for svc: not ExternalName and
// with a cluster IP (not headless), as upstream decides.
func proxied(svc *objects.Service) bool {
	if svc == nil || svc.Type == objects.ServiceTypeExternal || len(svc.ClusterIPs) == 0 {
		return false
	}
	ip := svc.ClusterIPs[0]
	return ip != "" && ip != objects.ClusterIPNone
}

// parseService reads everything the ports of svc share. It returns nil when
// the Service is not proxied or has no usable cluster IP.
func parseService(svc *objects.Service, lb BalancingOptions, probs *problemList) *svcInfo {
	if !proxied(svc) {
		return nil
	}
	info := &svcInfo{}
	if !parseClusterIPs(info, svc.ClusterIPs, probs) {
		return nil
	}
	externallyAccessible := parseType(svc, probs)
	info.epl = parsePolicy(svc.ExternalTrafficPolicy, "spec.externalTrafficPolicy", probs) && externallyAccessible
	info.ipl = parsePolicy(svc.InternalTrafficPolicy, "spec.internalTrafficPolicy", probs)
	info.affinity = parseAffinity(svc, probs)
	info.hcPort = parseHealthCheck(svc, info.epl, probs)
	info.scheduler = parseScheduler(svc.IPVSScheduler, probs)
	info.balancing = parseBalancing(svc.LoadBalancing, lb, probs)
	info.ports = parsePorts(svc.Ports, probs)
	splitAddrs(&info.externalIPs, addrList(svc.ExternalIPs, "spec.externalIPs", probs))
	parseIngress(info, svc.LoadBalancerIngress, probs)
	parseSourceRanges(info, svc.LoadBalancerSourceRanges, probs)
	return info
}

// ignoreExternalIPs drops the external IPs, remembering the families that
// had some (upstream's AllowServiceExternalIPs=false: no frontends, but the
// port stays externally accessible).
func (info *svcInfo) ignoreExternalIPs() {
	for i, ips := range info.externalIPs {
		info.extIPsIgnored[i] = len(ips) > 0
		info.externalIPs[i] = nil
	}
}

// parseClusterIPs keeps the first valid cluster IP of each family and reports
// whether there is any.
func parseClusterIPs(info *svcInfo, ips []string, probs *problemList) bool {
	found := false
	for _, s := range ips {
		a, ok := objects.ParseAddr(s)
		if !ok {
			probs.add("spec.clusterIPs", "invalid IP address "+quote(s))
			continue
		}
		i := famIdx(FamilyOf(a))
		if info.clusterIP[i].IsValid() {
			probs.add("spec.clusterIPs", "more than one "+FamilyOf(a).String()+" cluster IP; "+quote(s)+" ignored")
			continue
		}
		info.clusterIP[i] = a
		found = true
	}
	return found
}

// parseType reports whether the Service is externally accessible by its
// spec (upstream: type NodePort or LoadBalancer, or ClusterIP with
// externalIPs). An empty type is the API default, ClusterIP.
func parseType(svc *objects.Service, probs *problemList) bool {
	switch svc.Type {
	case objects.ServiceTypeNodePort, objects.ServiceTypeLB:
		return true
	case objects.ServiceTypeClusterIP, "":
		return len(svc.ExternalIPs) > 0
	default:
		probs.add("spec.type", "unknown type "+quote(svc.Type)+"; only its cluster IP is treated as internal")
		return false
	}
}

// parsePolicy reports whether a traffic policy is Local; anything else but
// Cluster or empty is reported and read as Cluster.
func parsePolicy(v, field string, probs *problemList) bool {
	switch v {
	case objects.PolicyLocal:
		return true
	case objects.PolicyCluster, "":
		return false
	default:
		probs.add(field, "unknown policy "+quote(v)+"; using Cluster")
		return false
	}
}

// parseAffinity returns the ClientIP affinity timeout in seconds, or 0.
func parseAffinity(svc *objects.Service, probs *problemList) int32 {
	switch svc.SessionAffinity {
	case objects.AffinityClientIP:
	case "", "None":
		return 0
	default:
		probs.add("spec.sessionAffinity", "unknown affinity "+quote(svc.SessionAffinity)+"; using None")
		return 0
	}
	t := svc.SessionAffinityTimeout
	if t < 0 {
		probs.add("spec.sessionAffinityConfig.clientIP.timeoutSeconds", "negative timeout; using the default")
	}
	if t <= 0 {
		t = defaultAffinityTimeout
	}
	return t
}

// ipvsSchedulers are the schedulers of Linux IPVS (ip_vs_*.ko).
var ipvsSchedulers = []string{"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "fo", "ovf", "mh", "twos"}

// parseScheduler reads the IPVS scheduler annotation: a known scheduler,
// or "" (the configured default) for an unset or unknown one.
func parseScheduler(s string, probs *problemList) string {
	if s == "" || slices.Contains(ipvsSchedulers, s) {
		return s
	}
	probs.add("metadata.annotations["+objects.AnnotationIPVSScheduler+"]",
		"unknown IPVS scheduler "+quote(s)+"; using the default (--ipvs-scheduler)")
	return ""
}

// parseHealthCheck returns the health-check node port: only LoadBalancer
// Services with the Local external policy have one.
func parseHealthCheck(svc *objects.Service, epl bool, probs *problemList) uint16 {
	if svc.Type != objects.ServiceTypeLB || !epl {
		return 0
	}
	p := svc.HealthCheckNodePort
	if p <= 0 || p > 65535 {
		probs.add("spec.healthCheckNodePort", "Service needs a health-check node port but has "+strconv.Itoa(int(p)))
		return 0
	}
	return uint16(p)
}

// parseProtocol reads a protocol; "" is TCP.
func parseProtocol(s string) (Protocol, bool) {
	switch Protocol(s) {
	case "", TCP:
		return TCP, true
	case UDP, SCTP:
		return Protocol(s), true
	}
	return "", false
}

// parsePorts keeps the valid, unique entries of spec.ports, sorted.
func parsePorts(in []objects.ServicePort, probs *problemList) []portSpec {
	out := make([]portSpec, 0, len(in))
	for i, sp := range in {
		field := "spec.ports[" + strconv.Itoa(i) + "]"
		proto, ok := parseProtocol(sp.Protocol)
		switch {
		case !ok:
			probs.add(field+".protocol", "unknown protocol "+quote(sp.Protocol))
		case sp.Port <= 0 || sp.Port > 65535:
			probs.add(field+".port", "port "+strconv.Itoa(int(sp.Port))+" out of range 1-65535")
		case sp.NodePort < 0 || sp.NodePort > 65535:
			probs.add(field+".nodePort", "node port "+strconv.Itoa(int(sp.NodePort))+" out of range 0-65535")
		default:
			ps := portSpec{key: portKey{sp.Name, proto}, port: uint16(sp.Port), nodePort: uint16(sp.NodePort)}
			if slices.ContainsFunc(out, func(o portSpec) bool { return o.key == ps.key }) {
				probs.add(field, "duplicate port name "+quote(sp.Name)+" for "+string(proto)+"; ignored")
				continue
			}
			out = append(out, ps)
		}
	}
	slices.SortFunc(out, func(a, b portSpec) int { return comparePortKey(a.key, b.key) })
	return out
}

// splitAddrs appends each address to the list of its family.
func splitAddrs(dst *[2][]netip.Addr, addrs []netip.Addr) {
	for _, a := range addrs {
		i := famIdx(FamilyOf(a))
		dst[i] = append(dst[i], a)
	}
}

// parseIngress keeps the load-balancer ingress IPs with ipMode VIP (or
// unset); ipMode Proxy is left out, as upstream does.
func parseIngress(info *svcInfo, in []objects.LoadBalancerIngress, probs *problemList) {
	for _, ing := range in {
		if ing.IP == "" {
			continue
		}
		a, ok := objects.ParseAddr(ing.IP)
		if !ok {
			probs.add("status.loadBalancer.ingress", "invalid IP address "+quote(ing.IP))
			continue
		}
		switch ing.IPMode {
		case "", objects.LoadBalancerIPModeVIP:
		case objects.LoadBalancerIPModeProx:
			continue
		default:
			probs.add("status.loadBalancer.ingress", "unknown ipMode "+quote(ing.IPMode)+" for "+a.String()+"; not proxied")
			continue
		}
		i := famIdx(FamilyOf(a))
		info.lbIPs[i] = append(info.lbIPs[i], a)
	}
}

// parseSourceRanges splits spec.loadBalancerSourceRanges by family. As
// upstream: invalid entries are skipped, and a family whose list holds a
// zero-length prefix gets no list (allow all).
func parseSourceRanges(info *svcInfo, in []string, probs *problemList) {
	for _, s := range in {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		p, ok := parsePrefix(s)
		if !ok {
			probs.add("spec.loadBalancerSourceRanges", "invalid CIDR "+quote(s))
			continue
		}
		i := famIdx(FamilyOf(p.Addr()))
		info.sourceRanges[i] = append(info.sourceRanges[i], p)
	}
	for i, ranges := range info.sourceRanges {
		if slices.ContainsFunc(ranges, func(p netip.Prefix) bool { return p.Bits() == 0 }) {
			info.sourceRanges[i] = nil
		}
	}
}

// servicePort makes the port of family f from ps, without endpoints.
func (info *svcInfo) servicePort(key objects.Key, f Family, ps portSpec) ServicePort {
	i := famIdx(f)
	return ServicePort{
		ID:                  PortID{Namespace: key.Namespace, Name: key.Name, Port: ps.key.name, Protocol: ps.key.proto},
		Family:              f,
		Protocol:            ps.key.proto,
		Port:                ps.port,
		NodePort:            ps.nodePort,
		ClusterIP:           info.clusterIP[i],
		ExternalIPs:         slices.Clip(info.externalIPs[i]),
		LoadBalancerIPs:     slices.Clip(info.lbIPs[i]),
		SourceRanges:        slices.Clip(info.sourceRanges[i]),
		AffinityTimeout:     info.affinity,
		ExternalPolicyLocal: info.epl,
		InternalPolicyLocal: info.ipl,
		HealthCheckNodePort: info.hcPort,
		Scheduler:           info.scheduler,
		Balancing:           info.balancing,
		extIPsIgnored:       info.extIPsIgnored[i],
	}
}
