package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strconv"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// topologyKey pins volumes to the node whose state directory holds them: the PersistentVolume gets node
// affinity for it, so pods using a volume are scheduled where its directory is.
const topologyKey = "topology.hostpath.csi.shadow.dev/node"

// driver serves the CSI Identity, Controller and Node services from one process: volumes are local
// directories, so the controller must run on the node that holds them.
type driver struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedControllerServer
	csi.UnimplementedNodeServer

	name    string
	version string
	nodeID  string
	store   *store
	mounter mounter
}

func (d *driver) topology() *csi.Topology {
	return &csi.Topology{Segments: map[string]string{topologyKey: d.nodeID}}
}

// ------------------------------------------------------------------------------------------ Identity

func (d *driver) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: d.name, VendorVersion: d.version}, nil
}

func (d *driver) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	service := func(t csi.PluginCapability_Service_Type) *csi.PluginCapability {
		return &csi.PluginCapability{Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{Type: t}}}
	}
	return &csi.GetPluginCapabilitiesResponse{Capabilities: []*csi.PluginCapability{
		service(csi.PluginCapability_Service_CONTROLLER_SERVICE),
		service(csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS),
	}}, nil
}

func (d *driver) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	if _, err := os.Stat(d.store.root); err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "state directory: %v", err)
	}
	return &csi.ProbeResponse{}, nil
}

// ---------------------------------------------------------------------------------------- Controller

var controllerCapabilities = []csi.ControllerServiceCapability_RPC_Type{
	csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
	csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT,
	csi.ControllerServiceCapability_RPC_CLONE_VOLUME,
	csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS,
}

func (d *driver) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	var caps []*csi.ControllerServiceCapability
	for _, t := range controllerCapabilities {
		caps = append(caps, &csi.ControllerServiceCapability{
			Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: t}},
		})
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}

// checkCapabilities accepts filesystem volumes used from this node (Kubernetes' ReadWriteOnce and
// ReadOnlyMany-on-one-node): block volumes and multi-node access modes cannot be served by a local
// directory, and the single-writer modes would need the SINGLE_NODE_MULTI_WRITER capability, which needs
// publishes to be tracked.
func checkCapabilities(caps []*csi.VolumeCapability) error {
	if len(caps) == 0 {
		return status.Error(codes.InvalidArgument, "volume capabilities are required")
	}
	for _, c := range caps {
		if c.GetMount() == nil {
			return status.Error(codes.InvalidArgument, "only filesystem (mount) volumes are supported")
		}
		switch c.GetAccessMode().GetMode() {
		case csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER,
			csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY:
		default:
			return status.Errorf(codes.InvalidArgument, "access mode %v is not supported (volumes are local to one node)",
				c.GetAccessMode().GetMode())
		}
	}
	return nil
}

// storeError maps the store's errors to gRPC codes.
func storeError(what string, err error) error {
	switch {
	case errors.Is(err, errNotFound):
		return status.Errorf(codes.NotFound, "%s: %v", what, err)
	case errors.Is(err, errAlreadyExists):
		return status.Errorf(codes.AlreadyExists, "%s: %v", what, err)
	default:
		return status.Errorf(codes.Internal, "%s: %v", what, err)
	}
}

func (d *driver) CreateVolume(_ context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "name is required")
	}
	if err := checkCapabilities(req.GetVolumeCapabilities()); err != nil {
		return nil, err
	}
	if err := d.checkAccessible(req.GetAccessibilityRequirements()); err != nil {
		return nil, err
	}
	required, limit := req.GetCapacityRange().GetRequiredBytes(), req.GetCapacityRange().GetLimitBytes()
	if required < 0 || limit < 0 || (limit > 0 && required > limit) {
		return nil, status.Errorf(codes.OutOfRange, "capacity range %d..%d is invalid", required, limit)
	}
	// A directory has no size of its own: the capacity is recorded, not enforced.
	capacity := required
	if capacity == 0 {
		capacity = limit
	}
	var fromSnapshot, fromVolume string
	source := req.GetVolumeContentSource()
	switch {
	case source == nil:
	case source.GetSnapshot() != nil:
		fromSnapshot = source.GetSnapshot().GetSnapshotId()
	case source.GetVolume() != nil:
		fromVolume = source.GetVolume().GetVolumeId()
	default:
		return nil, status.Error(codes.InvalidArgument, "unsupported volume content source")
	}
	rec, err := d.store.CreateVolume(req.GetName(), capacity, fromSnapshot, fromVolume)
	if err != nil {
		return nil, storeError("create volume "+req.GetName(), err)
	}
	if rec.Method != "" {
		log.Printf("volume %s (%s) created from %s%s by %s", rec.ID, rec.Name, rec.SourceSnapshotID, rec.SourceVolumeID, rec.Method)
	}
	return &csi.CreateVolumeResponse{Volume: &csi.Volume{
		VolumeId:           rec.ID,
		CapacityBytes:      rec.CapacityBytes,
		ContentSource:      source,
		AccessibleTopology: []*csi.Topology{d.topology()},
	}}, nil
}

// checkAccessible refuses a volume that must be reachable from other nodes only: its directory would be
// on this one.
func (d *driver) checkAccessible(req *csi.TopologyRequirement) error {
	if len(req.GetRequisite()) == 0 {
		return nil
	}
	for _, t := range req.GetRequisite() {
		if node, ok := t.GetSegments()[topologyKey]; !ok || node == d.nodeID {
			return nil
		}
	}
	return status.Errorf(codes.ResourceExhausted, "the volume cannot be accessible from node %s", d.nodeID)
}

func (d *driver) DeleteVolume(_ context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	}
	if err := d.store.DeleteVolume(req.GetVolumeId()); err != nil {
		return nil, storeError("delete volume "+req.GetVolumeId(), err)
	}
	return &csi.DeleteVolumeResponse{}, nil
}

func (d *driver) ValidateVolumeCapabilities(_ context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "volume capabilities are required")
	}
	if _, err := d.store.GetVolume(req.GetVolumeId()); err != nil {
		return nil, storeError("volume "+req.GetVolumeId(), err)
	}
	if err := checkCapabilities(req.GetVolumeCapabilities()); err != nil {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: status.Convert(err).Message()}, nil
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
	}}, nil
}

func snapshotMessage(rec snapshotRecord) *csi.Snapshot {
	return &csi.Snapshot{
		SnapshotId:     rec.ID,
		SourceVolumeId: rec.SourceVolumeID,
		SizeBytes:      rec.SizeBytes,
		CreationTime:   timestamppb.New(rec.Created),
		// The copy is complete when the record exists: there is no upload phase.
		ReadyToUse: true,
	}
}

func (d *driver) CreateSnapshot(_ context.Context, req *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error) {
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "name is required")
	}
	if req.GetSourceVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "source_volume_id is required")
	}
	rec, err := d.store.CreateSnapshot(req.GetName(), req.GetSourceVolumeId())
	if err != nil {
		return nil, storeError("create snapshot "+req.GetName(), err)
	}
	log.Printf("snapshot %s (%s) of volume %s: %d bytes by %s", rec.ID, rec.Name, rec.SourceVolumeID, rec.SizeBytes, rec.Method)
	return &csi.CreateSnapshotResponse{Snapshot: snapshotMessage(rec)}, nil
}

func (d *driver) DeleteSnapshot(_ context.Context, req *csi.DeleteSnapshotRequest) (*csi.DeleteSnapshotResponse, error) {
	if req.GetSnapshotId() == "" {
		return nil, status.Error(codes.InvalidArgument, "snapshot_id is required")
	}
	if err := d.store.DeleteSnapshot(req.GetSnapshotId()); err != nil {
		return nil, storeError("delete snapshot "+req.GetSnapshotId(), err)
	}
	return &csi.DeleteSnapshotResponse{}, nil
}

// ListSnapshots pages through the snapshots in ID order; the token is the index of the next entry.
func (d *driver) ListSnapshots(_ context.Context, req *csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error) {
	all, err := d.store.ListSnapshots()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "list snapshots: %v", err)
	}
	var matching []snapshotRecord
	for _, rec := range all {
		if (req.GetSnapshotId() == "" || rec.ID == req.GetSnapshotId()) &&
			(req.GetSourceVolumeId() == "" || rec.SourceVolumeID == req.GetSourceVolumeId()) {
			matching = append(matching, rec)
		}
	}
	start := 0
	if token := req.GetStartingToken(); token != "" {
		start, err = strconv.Atoi(token)
		if err != nil || start < 0 || start > len(matching) {
			return nil, status.Errorf(codes.Aborted, "starting_token %q is not valid", token)
		}
	}
	end := len(matching)
	if max := int(req.GetMaxEntries()); max > 0 && start+max < end {
		end = start + max
	}
	resp := &csi.ListSnapshotsResponse{}
	for _, rec := range matching[start:end] {
		resp.Entries = append(resp.Entries, &csi.ListSnapshotsResponse_Entry{Snapshot: snapshotMessage(rec)})
	}
	if end < len(matching) {
		resp.NextToken = strconv.Itoa(end)
	}
	return resp, nil
}

// ---------------------------------------------------------------------------------------------- Node

func (d *driver) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{NodeId: d.nodeID, AccessibleTopology: d.topology()}, nil
}

func (d *driver) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	// No staging: a bind mount needs no per-node preparation.
	return &csi.NodeGetCapabilitiesResponse{}, nil
}

// NodePublishVolume bind-mounts the volume's directory at the target path (read-only when asked).
func (d *driver) NodePublishVolume(_ context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	switch {
	case req.GetVolumeId() == "":
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	case req.GetTargetPath() == "":
		return nil, status.Error(codes.InvalidArgument, "target_path is required")
	case req.GetVolumeCapability() == nil:
		return nil, status.Error(codes.InvalidArgument, "volume_capability is required")
	}
	if err := checkCapabilities([]*csi.VolumeCapability{req.GetVolumeCapability()}); err != nil {
		return nil, err
	}
	if _, err := d.store.GetVolume(req.GetVolumeId()); err != nil {
		return nil, storeError("volume "+req.GetVolumeId(), err)
	}
	target := filepath.Clean(req.GetTargetPath())
	mounted, err := d.mounter.IsMountPoint(target)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "inspect %s: %v", target, err)
	}
	if mounted {
		return &csi.NodePublishVolumeResponse{}, nil
	}
	// The CO makes the parent; the target itself is the plugin's to create (CSI spec, NodePublishVolume).
	if err := os.MkdirAll(target, 0o750); err != nil {
		return nil, status.Errorf(codes.Internal, "create %s: %v", target, err)
	}
	if err := d.mounter.Bind(d.store.VolumePath(req.GetVolumeId()), target, req.GetReadonly()); err != nil {
		return nil, status.Errorf(codes.Internal, "bind mount at %s: %v", target, err)
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

func (d *driver) NodeUnpublishVolume(_ context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	switch {
	case req.GetVolumeId() == "":
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	case req.GetTargetPath() == "":
		return nil, status.Error(codes.InvalidArgument, "target_path is required")
	}
	target := filepath.Clean(req.GetTargetPath())
	mounted, err := d.mounter.IsMountPoint(target)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "inspect %s: %v", target, err)
	}
	if mounted {
		if err := d.mounter.Unmount(target); err != nil {
			return nil, status.Errorf(codes.Internal, "unmount %s: %v", target, err)
		}
	}
	if err := os.Remove(target); err != nil && !os.IsNotExist(err) {
		return nil, status.Errorf(codes.Internal, "remove %s: %v", target, err)
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

func (d *driver) String() string { return fmt.Sprintf("%s %s on node %s", d.name, d.version, d.nodeID) }
