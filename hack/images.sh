#!/usr/bin/env bash
# Build every container image the project and its kind clusters need, offline: a Debian base from
# debootstrap, images from Debian packages and from binaries built from Go modules, and the kind node
# image. Images are cached by content (a warm run is a no-op) and pushed to the local registry
# (hack/docker.sh), which kind nodes use as their mirror for registry.k8s.io and docker.io.
#
#   hack/images.sh                 # everything below, in order
#   hack/images.sh base            # shadow-operator/debian:$DEBIAN_SUITE via debootstrap + docker import
#   hack/images.sh apps            # operator, workspace, preview-router, gitea
#   hack/images.sh system          # pause, etcd, coredns, kindnetd, local-path-provisioner/-helper
#   hack/images.sh kind-base       # the kind node base image only
#   hack/images.sh node            # kind base image, Kubernetes server tarball, kind node image
#   hack/images.sh push            # push apps and system images to the local registry
#   hack/images.sh snapshots       # snapshot-controller, csi-provisioner, csi-snapshotter, csi-hostpath:
#                                  # build and push (for hack/kind/snapshots.sh; not part of the default)
#   hack/images.sh argocd          # argocd and argocd-redis: build and push (for hack/kind/argocd.sh; not
#                                  # part of the default)
#   hack/images.sh conformance     # stand-ins for the images upstream agent-sandbox's e2e suite names
#                                  # (registry.k8s.io/pause:3.10, busybox:1.36): build and push (for
#                                  # hack/upstream-e2e.sh; not part of the default)
#   hack/images.sh env             # print the resolved image references as shell assignments
#   hack/images.sh app-refs        # NAME=REF of the app images for the current sources (built or not;
#                                  # hack/release.sh tags them)
set -euo pipefail
source "$(dirname "$0")/lib.sh"

LOG_DIR="${SHADOW_CACHE}/logs"
BUILD_DIR="${SHADOW_CACHE}/build"
STATE_DIR="${SHADOW_CACHE}/images"
PREFIX=shadow-operator
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
BASE_IMAGE="${PREFIX}/debian:${DEBIAN_SUITE}"
PUSH_REGISTRY="127.0.0.1:${SHADOW_REGISTRY_PORT:-5000}"
# Debian's docker.io has no buildx; the classic builder handles these simple Dockerfiles.
export DOCKER_BUILDKIT=0
mkdir -p "${LOG_DIR}" "${BUILD_DIR}" "${STATE_DIR}"

image_exists() { docker image inspect "$1" >/dev/null 2>&1; }
image_id() { docker image inspect --format '{{.Id}}' "$1"; }

# hash_inputs ITEM...: short content hash over files (under the repo) and literal strings. What builds and
# tests leave beside the sources (bytecode, egg-info, the build/ a wheel build makes) does not count: a second
# run of this script (make e2e after .ci/run built the images) must find the same tags.
hash_inputs() {
  local item
  for item in "$@"; do
    if [[ -e "${REPO_ROOT}/${item}" ]]; then
      (cd "${REPO_ROOT}" && find "$item" -type f ! -path '*/__pycache__/*' ! -name '*.pyc' \
        ! -path '*.egg-info/*' ! -path '*/build/*' ! -path '*/.pytest_cache/*' -print0 | sort -z \
        | xargs -0 sha256sum)
    else
      printf '%s\n' "$item"
    fi
  done | sha256sum | cut -c1-12
}

# docker_build REF CONTEXT [docker build args...]: build unless REF exists; logs under LOG_DIR.
docker_build() {
  local ref=$1 ctx=$2 log
  shift 2
  if image_exists "$ref"; then info "$ref: cached"; return; fi
  log="${LOG_DIR}/image-$(echo "${ref}" | tr '/:' '__').log"
  step "building ${ref} (log: ${log})"
  docker build --build-arg "BASE_IMAGE=${BASE_IMAGE}" "$@" -t "$ref" "$ctx" >"$log" 2>&1 \
    || { tail -n 20 "$log" >&2; die "building ${ref} failed; full log: ${log}"; }
}

# stage NAME: a fresh build context holding images/NAME.
stage() {
  local dir="${BUILD_DIR}/ctx-$1"
  rm -rf "$dir" && mkdir -p "$dir" && cp -a "${REPO_ROOT}/images/$1/." "$dir/"
  echo "$dir"
}

tool() { # tool NAME VERSION GROUP: path of a binary from hack/build-tools.sh, building it when missing.
  local path="${TOOLS_BIN}/$1-$2"
  [[ -x $path ]] || "${HACK_DIR}/build-tools.sh" "$3" >&2
  [[ -x $path ]] || die "$1 $2 was not built (hack/build-tools.sh $3)"
  echo "$path"
}

go_binary() { # go_binary IMAGE_DIR OUT: build a small Go program kept under images/.
  (cd "${REPO_ROOT}/images/$1" && CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o "$2" .)
}

# ---------------------------------------------------------------------------------------------- base
build_base() {
  if image_exists "${BASE_IMAGE}"; then info "${BASE_IMAGE}: cached"; return; fi
  command -v debootstrap >/dev/null || apt_install debootstrap
  step "building ${BASE_IMAGE} with debootstrap from ${DEBIAN_MIRROR} (about a minute)"
  "${REPO_ROOT}/images/debian/build-rootfs.sh" "${DEBIAN_SUITE}" "${DEBIAN_MIRROR}" "${BUILD_DIR}/debian" \
    2>"${LOG_DIR}/debootstrap.log" \
    | docker import \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8' \
      --change 'CMD ["/bin/bash"]' - "${BASE_IMAGE}" >/dev/null \
    || die "debootstrap or docker import failed; see ${LOG_DIR}/debootstrap.log"
}

# ---------------------------------------------------------------------------------------------- apps
# App image tags are content hashes of their inputs, so a changed source means a new tag (pods pick it
# up) and an unchanged one means no build.
compute_operator_ref() { echo "${PREFIX}/operator:$(hash_inputs images/operator pyproject.toml operator "$(image_id "${BASE_IMAGE}")")"; }
compute_workspace_ref() {
  echo "${PREFIX}/workspace:$(hash_inputs images/workspace sandbox-runtime "$(image_id "${BASE_IMAGE}")" \
    "$(sha256sum /etc/ssl/certs/ca-certificates.crt)")"
}
compute_egress_ref() { echo "${PREFIX}/egress-gateway:$(hash_inputs images/egress-gateway pyproject.toml operator "$(image_id "${BASE_IMAGE}")")"; }
compute_router_ref() { echo "${PREFIX}/preview-router:$(hash_inputs images/preview-router "$(image_id "${BASE_IMAGE}")")"; }
compute_gitea_ref() { echo "${PREFIX}/gitea:$(hash_inputs images/gitea "${GITEA_VERSION}" "$(image_id "${BASE_IMAGE}")")"; }

# The app references are computed once per run: sources may change while images build.
resolve_refs() {
  [[ -n ${OPERATOR_REF:-} ]] && return
  OPERATOR_REF=$(compute_operator_ref)
  WORKSPACE_REF=$(compute_workspace_ref)
  ROUTER_REF=$(compute_router_ref)
  EGRESS_REF=$(compute_egress_ref)
  GITEA_REF=$(compute_gitea_ref)
}
operator_ref() { resolve_refs; echo "${OPERATOR_REF}"; }
workspace_ref() { resolve_refs; echo "${WORKSPACE_REF}"; }
router_ref() { resolve_refs; echo "${ROUTER_REF}"; }
egress_ref() { resolve_refs; echo "${EGRESS_REF}"; }
gitea_ref() { resolve_refs; echo "${GITEA_REF}"; }

wheels() { # wheels DIR PIP-WHEEL-ARGS...: e.g. PROJECT: wheels of PROJECT and its dependencies, from the host's pip.
  local py="${REPO_ROOT}/.venv/bin/python" dir=$1
  shift
  [[ -x $py ]] || py=python3
  "$py" -m pip wheel --quiet --wheel-dir "$dir" "$@" >>"${LOG_DIR}/wheels.log" 2>&1 \
    || die "pip wheel $* failed; see ${LOG_DIR}/wheels.log"
}

build_apps() {
  local ref ctx
  ref=$(operator_ref)
  if ! image_exists "$ref"; then
    ctx=$(stage operator)
    wheels "$ctx/wheels" "${REPO_ROOT}[operator]"
    docker_build "$ref" "$ctx"
  else info "$ref: cached"; fi
  ref=$(workspace_ref)
  if ! image_exists "$ref"; then
    ctx=$(stage workspace)
    cp /etc/ssl/certs/ca-certificates.crt "$ctx/"
    wheels "$ctx/wheels" "${REPO_ROOT}/sandbox-runtime"
    docker_build "$ref" "$ctx"
  else info "$ref: cached"; fi
  ref=$(egress_ref)
  if ! image_exists "$ref"; then
    ctx=$(stage egress-gateway)
    # Its own dependency set (mitmproxy's pins), and shadow-operator without its client dependencies.
    wheels "$ctx/wheels" -r "${REPO_ROOT}/images/egress-gateway/requirements.txt"
    wheels "$ctx/wheels" --no-deps "${REPO_ROOT}"
    docker_build "$ref" "$ctx"
  else info "$ref: cached"; fi
  ref=$(router_ref)
  image_exists "$ref" || docker_build "$ref" "$(stage preview-router)"
  image_exists "$ref" && info "$ref: ready"
  ref=$(gitea_ref)
  if ! image_exists "$ref"; then
    ctx=$(stage gitea)
    prepare_gitea "$ctx"
    docker_build "$ref" "$ctx"
  else info "$ref: cached"; fi
}

# The gitea binary and the templates/options/public it serves from (hack/build-tools.sh gitea).
prepare_gitea() {
  local share="${SHADOW_CACHE}/share/gitea-${GITEA_VERSION}"
  [[ -f "$share/.complete" ]] || "${HACK_DIR}/build-tools.sh" gitea >&2
  [[ -f "$share/.complete" ]] || die "gitea ${GITEA_VERSION}: $share was not installed (hack/build-tools.sh gitea)"
  cp "$(tool gitea "${GITEA_VERSION}" gitea)" "$1/gitea"
  cp -r "$share" "$1/share" && rm -f "$1/share/.complete"
}

# -------------------------------------------------------------------------------------------- system
# The images kubeadm and kind ask for, under the exact names they ask for.
system_images() {
  cat <<EOF
registry.k8s.io/pause:${PAUSE_TAG}
registry.k8s.io/etcd:${ETCD_IMAGE_TAG}
registry.k8s.io/coredns/coredns:${COREDNS_VERSION}
${KINDNETD_IMAGE}
${LOCAL_PATH_PROVISIONER_IMAGE}
${LOCAL_PATH_HELPER_IMAGE}
EOF
}

# System images keep the fixed names kind and kubeadm ask for, so they carry the hash of their inputs in
# a label and are rebuilt when it changes.
INPUTS_LABEL=org.shadow-operator.inputs
current() { # current REF HASH: true when REF exists and was built from inputs with HASH.
  [[ $(docker image inspect --format "{{index .Config.Labels \"${INPUTS_LABEL}\"}}" "$1" 2>/dev/null) == "$2" ]]
}

# system_image REF DIR HASH [docker build args...]: build images/DIR (staged by the caller's prepare_DIR)
system_image() {
  local ref=$1 dir=$2 hash=$3 ctx
  shift 3
  if current "$ref" "$hash"; then info "${ref}: cached"; return; fi
  ctx=$(stage "$dir")
  "prepare_${dir//-/_}" "$ctx"
  docker image rm "$ref" >/dev/null 2>&1 || true
  docker_build "$ref" "$ctx" --label "${INPUTS_LABEL}=${hash}" "$@"
}

prepare_pause() { go_binary pause "$1/pause"; }
prepare_etcd() { cp "$(tool etcd "${ETCD_VERSION}" etcd)" "$1/etcd"; }
prepare_coredns() { cp "$(tool coredns "${COREDNS_VERSION}" coredns)" "$1/coredns"; }
prepare_kindnetd() { go_binary kindnetd "$1/kindnetd"; }
prepare_local_path_provisioner() {
  cp "$(tool local-path-provisioner "${LOCAL_PATH_PROVISIONER_VERSION}" local-path-provisioner)" "$1/local-path-provisioner"
}

build_system() {
  local base_id
  base_id=$(image_id "${BASE_IMAGE}")
  system_image "registry.k8s.io/pause:${PAUSE_TAG}" pause "$(hash_inputs images/pause)"
  # kubeadm v1.34 asks for etcd 3.6.5-0; the binary is the project's pinned etcd (same 3.6 series).
  system_image "registry.k8s.io/etcd:${ETCD_IMAGE_TAG}" etcd "$(hash_inputs images/etcd "${ETCD_VERSION}")" \
    --label "org.opencontainers.image.version=${ETCD_VERSION}"
  system_image "registry.k8s.io/coredns/coredns:${COREDNS_VERSION}" coredns \
    "$(hash_inputs images/coredns "${COREDNS_VERSION}")"
  system_image "${KINDNETD_IMAGE}" kindnetd "$(hash_inputs images/kindnetd "$base_id")"
  system_image "${LOCAL_PATH_PROVISIONER_IMAGE}" local-path-provisioner \
    "$(hash_inputs images/local-path-provisioner "${LOCAL_PATH_PROVISIONER_VERSION}")"
  # The helper pods only run `sh` with mkdir/rm: the Debian base is enough.
  docker tag "${BASE_IMAGE}" "${LOCAL_PATH_HELPER_IMAGE}"
}

# ----------------------------------------------------------------------------------------- snapshots
# Snapshot-capable storage for the kind cluster (hack/kind/snapshots.sh): the external-snapshotter and
# external-provisioner binaries from `hack/build-tools.sh snapshots`, one static binary per image
# (images/csi-sidecar), and the project's own CSI driver (images/csi-hostpath). Tags carry the pinned
# version and a hash of the image's inputs.
SNAPSHOT_SIDECARS=(
  "snapshot-controller=${EXTERNAL_SNAPSHOTTER_VERSION}"
  "csi-snapshotter=${EXTERNAL_SNAPSHOTTER_VERSION}"
  "csi-provisioner=${EXTERNAL_PROVISIONER_VERSION}"
)
sidecar_ref() { echo "${PREFIX}/$1:$2-$(hash_inputs images/csi-sidecar "$1" "$2")"; }
csi_hostpath_ref() { echo "${PREFIX}/csi-hostpath:$(hash_inputs images/csi-hostpath)"; }

snapshot_refs() { # NAME=REF lines, one per image
  local pair
  for pair in "${SNAPSHOT_SIDECARS[@]}"; do echo "${pair%%=*}=$(sidecar_ref "${pair%%=*}" "${pair#*=}")"; done
  echo "csi-hostpath=$(csi_hostpath_ref)"
}

build_snapshot_images() {
  local pair name version ref ctx
  for pair in "${SNAPSHOT_SIDECARS[@]}"; do
    name=${pair%%=*} version=${pair#*=}
    ref=$(sidecar_ref "$name" "$version")
    if image_exists "$ref"; then info "$ref: cached"; continue; fi
    ctx=$(stage csi-sidecar)
    cp "$(tool "$name" "$version" snapshots)" "$ctx/$name"
    docker_build "$ref" "$ctx" --build-arg "BINARY=$name"
  done
  ref=$(csi_hostpath_ref)
  if image_exists "$ref"; then info "$ref: cached"; return; fi
  ctx=$(stage csi-hostpath)
  go_binary csi-hostpath "$ctx/csi-hostpath"
  docker_build "$ref" "$ctx"
}

# push_snapshot_images: push them and record the references kind nodes pull (registry included) in
# snapshots.env, which `hack/images.sh env` prints after pushed.env.
push_snapshot_images() {
  "${HACK_DIR}/docker.sh" registry
  local line registry
  registry=$("${HACK_DIR}/docker.sh" registry-host)
  while read -r line; do push_one "${line#*=}"; done < <(snapshot_refs)
  while read -r line; do
    printf 'SHADOW_%s_IMAGE=%s/%s\n' "$(echo "${line%%=*}" | tr 'a-z-' 'A-Z_')" "$registry" "${line#*=}"
  done < <(snapshot_refs) >"${STATE_DIR}/snapshots.env"
}

# -------------------------------------------------------------------------------------------- argocd
# ArgoCD for hack/kind/argocd.sh (make e2e-argocd): the binary from `hack/build-tools.sh argocd`, its two
# wrapper scripts and helm in images/argocd; Debian's redis-server in images/argocd-redis. Tags are content
# hashes, as for the app images.
argocd_ref() {
  echo "${PREFIX}/argocd:${ARGOCD_VERSION}-$(hash_inputs images/argocd "${ARGOCD_VERSION}" "${HELM_VERSION}" \
    "$(image_id "${BASE_IMAGE}")")"
}
argocd_redis_ref() { echo "${PREFIX}/argocd-redis:$(hash_inputs images/argocd-redis "$(image_id "${BASE_IMAGE}")")"; }

build_argocd_images() {
  local ref ctx share
  ref=$(argocd_ref)
  if image_exists "$ref"; then info "$ref: cached"; else
    ctx=$(stage argocd)
    cp "$(tool argocd "${ARGOCD_VERSION}" argocd)" "$ctx/argocd"
    share="${SHADOW_CACHE}/share/argocd-${ARGOCD_VERSION}"
    [[ -f "$share/.complete" ]] || die "argocd ${ARGOCD_VERSION}: $share was not installed (hack/build-tools.sh argocd)"
    cp "$share"/bin/*.sh "$ctx/"
    cp "$(tool helm "${HELM_VERSION}" helm)" "$ctx/helm"
    docker_build "$ref" "$ctx"
  fi
  ref=$(argocd_redis_ref)
  image_exists "$ref" || docker_build "$ref" "$(stage argocd-redis)"
}

# push_argocd_images: push them and record the references kind nodes pull in argocd.env (hack/kind/argocd.sh).
push_argocd_images() {
  "${HACK_DIR}/docker.sh" registry
  local registry
  registry=$("${HACK_DIR}/docker.sh" registry-host)
  push_one "$(argocd_ref)"
  push_one "$(argocd_redis_ref)"
  printf 'SHADOW_ARGOCD_IMAGE=%s/%s\nSHADOW_ARGOCD_REDIS_IMAGE=%s/%s\n' \
    "$registry" "$(argocd_ref)" "$registry" "$(argocd_redis_ref)" >"${STATE_DIR}/argocd.env"
}

# ------------------------------------------------------------------------------------------ conformance
# Upstream agent-sandbox's e2e suite (hack/upstream-e2e.sh) names two images: registry.k8s.io/pause:3.10, which
# our own pause serves (the same program as 3.10.1), and busybox:1.36, for which images/conformance-shell stands
# in (the Debian base: its tests only run `sh` and `sleep`). Both are pushed under the names the suite asks for;
# the nodes' mirror for registry.k8s.io and docker.io serves them.
CONFORMANCE_PAUSE=registry.k8s.io/pause:3.10
CONFORMANCE_SHELL=docker.io/library/busybox:1.36

build_conformance_images() {
  build_system
  docker tag "registry.k8s.io/pause:${PAUSE_TAG}" "${CONFORMANCE_PAUSE}"
  system_image "${CONFORMANCE_SHELL}" conformance-shell \
    "$(hash_inputs images/conformance-shell "$(image_id "${BASE_IMAGE}")")"
}
prepare_conformance_shell() { :; }

push_conformance_images() {
  "${HACK_DIR}/docker.sh" registry
  push_one "${CONFORMANCE_PAUSE}"
  push_one "${CONFORMANCE_SHELL}"
}

# ---------------------------------------------------------------------------------------------- push
# registry_path REF: where REF lives in the local registry. Mirrored registries keep their path
# (registry.k8s.io/pause:3.10.1 -> pause:3.10.1, docker.io/kindest/x -> kindest/x), which is what a
# containerd mirror asks for.
registry_path() {
  local ref=$1
  case $ref in
    registry.k8s.io/*) echo "${ref#registry.k8s.io/}" ;;
    docker.io/*) echo "${ref#docker.io/}" ;;
    *) echo "$ref" ;;
  esac
}

push_one() {
  local ref=$1 target marker id
  target="${PUSH_REGISTRY}/$(registry_path "$ref")"
  marker="${STATE_DIR}/pushed-$(echo "$target" | tr '/:' '__')"
  id=$(image_id "$ref")
  if [[ -f $marker && $(<"$marker") == "$id" ]] \
    && curl -fsS -o /dev/null -H 'Accept: application/vnd.docker.distribution.manifest.v2+json' \
      "http://${target%%/*}/v2/$(registry_path "$ref" | sed 's#:#/manifests/#')"; then
    return
  fi
  info "pushing ${target}"
  docker tag "$ref" "$target"
  docker push "$target" >>"${LOG_DIR}/push.log" 2>&1 || die "docker push ${target} failed; see ${LOG_DIR}/push.log"
  echo "$id" >"$marker"
}

push_all() {
  "${HACK_DIR}/docker.sh" registry
  step "pushing images to the local registry (${PUSH_REGISTRY})"
  local ref
  while read -r ref; do push_one "$ref"; done < <(system_images)
  push_one "$(operator_ref)"
  push_one "$(workspace_ref)"
  push_one "$(router_ref)"
  push_one "$(egress_ref)"
  push_one "$(gitea_ref)"
  # What was pushed, for hack/kind/deploy.sh (`hack/images.sh env`).
  {
    echo "SHADOW_OPERATOR_IMAGE=$(operator_ref)"
    echo "SHADOW_WORKSPACE_IMAGE=$(workspace_ref)"
    echo "SHADOW_ROUTER_IMAGE=$(router_ref)"
    echo "SHADOW_EGRESS_IMAGE=$(egress_ref)"
    echo "SHADOW_GITEA_IMAGE=$(gitea_ref)"
    echo "SHADOW_REGISTRY=$("${HACK_DIR}/docker.sh" registry-host)"
  } >"${STATE_DIR}/pushed.env"
}

# ---------------------------------------------------------------------------------------------- node
needs_cap_workaround() { # true when the machine's capability bounding set lacks CAP_SYS_RESOURCE (24)
  local pid status bnd
  pid=$(pgrep -o -x dockerd || echo self)
  status="/proc/${pid}/status"
  [[ -r $status ]] || status=/proc/self/status
  bnd=$(awk '/^CapBnd:/ {print $2}' "$status")
  (((0x${bnd} >> 24 & 1) == 0))
}

# gVisor's binaries for the node (hack/build-tools.sh gvisor), built when missing.
gvisor_binaries() {
  tool runsc "${GVISOR_VERSION}" gvisor
  tool containerd-shim-runsc-v1 "${GVISOR_VERSION}" gvisor
}

kind_base_ref() {
  local gvisor
  gvisor=$(gvisor_binaries | xargs sha256sum | cut -c1-64)
  echo "${PREFIX}/kind-base:$(hash_inputs images/kind-base "${KIND_VERSION}" "${PAUSE_TAG}" \
    "$("${HACK_DIR}/docker.sh" registry-host)" "$(image_id "${BASE_IMAGE}")" "${GVISOR_VERSION}" "$gvisor")"
}

build_kind_base() {
  local ref ctx kind_dir registry host
  ref=$(kind_base_ref)
  if image_exists "$ref"; then info "$ref: cached"; return; fi
  kind_dir=$(cd /tmp && go mod download -json "sigs.k8s.io/kind@${KIND_VERSION}" | sed -n 's/.*"Dir": "\(.*\)",/\1/p')
  [[ -d "$kind_dir/images/base/files" ]] || die "kind ${KIND_VERSION} sources not found in the Go module cache"
  ctx=$(stage kind-base)
  mkdir -p "$ctx/kind" "$ctx/certs.d" "$ctx/gvisor"
  cp "$(tool runsc "${GVISOR_VERSION}" gvisor)" "$ctx/gvisor/runsc"
  cp "$(tool containerd-shim-runsc-v1 "${GVISOR_VERSION}" gvisor)" "$ctx/gvisor/containerd-shim-runsc-v1"
  cp -r "$kind_dir/images/base/files/." "$ctx/kind/"
  chmod -R u+w "$ctx/kind"
  rm -f "$ctx/kind/etc/containerd/config.toml"
  # images/kind-base/files/usr/local/bin/entrypoint wraps kind's entrypoint.
  mv "$ctx/kind/usr/local/bin/entrypoint" "$ctx/kind/usr/local/bin/kind-entrypoint"
  sed -i "s/PAUSE_TAG/${PAUSE_TAG}/" "$ctx/files/etc/containerd/config.toml"
  registry=$("${HACK_DIR}/docker.sh" registry-host)
  for host in registry.k8s.io docker.io "$registry"; do
    mkdir -p "$ctx/certs.d/$host"
    {
      case $host in
        docker.io) echo 'server = "https://registry-1.docker.io"' ;;
        registry.k8s.io) echo 'server = "https://registry.k8s.io"' ;;
        *) echo "server = \"http://${registry}\"" ;;
      esac
      printf '\n[host."http://%s"]\n  capabilities = ["pull", "resolve"]\n' "$registry"
    } >"$ctx/certs.d/$host/hosts.toml"
  done
  docker_build "$ref" "$ctx"
}

# The server tarball `kind build node-image --type file` takes: kubeadm/kubelet/kubectl, image tars for
# the control plane and kube-proxy, and the version file.
server_tarball() {
  local v=${KUBERNETES_VERSION} out="${BUILD_DIR}/kubernetes-server-${KUBERNETES_VERSION}.tar.gz" c dir ctx ref
  if [[ -f $out ]]; then echo "$out"; return; fi
  step "assembling the Kubernetes ${v} server tarball" >&2
  for c in kubeadm kubelet kubectl kube-proxy; do tool "$c" "$v" node >/dev/null; done
  for c in kube-apiserver kube-controller-manager kube-scheduler; do tool "$c" "$v" control-plane >/dev/null; done
  dir="${BUILD_DIR}/server-${v}"
  rm -rf "$dir" && mkdir -p "$dir/kubernetes/server/bin"
  echo "$v" >"$dir/kubernetes/version"
  for c in kubeadm kubelet kubectl; do cp "${TOOLS_BIN}/$c-$v" "$dir/kubernetes/server/bin/$c"; done
  for c in kube-apiserver kube-controller-manager kube-scheduler kube-proxy; do
    ref="registry.k8s.io/$c:$v"
    if [[ $c == kube-proxy ]]; then ctx=$(stage kube-proxy); else ctx=$(stage kubernetes); fi
    cp "${TOOLS_BIN}/$c-$v" "$ctx/$c"
    docker image rm "$ref" >/dev/null 2>&1 || true
    docker_build "$ref" "$ctx" --build-arg "BINARY=$c" >&2
    docker save "$ref" -o "$dir/kubernetes/server/bin/$c.tar"
  done
  tar -C "$dir" -czf "$out.tmp" kubernetes && mv "$out.tmp" "$out"
  rm -rf "$dir"
  echo "$out"
}

# The node image bakes in the system images (kind pre-pulls them), so their IDs are part of its tag.
node_ref() {
  local ref system_ids=()
  while read -r ref; do system_ids+=("$(image_id "$ref" 2>/dev/null)"); done < <(system_images)
  echo "${PREFIX}/kind-node:${KUBERNETES_VERSION}-$(hash_inputs "$(kind_base_ref)" "${KUBERNETES_VERSION}" \
    "$(sha256sum "${TOOLS_BIN}/kubelet-${KUBERNETES_VERSION}" 2>/dev/null)" "${system_ids[@]}")"
}

# kind_cmd ARGS...: kind with the docker shim on PATH when this machine cannot run --privileged.
kind_cmd() {
  local kind
  kind=$(tool kind "${KIND_VERSION}" kind)
  if needs_cap_workaround; then
    local real_docker
    real_docker=$(command -v docker)
    PATH="${HACK_DIR}/kind/docker-shim:${PATH}" SHADOW_REAL_DOCKER="${real_docker}" "$kind" "$@"
  else
    "$kind" "$@"
  fi
}

build_node() {
  build_kind_base
  local ref tarball
  ref=$(node_ref)
  if image_exists "$ref"; then info "$ref: cached"; echo "$ref" >"${STATE_DIR}/node-image"; return; fi
  push_system
  tarball=$(server_tarball)
  step "building kind node image ${ref} (log: ${LOG_DIR}/kind-node-image.log)"
  kind_cmd build node-image --type file "$tarball" --base-image "$(kind_base_ref)" --image "$ref" \
    >"${LOG_DIR}/kind-node-image.log" 2>&1 \
    || { tail -n 30 "${LOG_DIR}/kind-node-image.log" >&2; die "kind build node-image failed"; }
  echo "$ref" >"${STATE_DIR}/node-image"
}

push_system() {
  "${HACK_DIR}/docker.sh" registry
  local ref
  while read -r ref; do push_one "$ref"; done < <(system_images)
}

# prune_old REPO KEEP: untag REPO's other tags (and their registry-push twins) so rebuilds after source
# changes do not pile up. Images a container still uses are kept by Docker.
prune_old() {
  local repo=$1 keep=$2 ref
  while read -r ref; do
    [[ $ref == "$keep" || $ref == "${PUSH_REGISTRY}/$keep" ]] || docker rmi "$ref" >/dev/null 2>&1 || true
  done < <(docker images --format '{{.Repository}}:{{.Tag}}' "$repo"; docker images --format '{{.Repository}}:{{.Tag}}' "${PUSH_REGISTRY}/$repo")
}

prune_all() {
  prune_old "${PREFIX}/operator" "$(operator_ref)"
  prune_old "${PREFIX}/workspace" "$(workspace_ref)"
  prune_old "${PREFIX}/preview-router" "$(router_ref)"
  prune_old "${PREFIX}/egress-gateway" "$(egress_ref)"
  prune_old "${PREFIX}/gitea" "$(gitea_ref)"
  prune_old "${PREFIX}/kind-base" "$(kind_base_ref)"
  [[ -f "${STATE_DIR}/node-image" ]] && prune_old "${PREFIX}/kind-node" "$(<"${STATE_DIR}/node-image")"
  local line
  while read -r line; do prune_old "${PREFIX}/${line%%=*}" "${line#*=}"; done < <(snapshot_refs)
  prune_old "${PREFIX}/argocd" "$(argocd_ref)"
  prune_old "${PREFIX}/argocd-redis" "$(argocd_redis_ref)"
  return 0
}

print_env() {
  [[ -f "${STATE_DIR}/pushed.env" ]] || die "no images pushed yet: run hack/images.sh"
  cat "${STATE_DIR}/pushed.env"
  echo "SHADOW_NODE_IMAGE=$(cat "${STATE_DIR}/node-image" 2>/dev/null)"
  if [[ -f "${STATE_DIR}/snapshots.env" ]]; then cat "${STATE_DIR}/snapshots.env"; fi
  if [[ -f "${STATE_DIR}/argocd.env" ]]; then cat "${STATE_DIR}/argocd.env"; fi
}

case "${1:-}" in
  needs-cap-workaround) needs_cap_workaround; exit ;;
  env) print_env; exit ;;
  app-refs)
    image_exists "${BASE_IMAGE}" || die "${BASE_IMAGE} is not built yet: run hack/images.sh apps"
    resolve_refs
    printf 'operator=%s\nworkspace=%s\npreview-router=%s\ngitea=%s\negress-gateway=%s\n' \
      "$(operator_ref)" "$(workspace_ref)" "$(router_ref)" "$(gitea_ref)" "$(egress_ref)"
    exit ;;
esac
"${HACK_DIR}/docker.sh" daemon
targets=("$@")
((${#targets[@]})) || targets=(base system apps push node)
build_base
resolve_refs
for t in "${targets[@]}"; do
  case $t in
    base) build_base ;;
    apps) build_base; build_apps ;;
    system) build_base; build_system ;;
    push) build_system; build_apps; push_all ;;
    kind-base) build_base; build_kind_base ;;
    node) build_base; build_system; build_node ;;
    snapshots) build_snapshot_images; push_snapshot_images ;;
    argocd) build_argocd_images; push_argocd_images ;;
    conformance) build_conformance_images; push_conformance_images ;;
    *) die "unknown target '$t' (base, apps, system, push, node, snapshots, argocd, conformance, env)" ;;
  esac
done
prune_all
