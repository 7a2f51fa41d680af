package main

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// The kubelet's side of plugin registration, over a real socket: GetInfo, then NotifyRegistrationStatus.
func TestRegistrationAnswersTheKubelet(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "hostpath.csi.shadow.dev-reg.sock")
	listener, err := listenUnix("unix://" + sock)
	if err != nil {
		t.Fatal(err)
	}
	exited := make(chan int, 1)
	server := grpc.NewServer()
	registerapi.RegisterRegistrationServer(server, &registrar{
		driverName: "hostpath.csi.shadow.dev",
		endpoint:   "/var/lib/kubelet/plugins/hostpath.csi.shadow.dev/csi.sock",
		exit:       func(code int) { exited <- code },
	})
	go func() { _ = server.Serve(listener) }()
	t.Cleanup(server.Stop)

	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	client := registerapi.NewRegistrationClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	info, err := client.GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.Type != registerapi.CSIPlugin || info.Name != "hostpath.csi.shadow.dev" ||
		info.Endpoint != "/var/lib/kubelet/plugins/hostpath.csi.shadow.dev/csi.sock" ||
		len(info.SupportedVersions) != 1 || info.SupportedVersions[0] != "1.0.0" {
		t.Errorf("GetInfo = %v", info)
	}
	if _, err := client.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-exited:
		t.Fatalf("exited with %d after a successful registration", code)
	default:
	}
	// A refusal ends the process so that the pod restarts and registers again.
	_, _ = client.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{Error: "version mismatch"})
	if code := <-exited; code != 1 {
		t.Errorf("exit code %d after a refusal", code)
	}
}
