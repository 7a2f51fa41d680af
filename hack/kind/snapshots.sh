#!/usr/bin/env bash
# Snapshot-capable storage on the project's kind cluster: the VolumeSnapshot CRDs, the snapshot
# controller, the project's host-path CSI driver with csi-provisioner and csi-snapshotter, the
# StorageClass `shadow-snapshots` (not the default) and the VolumeSnapshotClass `shadow-snapshots`.
# Everything is built offline: hack/build-tools.sh snapshots (binaries and CRDs), hack/images.sh
# snapshots (images, pushed to the local registry).
#
# The driver keeps volumes and snapshots under /var/lib/csi-hostpath on the node. `up` puts an XFS filesystem
# with reflink there (an image file in the node's /var volume, loop-mounted inside the node), so snapshots,
# restores and clones are reflink copies: copy-on-write, their cost independent of the data's size. Where
# mkfs.xfs or loop devices are missing, the directory stays on the node's own filesystem and the driver makes
# plain copies (it says which in its log).
#
#   hack/kind/snapshots.sh up        # build what is missing, apply, wait until the driver is registered
#   hack/kind/snapshots.sh render    # print the manifests with the image references filled in
#   hack/kind/snapshots.sh down      # delete it all again (volumes of the class must be gone first)
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

MANIFESTS="${HACK_DIR}/kind/snapshots"
CRDS="${SHADOW_CACHE}/share/snapshot-crds-${SNAPSHOTTER_CLIENT_VERSION}"
DRIVER=hostpath.csi.shadow.dev

kube() { kubectl --kubeconfig "$("${HACK_DIR}/kind/cluster.sh" kubeconfig)" "$@"; }

# render: the manifests with @NAME_IMAGE@ replaced by SHADOW_NAME_IMAGE from `hack/images.sh env`.
render() {
  local env
  env=$("${HACK_DIR}/images.sh" env 2>/dev/null) || die "no images pushed yet: run hack/images.sh"
  grep -q '^SHADOW_CSI_HOSTPATH_IMAGE=' <<<"$env" || die "no snapshot images pushed yet: run hack/images.sh snapshots"
  local args=() line
  while read -r line; do
    [[ $line == SHADOW_*_IMAGE=* ]] || continue
    line=${line#SHADOW_}
    args+=(-e "s#@${line%%=*}@#${line#*=}#g")
  done <<<"$env"
  local out
  out=$(for f in "${MANIFESTS}/snapshot-controller.yaml" "${MANIFESTS}/csi-hostpath.yaml"; do
    echo "---"
    sed "${args[@]}" "$f"
  done)
  if grep -n '@[A-Z_]*_IMAGE@' <<<"$out" >&2; then die "image references left unfilled (above)"; fi
  printf '%s\n' "$out"
}

NODE="${SHADOW_KIND_CLUSTER:-shadow}-control-plane"
XFS_SIZE="${SHADOW_CSI_XFS_SIZE:-20G}"

# reflink_storage: mount a reflink-capable XFS at the driver's state directory on the node (idempotent).
# Prints "mounted" when it mounted it in this call (a running driver must then restart to see it).
reflink_storage() {
  if docker exec "$NODE" grep -q ' /var/lib/csi-hostpath xfs ' /proc/mounts; then
    info "driver storage: XFS with reflink (copy-on-write snapshots)" >&2
    return
  fi
  local var_dir
  var_dir=$(docker inspect -f '{{range .Mounts}}{{if eq .Destination "/var"}}{{.Source}}{{end}}{{end}}' "$NODE")
  if ! command -v mkfs.xfs >/dev/null; then
    (apt_install xfsprogs) >&2 || true # optional: without it snapshots are plain copies
  fi
  if ! command -v mkfs.xfs >/dev/null || [[ -z $var_dir || ! -d $var_dir ]]; then
    info "driver storage: the node's filesystem (no mkfs.xfs or node volume): snapshots are full copies" >&2
    return
  fi
  local image="${var_dir}/lib/csi-hostpath.xfs"
  if [[ ! -f $image ]]; then
    truncate -s "$XFS_SIZE" "${image}.partial"
    mkfs.xfs -q -m reflink=1 "${image}.partial"
    mv "${image}.partial" "$image"
  fi
  # Loop devices are the host kernel's; the node's /dev lacks their nodes, so make them first.
  if ! docker exec "$NODE" sh -euc '
      [ -e /dev/loop-control ] || mknod /dev/loop-control c 10 237
      for i in $(seq 0 63); do [ -e /dev/loop$i ] || mknod /dev/loop$i b 7 $i; done
      mkdir -p /var/lib/csi-hostpath
      if [ -n "$(find /var/lib/csi-hostpath/volumes /var/lib/csi-hostpath/snapshots -mindepth 1 -print -quit 2>/dev/null)" ]; then
        echo "/var/lib/csi-hostpath holds volumes already: leaving it on the node filesystem" >&2; exit 3
      fi
      dev=$(losetup -f --show /var/lib/csi-hostpath.xfs)
      mount -t xfs "$dev" /var/lib/csi-hostpath' >&2; then
    info "driver storage: the node's filesystem (the XFS image could not be mounted): snapshots are full copies" >&2
    return
  fi
  info "driver storage: XFS with reflink, ${XFS_SIZE} (copy-on-write snapshots)" >&2
  echo mounted
}

up() {
  [[ -f "$CRDS/.complete" ]] || "${HACK_DIR}/build-tools.sh" snapshots
  "${HACK_DIR}/images.sh" snapshots
  step "driver storage on the node"
  local storage
  storage=$(reflink_storage)
  step "applying the VolumeSnapshot CRDs (${SNAPSHOTTER_CLIENT_VERSION})"
  kube apply --server-side --force-conflicts -f "$CRDS" >/dev/null
  kube wait --for condition=Established --timeout 60s -f "$CRDS" >/dev/null
  step "applying the snapshot controller and the ${DRIVER} driver"
  render | kube apply --server-side --force-conflicts -f - >/dev/null
  if [[ $storage == mounted ]] && kube -n kube-system get ds/csi-hostpath >/dev/null 2>&1; then
    kube -n kube-system rollout restart ds/csi-hostpath >/dev/null  # the driver must see the new mount
  fi
  kube -n kube-system rollout status deploy/snapshot-controller --timeout 180s >/dev/null
  kube -n kube-system rollout status ds/csi-hostpath --timeout 180s >/dev/null
  local i
  for ((i = 0; i < 120; i++)); do
    if kube get csinode -o jsonpath='{.items[*].spec.drivers[*].name}' | tr ' ' '\n' | grep -qx "$DRIVER"; then
      info "${DRIVER} is registered with the kubelet; StorageClass and VolumeSnapshotClass: shadow-snapshots"
      return
    fi
    sleep 1
  done
  kube -n kube-system logs ds/csi-hostpath -c driver --tail 30 >&2 || true
  die "${DRIVER} did not register with the kubelet (driver log above)"
}

down() {
  # Deleting needs no image references: the manifests are deleted as they are.
  kube delete --ignore-not-found -f "${MANIFESTS}" >/dev/null
  kube delete --ignore-not-found -f "$CRDS" >/dev/null
}

case "${1:-up}" in
  up) up ;;
  render) render ;;
  down) down ;;
  *) die "usage: $0 [up|render|down]" ;;
esac
