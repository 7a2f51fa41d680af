package main

import (
	"context"
	"log"
	"os"

	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// registrar answers the kubelet's plugin watcher, which finds <driver>-reg.sock in
// /var/lib/kubelet/plugins_registry and asks it where the CSI socket is. It is the part of
// node-driver-registrar a kubelet needs (that module is not served by the Go module proxy here).
type registrar struct {
	registerapi.UnimplementedRegistrationServer

	driverName string
	// endpoint is the CSI socket's path as the kubelet sees it (on the node, not in this container).
	endpoint string
	// exit ends the process when the kubelet refuses the plugin, so the pod restarts and registers again
	// (what node-driver-registrar does).
	exit func(code int)
}

func (r *registrar) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              r.driverName,
		Endpoint:          r.endpoint,
		SupportedVersions: []string{"1.0.0"},
	}, nil
}

func (r *registrar) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if !st.PluginRegistered {
		log.Printf("the kubelet refused to register %s: %s", r.driverName, st.Error)
		if r.exit != nil {
			r.exit(1)
		} else {
			os.Exit(1)
		}
	}
	log.Printf("registered with the kubelet as %s (CSI socket %s)", r.driverName, r.endpoint)
	return &registerapi.RegistrationStatusResponse{}, nil
}
