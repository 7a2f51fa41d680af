#!/usr/bin/env bash
# `make e2e`: dockerd, offline images, the kind cluster (reused when present), the Helm install, then the
# e2e tests against real pods. Every step is cached, so a second run only re-runs the tests.
set -Eeuo pipefail
source "$(dirname "$0")/lib.sh"

PY="${REPO_ROOT}/.venv/bin/python"
STARTED=$SECONDS
CURRENT=
on_error() {
  [[ -n $CURRENT && $BASH_SUBSHELL -eq 0 ]] || return 0
  printf '\033[1;31merror:\033[0m make e2e failed during: %s\n       logs: %s/logs; rerun make e2e: finished steps are cached\n' "$CURRENT" "$SHADOW_CACHE" >&2
  CURRENT=
}
trap on_error ERR

run_step() { # run_step NAME COMMAND...: run and time one step.
  local t0=$SECONDS
  CURRENT=$1
  shift
  step "$CURRENT"
  "$@"
  info "done in $((SECONDS - t0))s"
  echo "$CURRENT=$((SECONDS - t0))" >>"${SHADOW_CACHE}/logs/e2e-steps.txt"
}

mkdir -p "${SHADOW_CACHE}/logs"
: >"${SHADOW_CACHE}/logs/e2e-steps.txt"
run_step "docker daemon and local registry" "${HACK_DIR}/docker.sh"
run_step "tools (kind, helm, Kubernetes node binaries)" "${HACK_DIR}/build-tools.sh" kind helm node control-plane coredns local-path-provisioner
run_step "images (offline, cached)" "${HACK_DIR}/images.sh"
run_step "kind cluster" "${HACK_DIR}/kind/cluster.sh" up
run_step "helm install" "${HACK_DIR}/kind/deploy.sh"
run_step "e2e tests" env SHADOW_E2E_KUBECONFIG="$("${HACK_DIR}/kind/cluster.sh" kubeconfig)" \
  "$PY" -m pytest -m e2e "${REPO_ROOT}/tests/e2e" ${PYTEST_ARGS:-}
CURRENT=
step "make e2e passed in $((SECONDS - STARTED))s (steps: ${SHADOW_CACHE}/logs/e2e-steps.txt)"
