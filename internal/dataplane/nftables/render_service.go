package nftables

import (
	"fmt"
	"hash/crc32"
	"hash/fnv"
	"net/netip"
	"strconv"
	"strings"

	"github.com/kproxy/kproxy/internal/model"
)

// portCtx is what the feature functions of one service port share.
type portCtx struct {
	sp    *model.ServicePort
	ps    *portState
	proto string // tcp, udp, sctp
	human string // ns/name/proto/port, the readable part of names
	// affinity maps an endpoint to its key in the affinity set (ClientIP
	// affinity only).
	affinity map[netip.AddrPort]string
	// cluster and local are the policy chains; "" when not used.
	cluster, local string
	// ext is the chain external destinations go to; "" when not used.
	ext string
}

// port renders one service port: endpoint chains, then each frontend kind.
func (r *renderer) port(sp *model.ServicePort) *portState {
	proto := strings.ToLower(string(sp.Protocol))
	c := &portCtx{
		sp: sp, ps: &portState{}, proto: proto,
		human: sp.ID.Namespace + "/" + sp.ID.Name + "/" + proto + "/" + sp.ID.Port,
	}
	r.affinityKeys(c)
	r.policyChains(c)
	r.hairpin(c)
	r.externalChain(c)
	r.clusterIP(c)
	r.externalIPs(c)
	r.loadBalancer(c)
	r.nodePort(c)
	return c.ps
}

// affinityKeys gives each reachable endpoint of a Service with ClientIP
// affinity its key in the shared affinity set: the client address and an id
// of (service port, endpoint). Two pairs sharing an id (a 32-bit hash) could
// only send a client to a valid endpoint of the right Service: each key is
// looked up in that endpoint's own rule.
func (r *renderer) affinityKeys(c *portCtx) {
	if c.sp.AffinityTimeout <= 0 {
		return
	}
	c.affinity = map[netip.AddrPort]string{}
	for _, ep := range c.sp.AllReachable {
		h := fnv.New32a()
		h.Write([]byte(c.human + "/" + epName(ep)))
		c.affinity[ep.AddrPort()] = fmt.Sprintf("%s saddr . 0x%08x", r.ipX, h.Sum32())
	}
}

// epName is an endpoint in a form allowed in nftables names.
func epName(ep *model.Endpoint) string {
	return strings.ReplaceAll(ep.IP.String(), ":", ".") + "/" + strconv.Itoa(int(ep.Port))
}

// policyChains renders the chains that pick an endpoint for the Cluster and
// the Local traffic policy.
func (r *renderer) policyChains(c *portCtx) {
	if len(c.sp.ClusterEndpoints) > 0 {
		c.cluster = r.endpointChain(c, "svc", c.sp.ClusterEndpoints)
	}
	if len(c.sp.LocalEndpoints) > 0 && c.sp.UsesLocalEndpoints() {
		c.local = r.endpointChain(c, "loc", c.sp.LocalEndpoints)
	}
}

// endpointChain picks one of eps uniformly. Without affinity one rule does
// it, `numgen random mod M offset BASE map @endpoints`, over the chain's block
// of the shared endpoints map: endpoint changes then touch map elements only.
// With affinity, plain rules: known clients first go back to their endpoint,
// else rule i DNATs with probability 1/(M-i) (the last one always).
func (r *renderer) endpointChain(c *portCtx, prefix string, eps []*model.Endpoint) string {
	if c.affinity == nil {
		return r.mappedChain(c, prefix, eps)
	}
	var rules []string
	for _, ep := range eps {
		rules = append(rules, fmt.Sprintf("%s @%s %s", c.affinity[ep.AddrPort()], setAffinity, r.dnat(c, ep)))
	}
	m := len(eps)
	for i, ep := range eps {
		pick := ""
		if i < m-1 {
			pick = fmt.Sprintf("numgen random mod %d 0 ", m-i)
		}
		rules = append(rules, pick+r.dnat(c, ep))
	}
	ch := &chain{Rules: rules}
	ch.Name = contentName(prefix, c.human, rules...)
	c.ps.Chains = append(c.ps.Chains, ch)
	return ch.Name
}

// mappedChain renders a policy chain whose endpoints live in its block of
// the endpoints map; the block is part of the chain's name.
func (r *renderer) mappedChain(c *portCtx, prefix string, eps []*model.Endpoint) string {
	key := prefix + " " + c.human
	b := r.slots.get(key, len(eps))
	c.ps.Blocks = append(c.ps.Blocks, key)
	// Every rule that looks up a map with data makes the kernel check each
	// of the map's elements, and every element added is checked against
	// each such rule: one map for all Services would load quadratically.
	// Shards divide that cost by their square.
	n := uint32(shardCount[c.proto])
	shard := endpointShard(c.proto, int(crc32.ChecksumIEEE([]byte(key))%n))
	rule := fmt.Sprintf("meta l4proto %s dnat %s to numgen random mod %d offset %d map @%s", c.proto, r.ipX, len(eps), b.base, shard)
	for i, ep := range eps {
		// One backing array for key and value: 100k endpoints at 10k Services.
		kv := []string{strconv.Itoa(int(b.base) + i), ep.IP.String(), strconv.Itoa(int(ep.Port))}
		c.ps.Elems = append(c.ps.Elems, element{Set: shard, Key: kv[0:1:1], Value: kv[1:3:3]})
	}
	ch := &chain{Rules: []string{rule}, Name: contentName(prefix, c.human+blockSuffix(b), rule)}
	c.ps.Chains = append(c.ps.Chains, ch)
	return ch.Name
}

// dnat is the statement sending a packet to ep (recording the client for
// affinity when the Service has it).
func (r *renderer) dnat(c *portCtx, ep *model.Endpoint) string {
	s := "meta l4proto " + c.proto + " "
	if key, ok := c.affinity[ep.AddrPort()]; ok {
		s += fmt.Sprintf("update @%s { %s timeout %ds } ", setAffinity, key, c.sp.AffinityTimeout)
	}
	return s + "dnat to " + ep.AddrPort().String()
}

// hairpin lists local endpoints so that an endpoint reaching itself through
// the Service is masqueraded (else it would answer itself directly).
func (r *renderer) hairpin(c *portCtx) {
	for _, ep := range c.sp.AllReachable {
		if ep.IsLocal {
			ip := ep.IP.String()
			c.ps.Elems = append(c.ps.Elems, element{Set: setHairpin, Key: []string{ip, ip, c.proto, strconv.Itoa(int(ep.Port))}})
		}
	}
}

// externalChain renders the chain all external destinations (NodePort,
// external IPs, load-balancer IPs) go to: masquerade for the Cluster policy;
// for the Local policy keep the client IP, but send pods and the node itself
// to the cluster endpoints as upstream does.
func (r *renderer) externalChain(c *portCtx) {
	if !c.sp.HasEndpoints || !c.sp.ExternallyAccessible() {
		return
	}
	var rules []string
	target := c.cluster
	if c.sp.ExternalPolicyLocal {
		target = c.local
		if c.cluster != "" {
			if r.ifLocal != "" {
				rules = append(rules, r.ifLocal+" goto "+c.cluster)
			}
			rules = append(rules, "fib saddr type local "+r.masq, "fib saddr type local goto "+c.cluster)
		}
	} else {
		rules = append(rules, r.masq)
	}
	if target != "" {
		rules = append(rules, "goto "+target)
	}
	ch := &chain{Rules: rules, Name: contentName("ext", c.human, rules...)}
	c.ps.Chains = append(c.ps.Chains, ch)
	c.ext = ch.Name
}

// internalTarget is where cluster-IP traffic goes: a goto verdict for the
// service-ips map, or "" with the verdict for the no-endpoints map.
func (c *portCtx) internalTarget() (dispatch, noEndpoints string) {
	switch {
	case !c.sp.HasEndpoints:
		return "", "goto " + chainReject
	case c.sp.InternalPolicyLocal && c.local == "":
		return "", "drop"
	case c.sp.InternalPolicyLocal:
		return "goto " + c.local, ""
	case c.cluster == "":
		return "", "goto " + chainReject
	}
	return "goto " + c.cluster, ""
}

// externalNoEndpoints is the verdict for external traffic that no chain
// DNATed: reject without any endpoint, drop for the Local policy without a
// local one, "" when there are endpoints for it.
func (c *portCtx) externalNoEndpoints() string {
	switch {
	case !c.sp.HasEndpoints:
		return "goto " + chainReject
	case c.sp.ExternalPolicyLocal && c.local == "":
		return "drop"
	case !c.sp.ExternalPolicyLocal && c.cluster == "":
		return "goto " + chainReject
	}
	return ""
}

func (c *portCtx) dstKey(ip netip.Addr) []string {
	return []string{ip.String(), c.proto, strconv.Itoa(int(c.sp.Port))}
}

func (c *portCtx) add(set string, key []string, value string) {
	e := element{Set: set, Key: key}
	if value != "" {
		e.Value = []string{value}
	}
	c.ps.Elems = append(c.ps.Elems, e)
}

// clusterIP dispatches the cluster IP, or drops/rejects it.
func (r *renderer) clusterIP(c *portCtx) {
	if !c.sp.ClusterIP.IsValid() {
		return
	}
	c.add(setClusterIPs, []string{c.sp.ClusterIP.String()}, "")
	dispatch, none := c.internalTarget()
	if dispatch != "" {
		c.add(mapServiceIPs, c.dstKey(c.sp.ClusterIP), dispatch)
	} else {
		c.add(mapNoEndpointServices, c.dstKey(c.sp.ClusterIP), none)
	}
}

// externalIPs dispatches spec.externalIPs to the external chain.
func (r *renderer) externalIPs(c *portCtx) {
	for _, ip := range c.sp.ExternalIPs {
		r.externalDest(c, ip)
	}
}

func (r *renderer) externalDest(c *portCtx, ip netip.Addr) {
	if c.ext != "" {
		c.add(mapServiceIPs, c.dstKey(ip), "goto "+c.ext)
	}
	if none := c.externalNoEndpoints(); none != "" {
		c.add(mapNoEndpointServices, c.dstKey(ip), none)
	}
}

// loadBalancer dispatches load-balancer IPs and, with source ranges, sends
// new connections to them through a firewall chain first.
func (r *renderer) loadBalancer(c *portCtx) {
	for _, ip := range c.sp.LoadBalancerIPs {
		r.externalDest(c, ip)
	}
	if len(c.sp.LoadBalancerIPs) == 0 || len(c.sp.SourceRanges) == 0 {
		return
	}
	var allowed []string
	fromNode := false
	for _, p := range c.sp.SourceRanges {
		allowed = append(allowed, p.Masked().String())
		fromNode = fromNode || (r.nodeIP.IsValid() && p.Contains(r.nodeIP))
	}
	if fromNode {
		// A VIP configured on the node makes node traffic to it come from
		// the VIP itself.
		for _, ip := range c.sp.LoadBalancerIPs {
			allowed = append(allowed, ip.String())
		}
	}
	rule := fmt.Sprintf("%s saddr != { %s } drop", r.ipX, strings.Join(allowed, ", "))
	ch := &chain{Rules: []string{rule}, Name: contentName("fw", c.human, rule)}
	c.ps.Chains = append(c.ps.Chains, ch)
	for _, ip := range c.sp.LoadBalancerIPs {
		c.add(mapFirewallIPs, c.dstKey(ip), "goto "+ch.Name)
	}
}

// nodePort dispatches the NodePort on node addresses.
func (r *renderer) nodePort(c *portCtx) {
	if c.sp.NodePort == 0 {
		return
	}
	key := []string{c.proto, strconv.Itoa(int(c.sp.NodePort))}
	if c.ext != "" {
		c.add(mapServiceNodePorts, key, "goto "+c.ext)
	}
	if none := c.externalNoEndpoints(); none != "" {
		c.add(mapNoEndpointNodePort, key, none)
	}
}
