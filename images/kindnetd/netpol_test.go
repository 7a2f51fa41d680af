package main

import (
	"encoding/json"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

const testNode = "172.18.0.2"

// The world of most cases: namespaces a (team=a) and b (team=b), pods on this node unless noted.
var testNamespaces = []namespace{
	testNamespace("a", map[string]string{"team": "a"}),
	testNamespace("b", map[string]string{"team": "b"}),
}

func testNamespace(name string, labels map[string]string) namespace {
	var ns namespace
	ns.Metadata.Name = name
	ns.Metadata.Labels = map[string]string{"kubernetes.io/metadata.name": name}
	for k, v := range labels {
		ns.Metadata.Labels[k] = v
	}
	return ns
}

// testPod builds a pod from JSON fragments: metadata is filled in, spec and status merged over defaults.
func testPod(t *testing.T, ns, name, ip string, labels map[string]string, spec string) pod {
	t.Helper()
	var p pod
	if spec != "" {
		if err := json.Unmarshal([]byte(spec), &p.Spec); err != nil {
			t.Fatalf("pod %s/%s spec: %v", ns, name, err)
		}
	}
	p.Metadata = objectMeta{Namespace: ns, Name: name, Labels: labels}
	p.Status.Phase = "Running"
	p.Status.HostIP = testNode
	if ip != "" {
		p.Status.PodIPs = append(p.Status.PodIPs, struct {
			IP string `json:"ip"`
		}{ip})
	}
	return p
}

func testPods(t *testing.T) []pod {
	remote := testPod(t, "a", "remote-web", "10.244.1.5", map[string]string{"app": "web"},
		`{"containers":[{"ports":[{"name":"http","containerPort":9000}]}]}`)
	remote.Status.HostIP = "172.18.0.3"
	hostnet := testPod(t, "a", "hostnet-web", testNode, map[string]string{"app": "web"}, `{"hostNetwork":true}`)
	done := testPod(t, "a", "done-web", "10.244.0.99", map[string]string{"app": "web"}, "")
	done.Status.Phase = "Succeeded"
	return []pod{
		testPod(t, "a", "web", "10.244.0.10", map[string]string{"app": "web", "tier": "front"},
			`{"containers":[{"ports":[{"name":"http","containerPort":8080},{"name":"dns","containerPort":53,"protocol":"UDP"}]}]}`),
		testPod(t, "a", "client", "10.244.0.11", map[string]string{"app": "client"}, ""),
		testPod(t, "b", "client", "10.244.0.20", map[string]string{"app": "client"}, ""),
		testPod(t, "b", "other", "10.244.0.21", map[string]string{"app": "other"}, ""),
		testPod(t, "a", "pending", "", map[string]string{"app": "web"}, ""),
		remote, hostnet, done,
	}
}

func testPolicy(t *testing.T, ns, name, spec string) networkPolicy {
	t.Helper()
	var np networkPolicy
	if err := json.Unmarshal([]byte(`{"spec":`+spec+`}`), &np); err != nil {
		t.Fatalf("policy %s/%s: %v", ns, name, err)
	}
	np.Metadata = objectMeta{Namespace: ns, Name: name}
	return np
}

// ----------------------------------------------------------------- an evaluator of the rule model

func (cl clause) admits(peer netip.Addr, proto string, port uint16) bool {
	if len(cl.PeerPorts) > 0 {
		return cl.Proto == proto && slices.Contains(cl.PeerPorts, netip.AddrPortFrom(peer, port))
	}
	if !cl.AnyPeer && !slices.ContainsFunc(cl.Peers, func(p netip.Prefix) bool { return p.Contains(peer) }) {
		return false
	}
	if slices.ContainsFunc(cl.Except, func(p netip.Prefix) bool { return p.Contains(peer) }) {
		return false
	}
	if cl.Proto == "" {
		return true
	}
	if cl.Proto != proto {
		return false
	}
	return len(cl.Ports) == 0 || slices.ContainsFunc(cl.Ports, func(r portRange) bool { return r.First <= port && port <= r.Last })
}

// allows says whether a new connection passes the source's egress chain and the destination's ingress
// chain, as the forward hook applies them.
func (rs ruleset) allows(src, dst netip.Addr, proto string, port uint16) bool {
	for _, ch := range rs.Chains {
		var self, peer netip.Addr
		if ch.Direction == egress {
			self, peer = src, dst
		} else {
			self, peer = dst, src
		}
		if !slices.Contains(ch.IPs, self) {
			continue
		}
		if !slices.ContainsFunc(ch.Clauses, func(cl clause) bool { return cl.admits(peer, proto, port) }) {
			return false
		}
	}
	return true
}

type flow struct {
	src, dst string
	proto    string
	port     uint16
	want     bool
}

const (
	aWeb     = "10.244.0.10"
	aClient  = "10.244.0.11"
	bClient  = "10.244.0.20"
	bOther   = "10.244.0.21"
	external = "8.8.8.8"
)

func TestCompile(t *testing.T) {
	cases := []struct {
		name     string
		policies []string // "namespace name spec-json"
		flows    []flow
		chains   []string // expected chain names, when given
	}{
		{
			name:   "no policy: nothing isolated",
			flows:  []flow{{aClient, aWeb, "tcp", 80, true}, {bClient, external, "udp", 53, true}},
			chains: []string{},
		},
		{
			name:     "deny all ingress isolates only the selected pods, egress untouched",
			policies: []string{`a deny {"podSelector":{"matchLabels":{"app":"web"}}}`},
			flows: []flow{
				{aClient, aWeb, "tcp", 8080, false}, {bClient, aWeb, "udp", 53, false},
				{aWeb, aClient, "tcp", 80, true}, {aWeb, external, "tcp", 443, true}, {aClient, bClient, "tcp", 80, true},
			},
			// Neither the remote pod, the hostNetwork pod, the finished pod nor the pod without an IP.
			chains: []string{"ingress_a_web"},
		},
		{
			name: "allowed traffic is the union of the selecting policies",
			policies: []string{
				`a from-client {"podSelector":{"matchLabels":{"app":"web"}},"ingress":[{"from":[{"podSelector":{"matchLabels":{"app":"client"}}}],"ports":[{"port":8080}]}]}`,
				`a from-b {"podSelector":{},"ingress":[{"from":[{"namespaceSelector":{"matchLabels":{"team":"b"}}}],"ports":[{"port":9090}]}]}`,
			},
			flows: []flow{
				{aClient, aWeb, "tcp", 8080, true}, {aClient, aWeb, "tcp", 9090, false},
				{bClient, aWeb, "tcp", 9090, true}, {bClient, aWeb, "tcp", 8080, false},
				{bClient, aClient, "tcp", 9090, true}, {aWeb, aClient, "tcp", 8080, false},
			},
			chains: []string{"ingress_a_web", "ingress_a_client"},
		},
		{
			name:     "podSelector alone is the policy's namespace",
			policies: []string{`a p {"podSelector":{"matchLabels":{"app":"web"}},"ingress":[{"from":[{"podSelector":{"matchLabels":{"app":"client"}}}]}]}`},
			flows:    []flow{{aClient, aWeb, "tcp", 1, true}, {bClient, aWeb, "tcp", 1, false}},
		},
		{
			name:     "namespaceSelector alone is every pod of those namespaces",
			policies: []string{`a p {"podSelector":{"matchLabels":{"app":"web"}},"ingress":[{"from":[{"namespaceSelector":{"matchLabels":{"team":"b"}}}]}]}`},
			flows:    []flow{{bClient, aWeb, "tcp", 1, true}, {bOther, aWeb, "udp", 2, true}, {aClient, aWeb, "tcp", 1, false}},
		},
		{
			name:     "namespaceSelector and podSelector in one peer must both match",
			policies: []string{`a p {"podSelector":{"matchLabels":{"app":"web"}},"ingress":[{"from":[{"namespaceSelector":{"matchLabels":{"team":"b"}},"podSelector":{"matchLabels":{"app":"client"}}}]}]}`},
			flows:    []flow{{bClient, aWeb, "tcp", 1, true}, {bOther, aWeb, "tcp", 1, false}, {aClient, aWeb, "tcp", 1, false}},
		},
		{
			name:     "two peers are either",
			policies: []string{`a p {"podSelector":{"matchLabels":{"app":"web"}},"ingress":[{"from":[{"namespaceSelector":{"matchLabels":{"team":"b"}}},{"podSelector":{"matchLabels":{"app":"client"}}}]}]}`},
			flows:    []flow{{bClient, aWeb, "tcp", 1, true}, {bOther, aWeb, "tcp", 1, true}, {aClient, aWeb, "tcp", 1, true}, {external, aWeb, "tcp", 1, false}},
		},
		{
			name:     "a selector that matches nobody admits nobody",
			policies: []string{`a p {"podSelector":{"matchLabels":{"app":"web"}},"ingress":[{"from":[{"podSelector":{"matchLabels":{"app":"nobody"}}}]}]}`},
			flows:    []flow{{aClient, aWeb, "tcp", 1, false}, {external, aWeb, "tcp", 1, false}},
		},
		{
			name:     "ipBlock with except",
			policies: []string{`a p {"podSelector":{"matchLabels":{"app":"client"}},"policyTypes":["Egress"],"egress":[{"to":[{"ipBlock":{"cidr":"10.0.0.0/8","except":["10.244.0.0/16","10.9.9.9/32"]}}]}]}`},
			flows: []flow{
				{aClient, "10.1.2.3", "tcp", 443, true}, {aClient, aWeb, "tcp", 80, false},
				{aClient, "10.9.9.9", "tcp", 443, false}, {aClient, external, "tcp", 443, false},
				{aWeb, aClient, "tcp", 80, true},
			},
			chains: []string{"egress_a_client"},
		},
		{
			name:     "named ingress port resolves on the destination pod; an undeclared name admits nothing",
			policies: []string{`a p {"podSelector":{},"ingress":[{"ports":[{"port":"http"},{"port":"dns","protocol":"UDP"}]},{"ports":[{"port":"metrics"}]}]}`},
			flows: []flow{
				{aClient, aWeb, "tcp", 8080, true}, {aClient, aWeb, "udp", 53, true}, {aClient, aWeb, "tcp", 53, false},
				{aClient, aWeb, "tcp", 80, false}, {aWeb, aClient, "tcp", 8080, false},
			},
		},
		{
			name: "named egress port resolves on each destination pod",
			policies: []string{
				`a p {"podSelector":{"matchLabels":{"app":"client"}},"egress":[{"to":[{"podSelector":{"matchLabels":{"app":"web"}}}],"ports":[{"port":"http"}]}]}`,
				`a q {"podSelector":{"matchLabels":{"app":"client"}},"egress":[{"to":[{"ipBlock":{"cidr":"10.244.0.0/16","except":["10.244.0.0/24"]}}],"ports":[{"port":"http"}]}]}`,
			},
			flows: []flow{
				{aClient, aWeb, "tcp", 8080, true}, {aClient, aWeb, "tcp", 9000, false}, {aClient, aWeb, "tcp", 80, false},
				{aClient, "10.244.1.5", "tcp", 9000, true}, {aClient, "10.244.1.5", "tcp", 8080, false},
			},
		},
		{
			name:     "endPort makes a range; protocol defaults to TCP",
			policies: []string{`a p {"podSelector":{"matchLabels":{"app":"web"}},"ingress":[{"ports":[{"port":8000,"endPort":8100},{"port":8100,"endPort":8200},{"port":5000,"protocol":"SCTP"}]}]}`},
			flows: []flow{
				{aClient, aWeb, "tcp", 8000, true}, {aClient, aWeb, "tcp", 8150, true}, {aClient, aWeb, "tcp", 8201, false},
				{aClient, aWeb, "udp", 8050, false}, {aClient, aWeb, "sctp", 5000, true}, {aClient, aWeb, "tcp", 5000, false},
			},
		},
		{
			name:     "protocol without port is every port of that protocol",
			policies: []string{`a p {"podSelector":{"matchLabels":{"app":"web"}},"ingress":[{"ports":[{"protocol":"UDP"},{"protocol":"UDP","port":53}]}]}`},
			flows:    []flow{{aClient, aWeb, "udp", 1234, true}, {aClient, aWeb, "tcp", 1234, false}},
		},
		{
			name:     "without policyTypes, egress rules add Egress and Ingress stays",
			policies: []string{`a p {"podSelector":{"matchLabels":{"app":"client"}},"egress":[{"to":[{"podSelector":{"matchLabels":{"app":"web"}}}]}]}`},
			flows:    []flow{{aClient, aWeb, "tcp", 80, true}, {aClient, bClient, "tcp", 80, false}, {aWeb, aClient, "tcp", 80, false}},
			chains:   []string{"ingress_a_client", "egress_a_client"},
		},
		{
			name:     "policyTypes Egress alone leaves ingress open; an empty egress list denies all egress",
			policies: []string{`a p {"podSelector":{"matchLabels":{"app":"client"}},"policyTypes":["Egress"]}`},
			flows:    []flow{{aClient, aWeb, "tcp", 80, false}, {aClient, external, "udp", 53, false}, {aWeb, aClient, "tcp", 80, true}},
			chains:   []string{"egress_a_client"},
		},
		{
			name:     "empty from and empty ports admit everything",
			policies: []string{`a p {"podSelector":{"matchLabels":{"app":"web"}},"ingress":[{}]}`},
			flows:    []flow{{external, aWeb, "tcp", 1, true}, {bOther, aWeb, "sctp", 9, true}},
		},
		{
			name: "both sides must allow: the source's egress and the destination's ingress",
			policies: []string{
				`a out {"podSelector":{"matchLabels":{"app":"client"}},"policyTypes":["Egress"],"egress":[{"to":[{"podSelector":{}}]}]}`,
				`a in {"podSelector":{"matchLabels":{"app":"web"}},"ingress":[{"from":[{"podSelector":{"matchLabels":{"app":"nobody"}}}]}]}`,
			},
			flows: []flow{{aClient, aWeb, "tcp", 80, false}, {bClient, aWeb, "tcp", 80, false}, {aClient, bClient, "tcp", 80, false}},
		},
		{
			name:     "matchExpressions",
			policies: []string{`a p {"podSelector":{"matchExpressions":[{"key":"app","operator":"In","values":["web","db"]},{"key":"tier","operator":"Exists"}]},"ingress":[{"from":[{"namespaceSelector":{"matchExpressions":[{"key":"team","operator":"NotIn","values":["a"]}]},"podSelector":{"matchExpressions":[{"key":"tier","operator":"DoesNotExist"}]}}]}]}`},
			flows:    []flow{{bClient, aWeb, "tcp", 1, true}, {bOther, aWeb, "tcp", 1, true}, {aClient, aWeb, "tcp", 1, false}},
			chains:   []string{"ingress_a_web"},
		},
		{
			name:     "policies apply only in their namespace",
			policies: []string{`b p {"podSelector":{"matchLabels":{"app":"web"}}}`},
			flows:    []flow{{aClient, aWeb, "tcp", 80, true}},
			chains:   []string{},
		},
	}
	pods := testPods(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var policies []networkPolicy
			for _, p := range tc.policies {
				parts := strings.SplitN(p, " ", 3)
				policies = append(policies, testPolicy(t, parts[0], parts[1], parts[2]))
			}
			rs := compile(pods, testNamespaces, policies, netip.MustParseAddr(testNode))
			for _, f := range tc.flows {
				got := rs.allows(netip.MustParseAddr(f.src), netip.MustParseAddr(f.dst), f.proto, f.port)
				if got != f.want {
					t.Errorf("%s -> %s %s/%d: allowed=%v, want %v", f.src, f.dst, f.proto, f.port, got, f.want)
				}
			}
			if tc.chains != nil {
				var names []string
				for _, ch := range rs.Chains {
					names = append(names, ch.Name)
				}
				slices.Sort(names)
				want := slices.Clone(tc.chains)
				slices.Sort(want)
				if !slices.Equal(names, want) {
					t.Errorf("chains %v, want %v", names, want)
				}
			}
			nftCheck(t, rs.render())
		})
	}
}

func TestLabelSelector(t *testing.T) {
	labels := map[string]string{"app": "web", "tier": "front"}
	cases := []struct {
		selector string
		want     bool
	}{
		{`{}`, true},
		{`{"matchLabels":{"app":"web"}}`, true},
		{`{"matchLabels":{"app":"web","tier":"back"}}`, false},
		{`{"matchExpressions":[{"key":"app","operator":"In","values":["db","web"]}]}`, true},
		{`{"matchExpressions":[{"key":"zone","operator":"In","values":["x"]}]}`, false},
		{`{"matchExpressions":[{"key":"app","operator":"NotIn","values":["web"]}]}`, false},
		{`{"matchExpressions":[{"key":"zone","operator":"NotIn","values":["x"]}]}`, true},
		{`{"matchExpressions":[{"key":"tier","operator":"Exists"}]}`, true},
		{`{"matchExpressions":[{"key":"zone","operator":"Exists"}]}`, false},
		{`{"matchExpressions":[{"key":"zone","operator":"DoesNotExist"}]}`, true},
		{`{"matchExpressions":[{"key":"app","operator":"DoesNotExist"}]}`, false},
		{`{"matchLabels":{"app":"web"},"matchExpressions":[{"key":"tier","operator":"In","values":["back"]}]}`, false},
		{`{"matchExpressions":[{"key":"app","operator":"Gt","values":["1"]}]}`, false},
	}
	for _, tc := range cases {
		var s labelSelector
		if err := json.Unmarshal([]byte(tc.selector), &s); err != nil {
			t.Fatal(err)
		}
		if got := s.matches(labels); got != tc.want {
			t.Errorf("%s matches %v = %v, want %v", tc.selector, labels, got, tc.want)
		}
	}
}

func TestRender(t *testing.T) {
	pods := testPods(t)
	policies := []networkPolicy{
		testPolicy(t, "a", "web", `{"podSelector":{"matchLabels":{"app":"web"}},"ingress":[{"from":[{"podSelector":{"matchLabels":{"app":"client"}}},{"ipBlock":{"cidr":"192.168.0.0/16","except":["192.168.1.0/24"]}}],"ports":[{"port":80},{"port":8000,"endPort":8100},{"port":"dns","protocol":"UDP"}]}]}`),
		testPolicy(t, "a", "client", `{"podSelector":{"matchLabels":{"app":"client"}},"policyTypes":["Egress"],"egress":[{"ports":[{"port":"http"}]}]}`),
	}
	script := compile(pods, testNamespaces, policies, netip.MustParseAddr(testNode)).render()
	for _, want := range []string{
		"table inet kindnet-netpol {}\ndelete table inet kindnet-netpol\ntable inet kindnet-netpol {\n",
		"\tchain ingress_a_web {\n",
		`ip saddr 10.244.0.11 tcp dport { 80, 8000-8100 } return comment "a/web ingress[0]"`,
		`ip saddr 192.168.0.0/16 ip saddr != 192.168.1.0/24 tcp dport { 80, 8000-8100 } return comment "a/web ingress[0]"`,
		`ip saddr 10.244.0.11 udp dport 53 return`,
		`meta l4proto tcp counter reject with tcp reset comment "deny a/web"`,
		`counter reject with icmpx type admin-prohibited comment "deny a/web"`,
		`ip daddr . tcp dport { 10.244.0.10 . 8080, 10.244.1.5 . 9000 } return comment "a/client egress[0]"`,
		"elements = { 10.244.0.10 : jump ingress_a_web }",
		"elements = { 10.244.0.11 : jump egress_a_client }",
		"ct state established,related accept\n\t\tip saddr vmap @egress_v4\n\t\tip6 saddr vmap @egress_v6\n\t\tip daddr vmap @ingress_v4\n",
		"type filter hook input priority filter; policy accept;",
	} {
		if !strings.Contains(script, want) {
			t.Errorf("script lacks %q:\n%s", want, script)
		}
	}
	if strings.Contains(script, " accept\n") && strings.Count(script, " accept\n") != 2 {
		t.Errorf("only the two base chains may accept (established traffic):\n%s", script)
	}
	nftCheck(t, script)
}

func TestRenderEmptyAndDualStack(t *testing.T) {
	empty := ruleset{}.render()
	if strings.Contains(empty, "elements") || !strings.Contains(empty, "map ingress_v4 {\n\t\ttype ipv4_addr : verdict\n\t}") {
		t.Errorf("empty table:\n%s", empty)
	}
	nftCheck(t, empty)

	web := testPod(t, "a", "web", "10.244.0.10", map[string]string{"app": "web"},
		`{"containers":[{"ports":[{"name":"http","containerPort":8080}]}]}`)
	web.Status.PodIPs = append(web.Status.PodIPs, struct {
		IP string `json:"ip"`
	}{"fd00:10:244::10"})
	client := testPod(t, "a", "client", "10.244.0.11", map[string]string{"app": "client"}, "")
	client.Status.PodIPs = append(client.Status.PodIPs, struct {
		IP string `json:"ip"`
	}{"fd00:10:244::11"})
	policies := []networkPolicy{
		testPolicy(t, "a", "p", `{"podSelector":{},"ingress":[{"from":[{"podSelector":{"matchLabels":{"app":"client"}}},{"ipBlock":{"cidr":"fd00:99::/64"}}]}],"egress":[{"ports":[{"port":"http"}]}]}`),
	}
	rs := compile([]pod{web, client}, testNamespaces, policies, netip.MustParseAddr(testNode))
	script := rs.render()
	for _, want := range []string{
		`ip saddr 10.244.0.11 return`, `ip6 saddr fd00:10:244::11 return`, `ip6 saddr fd00:99::/64 return`,
		`ip6 daddr . tcp dport { fd00:10:244::10 . 8080 } return`, "fd00:10:244::10 : jump ingress_a_web",
	} {
		if !strings.Contains(script, want) {
			t.Errorf("script lacks %q:\n%s", want, script)
		}
	}
	if !rs.allows(netip.MustParseAddr("fd00:10:244::11"), netip.MustParseAddr("fd00:10:244::10"), "tcp", 8080) {
		t.Error("IPv6 client to web:http denied")
	}
	nftCheck(t, script)
}

func TestChainNames(t *testing.T) {
	if got := chainName(ingress, "default", "web-0.example"); got != "ingress_default_web-0.example" {
		t.Errorf("chainName = %q", got)
	}
	long := chainName(egress, "ns", strings.Repeat("x", 253))
	if len(long) > 200 || !strings.HasPrefix(long, "egress_ns_") {
		t.Errorf("long chain name %q", long)
	}
	if long == chainName(egress, "ns", strings.Repeat("x", 252)+"y") {
		t.Error("long names collide")
	}
}

func TestDuplicateAddressKeepsTheScriptValid(t *testing.T) {
	a := testPod(t, "a", "one", "10.244.0.50", nil, "")
	b := testPod(t, "a", "two", "10.244.0.50", nil, "")
	np := testPolicy(t, "a", "deny", `{"podSelector":{}}`)
	script := compile([]pod{a, b}, testNamespaces, []networkPolicy{np}, netip.MustParseAddr(testNode)).render()
	if strings.Count(script, "10.244.0.50 : jump") != 1 {
		t.Errorf("address mapped twice:\n%s", script)
	}
	nftCheck(t, script)
}
