#!/usr/bin/env bash
# The project's kind cluster: created from hack/kind/config.yaml with the offline node image, reused when
# it already exists. Its kubeconfig is kept apart from ~/.kube/config.
#
#   hack/kind/cluster.sh up          # create or reuse; prints the kubeconfig path
#   hack/kind/cluster.sh down        # delete the cluster
#   hack/kind/cluster.sh kubeconfig  # print the kubeconfig path
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

CLUSTER_NAME="${SHADOW_KIND_CLUSTER:-shadow}"
KIND_DIR="${SHADOW_CACHE}/kind"
KUBECONFIG_PATH="${KIND_DIR}/kubeconfig"
LOG_DIR="${SHADOW_CACHE}/logs"
mkdir -p "${KIND_DIR}" "${LOG_DIR}"

kind_cmd() {
  local kind="${TOOLS_BIN}/kind-${KIND_VERSION}"
  [[ -x $kind ]] || "${HACK_DIR}/build-tools.sh" kind >&2
  if "${HACK_DIR}/images.sh" needs-cap-workaround 2>/dev/null; then
    local real_docker
    real_docker=$(command -v docker)
    PATH="${HACK_DIR}/kind/docker-shim:${PATH}" SHADOW_REAL_DOCKER="${real_docker}" "$kind" "$@"
  else
    "$kind" "$@"
  fi
}

cluster_exists() { kind_cmd get clusters 2>/dev/null | grep -qx "${CLUSTER_NAME}"; }

node_container() { echo "${CLUSTER_NAME}-control-plane"; }

api_ready() { kubectl --kubeconfig "${KUBECONFIG_PATH}" get --raw /readyz >/dev/null 2>&1; }

wait_api() {
  local i
  for ((i = 0; i < 240; i++)); do api_ready && return 0; sleep 0.5; done
  return 1
}

config_file() {
  local out="${KIND_DIR}/config.yaml"
  cp "${HACK_DIR}/kind/config.yaml" "$out"
  if "${HACK_DIR}/images.sh" needs-cap-workaround 2>/dev/null; then
    cat "${HACK_DIR}/kind/restricted.yaml" >>"$out"
  fi
  echo "$out"
}

# reuse: bring up an existing cluster (a leftover of an earlier run); false when it cannot serve.
reuse() {
  step "reusing kind cluster '${CLUSTER_NAME}'"
  if [[ $(docker inspect -f '{{.State.Running}}' "$(node_container)" 2>/dev/null) != true ]]; then
    info "starting its stopped node container"
    docker start "$(node_container)" >/dev/null || return 1
  fi
  local running wanted
  running=$(docker inspect -f '{{.Config.Image}}' "$(node_container)" 2>/dev/null || true)
  wanted=$(cat "${SHADOW_CACHE}/images/node-image" 2>/dev/null || true)
  if [[ -n $wanted && $running != "$wanted" ]]; then
    info "note: the cluster runs ${running}; ${wanted} is newer (make kind-down to recreate with it)"
  fi
  kind_cmd get kubeconfig --name "${CLUSTER_NAME}" >"${KUBECONFIG_PATH}" || return 1
  wait_api
}

up() {
  "${HACK_DIR}/docker.sh" >&2
  if cluster_exists && ! reuse; then
    info "the API server of kind cluster '${CLUSTER_NAME}' is not ready after 2 minutes: recreating the cluster"
    down >&2
  fi
  if ! cluster_exists; then
    local image
    image=$(cat "${SHADOW_CACHE}/images/node-image" 2>/dev/null || true)
    [[ -n $image ]] && docker image inspect "$image" >/dev/null 2>&1 \
      || die "no kind node image built yet; run hack/images.sh node"
    step "creating kind cluster '${CLUSTER_NAME}' from ${image} (log: ${LOG_DIR}/kind-create.log)"
    kind_cmd create cluster --name "${CLUSTER_NAME}" --image "$image" --config "$(config_file)" \
      --kubeconfig "${KUBECONFIG_PATH}" --wait 180s >"${LOG_DIR}/kind-create.log" 2>&1 || {
      tail -n 30 "${LOG_DIR}/kind-create.log" >&2
      die "kind create cluster failed; full log: ${LOG_DIR}/kind-create.log (node logs: kind export logs --name ${CLUSTER_NAME})"
    }
  fi
  runtime_classes >&2
  echo "${KUBECONFIG_PATH}"
}

# runtime_classes: RuntimeClass `gvisor` (handler runsc, configured in the node image) when gVisor runs on the
# node, tried with `runsc do`; when it does not, why is printed and kept in kind/gvisor-unavailable, and the
# class is not created (the e2e tests that need it say so and skip).
runtime_classes() {
  local out
  if out=$(docker exec "$(node_container)" runsc --ignore-cgroups --network=none do /bin/true 2>&1); then
    rm -f "${KIND_DIR}/gvisor-unavailable"
    kubectl --kubeconfig "${KUBECONFIG_PATH}" apply -f - >/dev/null <<'YAML'
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata:
  name: gvisor
  labels:
    app.kubernetes.io/managed-by: shadow-operator-hack
handler: runsc
YAML
    info "RuntimeClass gvisor (handler runsc): gVisor runs on the node"
  else
    printf '%s\n' "$out" >"${KIND_DIR}/gvisor-unavailable"
    kubectl --kubeconfig "${KUBECONFIG_PATH}" delete runtimeclass gvisor --ignore-not-found >/dev/null
    info "no RuntimeClass gvisor: runsc does not run on the node (${KIND_DIR}/gvisor-unavailable): ${out##*$'\n'}"
  fi
}

down() {
  if cluster_exists; then
    step "deleting kind cluster '${CLUSTER_NAME}'"
    kind_cmd delete cluster --name "${CLUSTER_NAME}" --kubeconfig "${KUBECONFIG_PATH}"
  fi
  rm -f "${KUBECONFIG_PATH}"
}

case "${1:-up}" in
  up) up ;;
  down) down ;;
  kubeconfig) echo "${KUBECONFIG_PATH}" ;;
  *) die "usage: $0 [up|down|kubeconfig]" ;;
esac
