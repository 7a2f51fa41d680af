#!/usr/bin/env bash
# Snapshot-capable storage on the project's kind cluster: the VolumeSnapshot CRDs, the snapshot
# controller, the project's host-path CSI driver with csi-provisioner and csi-snapshotter, the
# StorageClass `shadow-snapshots` (not the default) and the VolumeSnapshotClass `shadow-snapshots`.
# Everything is built offline: hack/build-tools.sh snapshots (binaries and CRDs), hack/images.sh
# snapshots (images, pushed to the local registry).
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

up() {
  [[ -f "$CRDS/.complete" ]] || "${HACK_DIR}/build-tools.sh" snapshots
  "${HACK_DIR}/images.sh" snapshots
  step "applying the VolumeSnapshot CRDs (${SNAPSHOTTER_CLIENT_VERSION})"
  kube apply --server-side --force-conflicts -f "$CRDS" >/dev/null
  kube wait --for condition=Established --timeout 60s -f "$CRDS" >/dev/null
  step "applying the snapshot controller and the ${DRIVER} driver"
  render | kube apply --server-side --force-conflicts -f - >/dev/null
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
