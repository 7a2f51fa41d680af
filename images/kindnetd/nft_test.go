package main

// Checks against the real nft and kernel, run only as root with nft and ip installed (skipped otherwise).
// Everything happens in network namespaces created here: no rule is ever loaded into the host's own
// namespace.

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The test binary doubles as the listener and the client inside the namespaces (see TestMain).
const helperEnv = "KINDNETD_NETNS_HELPER"

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "listen":
		listen(strings.Fields(os.Getenv("LISTEN")))
	case "dial":
		os.Exit(dial(os.Getenv("DIAL")))
	}
	code := m.Run()
	if checkNS != "" {
		_ = exec.Command("ip", "netns", "del", checkNS).Run()
	}
	os.Exit(code)
}

func listen(addrs []string) {
	for _, a := range addrs {
		l, err := net.Listen("tcp", a)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
	}
	fmt.Println("ready")
	select {}
}

// dial exits 0 when connected, 1 when refused, 2 on timeout, 3 otherwise.
func dial(addr string) int {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	var netErr net.Error
	switch {
	case err == nil:
		c.Close()
		return 0
	case errors.Is(err, syscall.ECONNREFUSED):
		return 1
	case errors.As(err, &netErr) && netErr.Timeout():
		return 2
	default:
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
}

func nftUsable() bool {
	if os.Geteuid() != 0 {
		return false
	}
	for _, tool := range []string{"nft", "ip"} {
		if _, err := exec.LookPath(tool); err != nil {
			return false
		}
	}
	return true
}

var (
	checkNS     string
	checkNSOnce sync.Once
	checkNSErr  error
)

// nftCheck validates a script with `nft -c` (parsed and checked by the kernel, not applied) in a
// namespace of its own.
func nftCheck(t *testing.T, script string) {
	t.Helper()
	if !nftUsable() {
		t.Log("nft -c skipped: needs root, nft and ip")
		return
	}
	checkNSOnce.Do(func() {
		name := fmt.Sprintf("kindnetd-check-%d", os.Getpid())
		if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
			checkNSErr = fmt.Errorf("ip netns add: %v: %s", err, out)
			return
		}
		checkNS = name
	})
	if checkNSErr != nil {
		t.Fatal(checkNSErr)
	}
	cmd := exec.Command("ip", "netns", "exec", checkNS, "nft", "-c", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft -c rejected the script: %v\n%s\n--- script ---\n%s", err, out, script)
	}
}

// netnsLab is a node namespace routing to pod namespaces over veth pairs, as the ptp CNI plugin does:
// every pod has a /32 and a default route via 10.244.0.1, which each node-side veth carries.
type netnsLab struct {
	t      *testing.T
	prefix string
	node   string
	pods   map[string]string // pod IP -> namespace
}

func newNetnsLab(t *testing.T) *netnsLab {
	lab := &netnsLab{t: t, prefix: fmt.Sprintf("kn%d", os.Getpid()%100000), pods: map[string]string{}}
	lab.node = lab.prefix + "-node"
	t.Cleanup(func() {
		for _, ns := range append(mapValues(lab.pods), lab.node) {
			_ = exec.Command("ip", "netns", "del", ns).Run()
		}
	})
	lab.run("ip", "netns", "add", lab.node)
	lab.in(lab.node, "ip", "link", "set", "lo", "up")
	lab.in(lab.node, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	lab.in(lab.node, "ip", "addr", "add", testNode+"/32", "dev", "lo") // the node's InternalIP
	return lab
}

func mapValues(m map[string]string) []string {
	var out []string
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

func (lab *netnsLab) run(args ...string) {
	lab.t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		lab.t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
}

func (lab *netnsLab) in(ns string, args ...string) {
	lab.t.Helper()
	lab.run(append([]string{"ip", "netns", "exec", ns}, args...)...)
}

func (lab *netnsLab) addPod(ip string) {
	suffix := strings.ReplaceAll(ip, ".", "")[len("10244"):]
	ns, veth := lab.prefix+"-p"+suffix, "v"+suffix
	lab.pods[ip] = ns
	lab.run("ip", "netns", "add", ns)
	lab.in(lab.node, "ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
	lab.in(lab.node, "ip", "addr", "add", "10.244.0.1/32", "dev", veth)
	lab.in(lab.node, "ip", "link", "set", veth, "up")
	lab.in(lab.node, "ip", "route", "add", ip+"/32", "dev", veth)
	lab.in(ns, "ip", "link", "set", "lo", "up")
	lab.in(ns, "ip", "addr", "add", ip+"/32", "dev", "eth0")
	lab.in(ns, "ip", "link", "set", "eth0", "up")
	lab.in(ns, "ip", "route", "add", "10.244.0.1", "dev", "eth0")
	lab.in(ns, "ip", "route", "add", "default", "via", "10.244.0.1")
}

// serve starts a listener on addresses inside a namespace and waits until it is ready.
func (lab *netnsLab) serve(ns string, addrs ...string) {
	lab.t.Helper()
	cmd := exec.Command("ip", "netns", "exec", ns, os.Args[0])
	cmd.Env = append(os.Environ(), helperEnv+"=listen", "LISTEN="+strings.Join(addrs, " "))
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		lab.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		lab.t.Fatal(err)
	}
	lab.t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	buf := make([]byte, 6)
	if _, err := stdout.Read(buf); err != nil || string(buf) != "ready\n" {
		lab.t.Fatalf("listener in %s on %v did not start: %v %q", ns, addrs, err, buf)
	}
}

// connect reports "connected", "refused", "timeout" or an error, for a TCP connection from a namespace.
func (lab *netnsLab) connect(fromNS, addr string) string {
	cmd := exec.Command("ip", "netns", "exec", fromNS, os.Args[0])
	cmd.Env = append(os.Environ(), helperEnv+"=dial", "DIAL="+addr)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return "connected"
	case errors.As(err, &exit) && exit.ExitCode() == 1:
		return "refused"
	case errors.As(err, &exit) && exit.ExitCode() == 2:
		return "timeout"
	default:
		return fmt.Sprintf("error %v: %s", err, out)
	}
}

func (lab *netnsLab) apply(script string) {
	lab.t.Helper()
	cmd := exec.Command("ip", "netns", "exec", lab.node, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		lab.t.Fatalf("nft -f: %v: %s", err, out)
	}
}

// TestPacketsInNetworkNamespaces applies compiled rulesets in a node namespace and makes real TCP
// connections between pod namespaces, to the node's own address, and from the node.
func TestPacketsInNetworkNamespaces(t *testing.T) {
	if !nftUsable() {
		t.Skip("needs root, nft and ip")
	}
	lab := newNetnsLab(t)
	for _, ip := range []string{aWeb, aClient, bClient} {
		lab.addPod(ip)
	}
	lab.serve(lab.pods[aWeb], aWeb+":80", aWeb+":8080")
	lab.serve(lab.pods[bClient], bClient+":8080")
	lab.serve(lab.node, testNode+":6443")

	pods := testPods(t)
	policies := []networkPolicy{
		testPolicy(t, "a", "web", `{"podSelector":{"matchLabels":{"app":"web"}},"ingress":[{"from":[{"podSelector":{"matchLabels":{"app":"client"}}}],"ports":[{"port":"http"}]}]}`),
		testPolicy(t, "a", "client", `{"podSelector":{"matchLabels":{"app":"client"}},"policyTypes":["Egress"],"egress":[{"to":[{"podSelector":{"matchLabels":{"app":"web"}}}]},{"to":[{"ipBlock":{"cidr":"`+testNode+`/32"}}],"ports":[{"port":6443}]}]}`),
	}
	nodeIP := netip.MustParseAddr(testNode)
	enforced := compile(pods, testNamespaces, policies, nodeIP).render()
	lab.apply(enforced)
	lab.apply(enforced) // replacing the table with itself works too

	checks := []struct {
		from, to, want string
	}{
		{lab.pods[aClient], aWeb + ":8080", "connected"},     // egress and ingress both allow
		{lab.pods[aClient], aWeb + ":80", "refused"},         // web's ingress: only its "http" port
		{lab.pods[bClient], aWeb + ":8080", "refused"},       // web's ingress: not from namespace b
		{lab.pods[aClient], bClient + ":8080", "refused"},    // client's egress: only web
		{lab.pods[aClient], testNode + ":6443", "connected"}, // input hook, allowed by ipBlock
		{lab.pods[bClient], testNode + ":6443", "connected"}, // not isolated
		{lab.pods[aWeb], bClient + ":8080", "connected"},     // neither side isolated that way
		{lab.node, aWeb + ":80", "connected"},                // the node (kubelet probes) always reaches pods
		{lab.pods[bClient], aClient + ":9", "refused"},       // no listener: the kernel refuses, no policy
		{lab.pods[aWeb], aWeb + ":8080", "connected"},        // loopback within a pod never leaves it
	}
	for _, c := range checks {
		if got := lab.connect(c.from, c.to); got != c.want {
			t.Errorf("%s -> %s: %s, want %s", c.from, c.to, got, c.want)
		}
	}

	lab.apply(compile(pods, testNamespaces, nil, nodeIP).render()) // every policy deleted
	for _, c := range [][2]string{{lab.pods[bClient], aWeb + ":80"}, {lab.pods[aClient], bClient + ":8080"}} {
		if got := lab.connect(c[0], c[1]); got != "connected" {
			t.Errorf("without policies %s -> %s: %s", c[0], c[1], got)
		}
	}
}
