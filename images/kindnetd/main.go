// Command kindnetd is a small stand-in for kind's kindnetd, built here because kind's own kindnetd is not
// published as a Go module. It does the two things a kind cluster needs from its CNI daemon:
//   - writes the node's CNI config (ptp + host-local over the node's podCIDRs, portmap for hostPort);
//   - routes every other node's podCIDRs through that node's InternalIP.
//
// It talks to the API server with plain HTTPS and the pod's service account (no client library), and
// reconciles on a fixed period so nodes joining later are routed.
//
// It also enforces NetworkPolicy (netpol.go): pods, namespaces and policies are listed and watched
// (watch.go) and compiled into one nftables table, `table inet kindnet-netpol`, replaced atomically with
// `nft -f -` whenever it changes (enforcer.go). kind's own kindnetd embeds kube-network-policies instead,
// which needs the nft queue expression (CONFIG_NFT_QUEUE) that our machines' kernels lack.
package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

const (
	serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"
	cniConfigPath     = "/etc/cni/net.d/10-kindnet.conflist"
	period            = 10 * time.Second
)

type nodeList struct {
	Items []node `json:"items"`
}

type node struct {
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		PodCIDRs []string `json:"podCIDRs"`
	} `json:"spec"`
	Status struct {
		Addresses []struct {
			Type    string `json:"type"`
			Address string `json:"address"`
		} `json:"addresses"`
	} `json:"status"`
}

func (n node) internalIPs() []net.IP {
	var ips []net.IP
	for _, a := range n.Status.Addresses {
		if ip := net.ParseIP(a.Address); a.Type == "InternalIP" && ip != nil {
			ips = append(ips, ip)
		}
	}
	return ips
}

type apiClient struct {
	base      string
	tokenPath string
	http      *http.Client
	// watch has no overall timeout of its own: watches end when the server's timeoutSeconds runs out.
	watch *http.Client
}

func newAPIClient() (*apiClient, error) {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return nil, errors.New("KUBERNETES_SERVICE_HOST/PORT are not set: not running in a pod")
	}
	caPEM, err := os.ReadFile(filepath.Join(serviceAccountDir, "ca.crt"))
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("no certificate in the service account's ca.crt")
	}
	transport := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}
	return &apiClient{
		base:      "https://" + net.JoinHostPort(host, port),
		tokenPath: filepath.Join(serviceAccountDir, "token"),
		http:      &http.Client{Transport: transport, Timeout: 15 * time.Second},
		watch:     &http.Client{Transport: transport, Timeout: watchTimeout + 30*time.Second},
	}, nil
}

// get sends an authenticated GET; the caller closes the body of a response with status 200.
func (c *apiClient) get(client *http.Client, path string) (*http.Response, error) {
	// Bound service account tokens rotate, so the file is read for every request.
	token, err := os.ReadFile(c.tokenPath)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequest(http.MethodGet, c.base+path, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+string(bytes.TrimSpace(token)))
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, &httpError{path: path, code: resp.StatusCode}
	}
	return resp, nil
}

type httpError struct {
	path string
	code int
}

func (e *httpError) Error() string { return fmt.Sprintf("GET %s: HTTP %d", e.path, e.code) }

func (c *apiClient) nodes() ([]node, error) {
	resp, err := c.get(c.http, "/api/v1/nodes")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var list nodeList
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		return nil, err
	}
	return list.Items, nil
}

type cniRange struct {
	Subnet string `json:"subnet"`
}

type cniRoute struct {
	Dst string `json:"dst"`
}

// cniConfig renders the conflist for this node's pod CIDRs. ipMasq lets pods reach addresses outside the
// node's pod range (other nodes, the host) with the node's address as source.
func cniConfig(podCIDRs []string) ([]byte, error) {
	var ranges [][]cniRange
	var routes []cniRoute
	for _, cidr := range podCIDRs {
		ip, _, err := net.ParseCIDR(cidr)
		if err != nil {
			return nil, fmt.Errorf("podCIDR %q: %w", cidr, err)
		}
		ranges = append(ranges, []cniRange{{Subnet: cidr}})
		if ip.To4() != nil {
			routes = append(routes, cniRoute{Dst: "0.0.0.0/0"})
		} else {
			routes = append(routes, cniRoute{Dst: "::/0"})
		}
	}
	conf := map[string]any{
		"cniVersion": "0.3.1",
		"name":       "kindnet",
		"plugins": []any{
			map[string]any{
				"type":   "ptp",
				"ipMasq": true,
				"mtu":    1500,
				"ipam": map[string]any{
					"type":    "host-local",
					"dataDir": "/run/cni-ipam-state",
					"routes":  routes,
					"ranges":  ranges,
				},
			},
			map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}},
		},
	}
	return json.MarshalIndent(conf, "", "  ")
}

// writeIfChanged replaces the file atomically so the container runtime never reads half a config.
func writeIfChanged(path string, data []byte) (bool, error) {
	if current, err := os.ReadFile(path); err == nil && bytes.Equal(current, data) {
		return false, nil
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return false, err
	}
	return true, os.Rename(tmp, path)
}

func sameFamily(a net.IP, cidr string) bool {
	ip, _, err := net.ParseCIDR(cidr)
	return err == nil && (ip.To4() != nil) == (a.To4() != nil)
}

func reconcile(c *apiClient, hostIP net.IP) error {
	nodes, err := c.nodes()
	if err != nil {
		return err
	}
	var self *node
	for i := range nodes {
		for _, ip := range nodes[i].internalIPs() {
			if ip.Equal(hostIP) {
				self = &nodes[i]
			}
		}
	}
	if self == nil {
		return fmt.Errorf("no node has InternalIP %s yet", hostIP)
	}
	if len(self.Spec.PodCIDRs) == 0 {
		return fmt.Errorf("node %s has no podCIDRs yet", self.Metadata.Name)
	}
	conf, err := cniConfig(self.Spec.PodCIDRs)
	if err != nil {
		return err
	}
	changed, err := writeIfChanged(cniConfigPath, conf)
	if err != nil {
		return err
	}
	if changed {
		log.Printf("wrote %s for podCIDRs %v", cniConfigPath, self.Spec.PodCIDRs)
	}
	for _, n := range nodes {
		if n.Metadata.Name == self.Metadata.Name {
			continue
		}
		for _, cidr := range n.Spec.PodCIDRs {
			for _, gw := range n.internalIPs() {
				if !sameFamily(gw, cidr) {
					continue
				}
				out, err := exec.Command("ip", "route", "replace", cidr, "via", gw.String()).CombinedOutput()
				if err != nil {
					return fmt.Errorf("route %s via %s: %v: %s", cidr, gw, err, out)
				}
			}
		}
	}
	return nil
}

func main() {
	hostIP := net.ParseIP(os.Getenv("HOST_IP"))
	if hostIP == nil {
		log.Fatalf("HOST_IP=%q is not an IP address", os.Getenv("HOST_IP"))
	}
	client, err := newAPIClient()
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("kindnetd on %s, pod subnet %s", hostIP, os.Getenv("POD_SUBNET"))
	nodeIP, _ := netip.ParseAddr(hostIP.String())
	go runNetworkPolicy(client, nodeIP)
	for {
		if err := reconcile(client, hostIP); err != nil {
			log.Printf("reconcile: %v", err)
		}
		time.Sleep(period)
	}
}
