package main

// NetworkPolicy (networking.k8s.io/v1) compiled into one nftables table, without a userspace packet queue
// (this kernel has no nft queue expression, so kube-network-policies cannot run here).
//
// Layout of `table inet kindnet-netpol`:
//   - one regular chain per isolated local pod and direction (ingress_<ns>_<pod>, egress_<ns>_<pod>):
//     one `return` rule per allowed (peer, port) combination, then reject. Chains never accept: a packet
//     between two pods must pass the source's egress chain and then the destination's ingress chain.
//   - verdict maps from pod IP to those chains (ingress_v4, egress_v4, and _v6);
//   - base chains: forward (pod to pod on this node, pod to or from elsewhere) checks the source's egress
//     then the destination's ingress; input (pod to this node, including Service VIPs that kube-proxy
//     DNATs to hostNetwork endpoints such as the API server) checks the source's egress. Both accept
//     established and related traffic first. The output hook is not used, so the node itself (kubelet
//     probes, hostNetwork pods) always reaches its pods.
//
// Only pods on this node get chains; the pods of every node are peers. Denied TCP gets a reset and
// anything else an ICMP administratively-prohibited, so a denied connection fails at once.

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"
)

const nftTable = "kindnet-netpol"

// ---------------------------------------------------------------------------------------- API objects

type objectMeta struct {
	Name            string            `json:"name"`
	Namespace       string            `json:"namespace"`
	Labels          map[string]string `json:"labels"`
	ResourceVersion string            `json:"resourceVersion"`
}

type kubeObject interface {
	meta() objectMeta
}

func objectKey(m objectMeta) string { return m.Namespace + "/" + m.Name }

type containerPort struct {
	Name          string `json:"name"`
	ContainerPort int32  `json:"containerPort"`
	Protocol      string `json:"protocol"`
}

type container struct {
	Ports []containerPort `json:"ports"`
}

type pod struct {
	Metadata objectMeta `json:"metadata"`
	Spec     struct {
		HostNetwork    bool        `json:"hostNetwork"`
		InitContainers []container `json:"initContainers"` // sidecars may declare named ports
		Containers     []container `json:"containers"`
	} `json:"spec"`
	Status struct {
		Phase  string `json:"phase"`
		HostIP string `json:"hostIP"`
		PodIPs []struct {
			IP string `json:"ip"`
		} `json:"podIPs"`
	} `json:"status"`
}

func (p pod) meta() objectMeta { return p.Metadata }

type namespace struct {
	Metadata objectMeta `json:"metadata"`
}

func (n namespace) meta() objectMeta { return n.Metadata }

type labelSelector struct {
	MatchLabels      map[string]string `json:"matchLabels"`
	MatchExpressions []struct {
		Key      string   `json:"key"`
		Operator string   `json:"operator"`
		Values   []string `json:"values"`
	} `json:"matchExpressions"`
}

type ipBlock struct {
	CIDR   string   `json:"cidr"`
	Except []string `json:"except"`
}

type policyPeer struct {
	PodSelector       *labelSelector `json:"podSelector"`
	NamespaceSelector *labelSelector `json:"namespaceSelector"`
	IPBlock           *ipBlock       `json:"ipBlock"`
}

// intOrString is a port given as a number or as a container port's name.
type intOrString struct {
	Int  int32
	Name string
}

func (v *intOrString) UnmarshalJSON(data []byte) error {
	if len(data) > 0 && data[0] == '"' {
		return json.Unmarshal(data, &v.Name)
	}
	return json.Unmarshal(data, &v.Int)
}

type policyPort struct {
	Protocol string       `json:"protocol"`
	Port     *intOrString `json:"port"`
	EndPort  *int32       `json:"endPort"`
}

type networkPolicy struct {
	Metadata objectMeta `json:"metadata"`
	Spec     struct {
		PodSelector labelSelector `json:"podSelector"`
		PolicyTypes []string      `json:"policyTypes"`
		Ingress     []struct {
			From  []policyPeer `json:"from"`
			Ports []policyPort `json:"ports"`
		} `json:"ingress"`
		Egress []struct {
			To    []policyPeer `json:"to"`
			Ports []policyPort `json:"ports"`
		} `json:"egress"`
	} `json:"spec"`
}

func (p networkPolicy) meta() objectMeta { return p.Metadata }

// policyTypes applies the API's defaults: Ingress always, Egress when egress rules are present.
func (p networkPolicy) policyTypes() (ingress, egress bool) {
	if len(p.Spec.PolicyTypes) == 0 {
		return true, len(p.Spec.Egress) > 0
	}
	return slices.Contains(p.Spec.PolicyTypes, "Ingress"), slices.Contains(p.Spec.PolicyTypes, "Egress")
}

// matches follows metav1.LabelSelectorAsSelector: every requirement must hold; an empty selector matches
// everything. An unknown operator matches nothing (the API server rejects them anyway).
func (s labelSelector) matches(labels map[string]string) bool {
	for k, v := range s.MatchLabels {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	for _, e := range s.MatchExpressions {
		got, ok := labels[e.Key]
		switch e.Operator {
		case "In":
			if !ok || !slices.Contains(e.Values, got) {
				return false
			}
		case "NotIn":
			if ok && slices.Contains(e.Values, got) {
				return false
			}
		case "Exists":
			if !ok {
				return false
			}
		case "DoesNotExist":
			if ok {
				return false
			}
		default:
			return false
		}
	}
	return true
}

// ------------------------------------------------------------------------------------------ rule model

type direction string

const (
	ingress direction = "ingress"
	egress  direction = "egress"
)

type portRange struct{ First, Last uint16 }

// A clause admits a packet (returns from the pod's chain) when all of its parts match. The peer is the
// source address in an ingress chain and the destination address in an egress chain.
type clause struct {
	Comment string
	AnyPeer bool
	Peers   []netip.Prefix // any of these (unless AnyPeer)
	Except  []netip.Prefix // and none of these
	Proto   string         // "tcp", "udp", "sctp", or "" for any protocol and port
	Ports   []portRange    // destination ports; empty means every port of Proto
	// PeerPorts replaces Peers and Ports for named ports in egress rules: each destination pod resolves
	// the name to its own number, so only exact (address, port) pairs are admitted.
	PeerPorts []netip.AddrPort
}

type podChain struct {
	Name      string
	Pod       string // namespace/name
	Direction direction
	IPs       []netip.Addr
	Clauses   []clause
}

type ruleset struct {
	Chains []podChain
}

// endpoint is a pod that can take part in policy: not hostNetwork, not finished, with an IP.
type endpoint struct {
	Namespace, Name string
	Labels          map[string]string
	IPs             []netip.Addr
	Ports           []containerPort
	Local           bool
}

func endpoints(pods []pod, nodeIP netip.Addr) []endpoint {
	var out []endpoint
	for _, p := range pods {
		if p.Spec.HostNetwork || p.Status.Phase == "Succeeded" || p.Status.Phase == "Failed" {
			continue
		}
		var ips []netip.Addr
		for _, a := range p.Status.PodIPs {
			if ip, err := netip.ParseAddr(a.IP); err == nil {
				ips = append(ips, ip.Unmap())
			}
		}
		if len(ips) == 0 {
			continue
		}
		hostIP, _ := netip.ParseAddr(p.Status.HostIP)
		e := endpoint{
			Namespace: p.Metadata.Namespace, Name: p.Metadata.Name, Labels: p.Metadata.Labels,
			IPs: ips, Local: hostIP.IsValid() && hostIP.Unmap() == nodeIP,
		}
		for _, c := range append(slices.Clone(p.Spec.InitContainers), p.Spec.Containers...) {
			e.Ports = append(e.Ports, c.Ports...)
		}
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].Namespace+"/"+out[i].Name < out[j].Namespace+"/"+out[j].Name
	})
	return out
}

// namedPort resolves a port name on a pod, for the given protocol.
func (e endpoint) namedPort(name, proto string) (uint16, bool) {
	for _, p := range e.Ports {
		if p.Name == name && protocolName(p.Protocol) == proto && p.ContainerPort > 0 {
			return uint16(p.ContainerPort), true
		}
	}
	return 0, false
}

func protocolName(p string) string {
	if p == "" {
		return "tcp"
	}
	return strings.ToLower(p)
}

type compiler struct {
	endpoints       []endpoint
	namespaceLabels map[string]map[string]string
}

// compile turns the cluster's pods, namespaces and policies into the chains of this node's pods.
func compile(pods []pod, namespaces []namespace, policies []networkPolicy, nodeIP netip.Addr) ruleset {
	c := compiler{endpoints: endpoints(pods, nodeIP.Unmap()), namespaceLabels: map[string]map[string]string{}}
	for _, ns := range namespaces {
		c.namespaceLabels[ns.Metadata.Name] = ns.Metadata.Labels
	}
	sorted := slices.Clone(policies)
	sort.Slice(sorted, func(i, j int) bool { return objectKey(sorted[i].Metadata) < objectKey(sorted[j].Metadata) })

	var rs ruleset
	for _, target := range c.endpoints {
		if !target.Local {
			continue
		}
		var ingressChain, egressChain *podChain
		for _, np := range sorted {
			if np.Metadata.Namespace != target.Namespace || !np.Spec.PodSelector.matches(target.Labels) {
				continue
			}
			isIngress, isEgress := np.policyTypes()
			if isIngress {
				ingressChain = c.ensureChain(ingressChain, target, ingress)
				for i, r := range np.Spec.Ingress {
					comment := fmt.Sprintf("%s ingress[%d]", objectKey(np.Metadata), i)
					ingressChain.Clauses = append(ingressChain.Clauses, c.clauses(target, ingress, np.Metadata.Namespace, r.From, r.Ports, comment)...)
				}
			}
			if isEgress {
				egressChain = c.ensureChain(egressChain, target, egress)
				for i, r := range np.Spec.Egress {
					comment := fmt.Sprintf("%s egress[%d]", objectKey(np.Metadata), i)
					egressChain.Clauses = append(egressChain.Clauses, c.clauses(target, egress, np.Metadata.Namespace, r.To, r.Ports, comment)...)
				}
			}
		}
		for _, ch := range []*podChain{ingressChain, egressChain} {
			if ch != nil {
				rs.Chains = append(rs.Chains, *ch)
			}
		}
	}
	return rs
}

func (c *compiler) ensureChain(ch *podChain, target endpoint, dir direction) *podChain {
	if ch != nil {
		return ch
	}
	return &podChain{
		Name: chainName(dir, target.Namespace, target.Name), Pod: target.Namespace + "/" + target.Name,
		Direction: dir, IPs: target.IPs,
	}
}

// chainName is readable (namespaces have no '_', so it is unique) and within nft's identifier rules;
// names too long for nft's 256-byte limit fall back to a hash.
func chainName(dir direction, ns, name string) string {
	n := string(dir) + "_" + ns + "_" + name
	if len(n) <= 200 {
		return n
	}
	sum := sha256.Sum256([]byte(ns + "/" + name))
	return string(dir) + "_" + ns + "_" + hex.EncodeToString(sum[:8])
}

// peerGroup is one way a rule names its peers: anyone, a set of pods, or one ipBlock.
type peerGroup struct {
	any    bool
	pods   []endpoint
	cidr   netip.Prefix
	except []netip.Prefix
}

func (g peerGroup) isBlock() bool { return g.cidr.IsValid() }

// candidates are the pods a named egress port can resolve on: every pod this group can address.
func (g peerGroup) candidates(all []endpoint) []endpoint {
	if !g.isBlock() && !g.any {
		return g.pods
	}
	var out []endpoint
	for _, e := range all {
		if g.any || slices.ContainsFunc(e.IPs, g.admits) {
			out = append(out, e)
		}
	}
	return out
}

func (g peerGroup) admits(ip netip.Addr) bool {
	return g.cidr.Contains(ip) && !slices.ContainsFunc(g.except, func(x netip.Prefix) bool { return x.Contains(ip) })
}

func (c *compiler) peerGroups(policyNS string, peers []policyPeer) []peerGroup {
	if len(peers) == 0 {
		return []peerGroup{{any: true}}
	}
	var groups []peerGroup
	selected := peerGroup{}
	seen := map[string]bool{}
	for _, p := range peers {
		if p.IPBlock != nil {
			if g, ok := parseIPBlock(*p.IPBlock); ok {
				groups = append(groups, g)
			}
			continue
		}
		for _, e := range c.endpoints {
			if !c.selects(p, policyNS, e) || seen[e.Namespace+"/"+e.Name] {
				continue
			}
			seen[e.Namespace+"/"+e.Name] = true
			selected.pods = append(selected.pods, e)
		}
	}
	if len(selected.pods) > 0 {
		groups = append([]peerGroup{selected}, groups...)
	}
	return groups
}

// selects: podSelector alone means the policy's namespace; namespaceSelector alone means every pod of
// the namespaces it selects; both means the pods selected within those namespaces.
func (c *compiler) selects(p policyPeer, policyNS string, e endpoint) bool {
	if p.NamespaceSelector == nil {
		if e.Namespace != policyNS {
			return false
		}
	} else if labels, ok := c.namespaceLabels[e.Namespace]; !ok || !p.NamespaceSelector.matches(labels) {
		return false
	}
	return p.PodSelector == nil || p.PodSelector.matches(e.Labels)
}

func parseIPBlock(b ipBlock) (peerGroup, bool) {
	cidr, err := netip.ParsePrefix(b.CIDR)
	if err != nil {
		return peerGroup{}, false
	}
	g := peerGroup{cidr: cidr.Masked()}
	for _, x := range b.Except {
		if p, err := netip.ParsePrefix(x); err == nil {
			g.except = append(g.except, p.Masked())
		}
	}
	return g, true
}

// portSpec is one resolved entry of a rule's ports: a protocol with port ranges (none meaning all), or
// a name still to resolve on each destination (egress).
type portSpec struct {
	proto  string
	ranges []portRange
	name   string
}

func (c *compiler) clauses(target endpoint, dir direction, policyNS string, peers []policyPeer, ports []policyPort, comment string) []clause {
	groups := c.peerGroups(policyNS, peers)
	var out []clause
	if len(ports) == 0 {
		for _, g := range groups {
			out = append(out, g.clause(comment))
		}
		return out
	}
	for _, spec := range resolvePorts(target, dir, ports) {
		for _, g := range groups {
			if spec.name == "" {
				cl := g.clause(comment)
				cl.Proto, cl.Ports = spec.proto, spec.ranges
				out = append(out, cl)
				continue
			}
			var pairs []netip.AddrPort
			for _, e := range g.candidates(c.endpoints) {
				port, ok := e.namedPort(spec.name, spec.proto)
				if !ok {
					continue
				}
				for _, ip := range e.IPs {
					if !g.isBlock() || g.admits(ip) {
						pairs = append(pairs, netip.AddrPortFrom(ip, port))
					}
				}
			}
			if len(pairs) > 0 {
				out = append(out, clause{Comment: comment, Proto: spec.proto, PeerPorts: pairs})
			}
		}
	}
	return out
}

func (g peerGroup) clause(comment string) clause {
	cl := clause{Comment: comment, AnyPeer: g.any}
	if g.isBlock() {
		cl.Peers, cl.Except = []netip.Prefix{g.cidr}, g.except
	}
	for _, e := range g.pods {
		for _, ip := range e.IPs {
			cl.Peers = append(cl.Peers, netip.PrefixFrom(ip, ip.BitLen()))
		}
	}
	return cl
}

// resolvePorts groups a rule's numeric ports by protocol. Named ports resolve on the target for ingress
// and stay named for egress; an ingress name the pod does not declare admits nothing.
func resolvePorts(target endpoint, dir direction, ports []policyPort) []portSpec {
	ranges := map[string][]portRange{}
	allPorts := map[string]bool{}
	var protos []string
	var named []portSpec
	add := func(proto string, r *portRange) {
		if _, ok := ranges[proto]; !ok && !allPorts[proto] {
			protos = append(protos, proto)
		}
		if r == nil {
			allPorts[proto] = true
			ranges[proto] = nil
		} else if !allPorts[proto] {
			ranges[proto] = append(ranges[proto], *r)
		}
	}
	for _, p := range ports {
		proto := protocolName(p.Protocol)
		switch {
		case p.Port == nil:
			add(proto, nil)
		case p.Port.Name != "" && dir == ingress:
			if n, ok := target.namedPort(p.Port.Name, proto); ok {
				add(proto, &portRange{n, n})
			}
		case p.Port.Name != "":
			named = append(named, portSpec{proto: proto, name: p.Port.Name})
		case p.Port.Int > 0 && p.Port.Int <= 65535:
			r := portRange{uint16(p.Port.Int), uint16(p.Port.Int)}
			if p.EndPort != nil && *p.EndPort >= p.Port.Int && *p.EndPort <= 65535 {
				r.Last = uint16(*p.EndPort)
			}
			add(proto, &r)
		}
	}
	var out []portSpec
	for _, proto := range protos {
		out = append(out, portSpec{proto: proto, ranges: mergeRanges(ranges[proto])})
	}
	return append(out, named...)
}

func mergeRanges(in []portRange) []portRange {
	if len(in) == 0 {
		return nil
	}
	sorted := slices.Clone(in)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].First < sorted[j].First })
	out := []portRange{sorted[0]}
	for _, r := range sorted[1:] {
		last := &out[len(out)-1]
		if uint32(r.First) <= uint32(last.Last)+1 {
			last.Last = max(last.Last, r.Last)
		} else {
			out = append(out, r)
		}
	}
	return out
}

// ------------------------------------------------------------------------------------------- rendering

// render writes the whole table as one nft script: creating then deleting the table before declaring it
// again makes the replacement a single atomic transaction, whether or not the table existed.
func (rs ruleset) render() string {
	var b strings.Builder
	fmt.Fprintf(&b, "table inet %s {}\ndelete table inet %s\ntable inet %s {\n", nftTable, nftTable, nftTable)
	maps := map[string][]string{}
	mapped := map[string]bool{}
	for _, ch := range rs.Chains {
		fmt.Fprintf(&b, "\tchain %s {\n", ch.Name)
		for _, cl := range ch.Clauses {
			for _, line := range cl.render(ch.Direction) {
				fmt.Fprintf(&b, "\t\t%s\n", line)
			}
		}
		fmt.Fprintf(&b, "\t\tmeta l4proto tcp counter reject with tcp reset comment %q\n", "deny "+ch.Pod)
		fmt.Fprintf(&b, "\t\tcounter reject with icmpx type admin-prohibited comment %q\n\t}\n", "deny "+ch.Pod)
		for _, ip := range ch.IPs {
			// An address held by two pods (a stale status) would make the map, and so the whole
			// transaction, invalid: the first pod keeps it.
			if key := string(ch.Direction) + ip.String(); !mapped[key] {
				mapped[key] = true
				name := fmt.Sprintf("%s_%s", ch.Direction, family(ip))
				maps[name] = append(maps[name], fmt.Sprintf("%s : jump %s", ip, ch.Name))
			}
		}
	}
	for _, dir := range []direction{ingress, egress} {
		for _, fam := range []string{"v4", "v6"} {
			name := string(dir) + "_" + fam
			addrType := map[string]string{"v4": "ipv4_addr", "v6": "ipv6_addr"}[fam]
			fmt.Fprintf(&b, "\tmap %s {\n\t\ttype %s : verdict\n", name, addrType)
			if len(maps[name]) > 0 {
				fmt.Fprintf(&b, "\t\telements = { %s }\n", strings.Join(maps[name], ", "))
			}
			b.WriteString("\t}\n")
		}
	}
	b.WriteString(`	chain forward {
		type filter hook forward priority filter; policy accept;
		ct state established,related accept
		ip saddr vmap @egress_v4
		ip6 saddr vmap @egress_v6
		ip daddr vmap @ingress_v4
		ip6 daddr vmap @ingress_v6
	}
	chain input {
		type filter hook input priority filter; policy accept;
		ct state established,related accept
		ip saddr vmap @egress_v4
		ip6 saddr vmap @egress_v6
	}
}
`)
	return b.String()
}

func family(ip netip.Addr) string {
	if ip.Is4() {
		return "v4"
	}
	return "v6"
}

func nftFamily(ip netip.Addr) string {
	if ip.Is4() {
		return "ip"
	}
	return "ip6"
}

// render gives one nft rule per address family the clause names (one rule when it names no address).
func (cl clause) render(dir direction) []string {
	addr := map[direction]string{ingress: "saddr", egress: "daddr"}[dir]
	comment := cl.Comment
	if len(comment) > 120 {
		comment = comment[:120]
	}
	tail := fmt.Sprintf("return comment %q", comment)
	if len(cl.PeerPorts) > 0 {
		byFamily := map[string][]string{}
		for _, ap := range cl.PeerPorts {
			byFamily[nftFamily(ap.Addr())] = append(byFamily[nftFamily(ap.Addr())], fmt.Sprintf("%s . %d", ap.Addr(), ap.Port()))
		}
		var lines []string
		for _, fam := range []string{"ip", "ip6"} {
			if elems := dedupe(byFamily[fam]); len(elems) > 0 {
				lines = append(lines, fmt.Sprintf("%s %s . %s dport { %s } %s", fam, addr, cl.Proto, strings.Join(elems, ", "), tail))
			}
		}
		return lines
	}
	var ports string
	switch {
	case cl.Proto != "" && len(cl.Ports) == 0:
		ports = "meta l4proto " + cl.Proto + " "
	case cl.Proto != "":
		var elems []string
		for _, r := range cl.Ports {
			if r.First == r.Last {
				elems = append(elems, strconv.Itoa(int(r.First)))
			} else {
				elems = append(elems, fmt.Sprintf("%d-%d", r.First, r.Last))
			}
		}
		ports = fmt.Sprintf("%s dport %s ", cl.Proto, nftSet(elems))
	}
	if cl.AnyPeer {
		return []string{ports + tail}
	}
	var lines []string
	for _, fam := range []string{"ip", "ip6"} {
		peers := prefixesOf(cl.Peers, fam)
		if len(peers) == 0 {
			continue
		}
		match := fmt.Sprintf("%s %s %s ", fam, addr, nftSet(peers))
		if except := prefixesOf(cl.Except, fam); len(except) > 0 {
			match += fmt.Sprintf("%s %s != %s ", fam, addr, nftSet(except))
		}
		lines = append(lines, match+ports+tail)
	}
	return lines
}

func prefixesOf(prefixes []netip.Prefix, fam string) []string {
	var out []string
	for _, p := range prefixes {
		if nftFamily(p.Addr()) != fam {
			continue
		}
		if p.IsSingleIP() {
			out = append(out, p.Addr().String())
		} else {
			out = append(out, p.String())
		}
	}
	return dedupe(out)
}

func dedupe(in []string) []string {
	out := slices.Clone(in)
	slices.Sort(out)
	return slices.Compact(out)
}

func nftSet(elems []string) string {
	if len(elems) == 1 {
		return elems[0]
	}
	return "{ " + strings.Join(elems, ", ") + " }"
}
