// Command csi-hostpath is a small CSI driver for the project's kind test cluster: volumes are directories
// on the node, snapshots are copies of them (reflinks where the filesystem supports them), and volumes can
// be created from a snapshot or cloned from another volume. It serves the Identity, Controller and Node
// services on one socket and, with --registration-dir, registers itself with the kubelet. Not for
// production: capacity is not enforced and data lives on one node. See README.md.
package main

import (
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// version is stamped at build time (-X main.version=...).
var version = "dev"

func main() {
	var (
		endpoint        = flag.String("endpoint", "unix:///csi/csi.sock", "CSI endpoint (unix socket)")
		driverName      = flag.String("driver-name", "hostpath.csi.shadow.dev", "CSI driver name")
		nodeID          = flag.String("node-id", "", "this node's name (default: $NODE_NAME, else the hostname)")
		stateDir        = flag.String("state-dir", "/var/lib/csi-hostpath", "where volumes and snapshots are kept")
		registrationDir = flag.String("registration-dir", "", "the kubelet's plugins_registry directory, as mounted here; empty: do not register")
		kubeletEndpoint = flag.String("kubelet-registration-path", "", "the CSI socket's path on the node, told to the kubelet")
	)
	flag.Parse()
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	if err := run(*endpoint, *driverName, *nodeID, *stateDir, *registrationDir, *kubeletEndpoint); err != nil {
		log.Fatal(err)
	}
}

func run(endpoint, driverName, nodeID, stateDir, registrationDir, kubeletEndpoint string) error {
	if nodeID == "" {
		nodeID = os.Getenv("NODE_NAME")
	}
	if nodeID == "" {
		host, err := os.Hostname()
		if err != nil {
			return err
		}
		nodeID = host
	}
	st, err := newStore(stateDir)
	if err != nil {
		return fmt.Errorf("state directory %s: %w", stateDir, err)
	}
	if ok, err := reflinkSupported(filepath.Join(stateDir, "tmp")); err != nil {
		log.Printf("reflink probe in %s failed: %v", stateDir, err)
	} else if ok {
		log.Printf("%s supports reflinks: snapshots and clones share blocks with their source", stateDir)
	} else {
		log.Printf("%s has no reflinks: snapshots and clones are full copies", stateDir)
	}
	d := &driver{name: driverName, version: version, nodeID: nodeID, store: st, mounter: linuxMounter{}}

	csiListener, err := listenUnix(endpoint)
	if err != nil {
		return err
	}
	server := grpc.NewServer(grpc.UnaryInterceptor(logErrors))
	csi.RegisterIdentityServer(server, d)
	csi.RegisterControllerServer(server, d)
	csi.RegisterNodeServer(server, d)
	errs := make(chan error, 2)
	go func() { errs <- server.Serve(csiListener) }()
	log.Printf("%s serving CSI on %s", d, endpoint)

	if registrationDir != "" {
		if kubeletEndpoint == "" {
			return errors.New("--kubelet-registration-path is required with --registration-dir")
		}
		regListener, err := listenUnix("unix://" + filepath.Join(registrationDir, driverName+"-reg.sock"))
		if err != nil {
			return err
		}
		regServer := grpc.NewServer()
		registerapi.RegisterRegistrationServer(regServer, &registrar{driverName: driverName, endpoint: kubeletEndpoint})
		go func() { errs <- regServer.Serve(regListener) }()
		defer regServer.Stop()
	}

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	select {
	case sig := <-signals:
		log.Printf("%v: stopping", sig)
		server.GracefulStop()
		return nil
	case err := <-errs:
		return err
	}
}

// listenUnix listens on a unix:// endpoint, replacing a socket left by an earlier run.
func listenUnix(endpoint string) (net.Listener, error) {
	u, err := url.Parse(endpoint)
	if err != nil || u.Scheme != "unix" {
		return nil, fmt.Errorf("endpoint %q: only unix:///path sockets are supported", endpoint)
	}
	path := u.Path
	if path == "" {
		path = strings.TrimPrefix(endpoint, "unix://")
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, err
	}
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	return net.Listen("unix", path)
}
