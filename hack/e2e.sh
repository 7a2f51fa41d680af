#!/usr/bin/env bash
# `make e2e`: dockerd, offline images, the kind cluster (reused when present) with snapshot-capable storage,
# the Helm install, then the e2e tests against real pods. Every step is cached, so a second run only re-runs
# the tests.
set -Eeuo pipefail
source "$(dirname "$0")/lib.sh"

PY="${REPO_ROOT}/.venv/bin/python"
STARTED=$SECONDS
steps_begin "make e2e"
STEPS_RECORD="${SHADOW_CACHE}/logs/e2e-steps.txt"
: >"$STEPS_RECORD"
run_step "docker daemon and local registry" "${HACK_DIR}/docker.sh"
run_step "tools (kind, helm, Kubernetes node binaries, gVisor)" "${HACK_DIR}/build-tools.sh" kind helm node control-plane coredns local-path-provisioner snapshots gvisor
run_step "images (offline, cached)" "${HACK_DIR}/images.sh"
run_step "kind cluster" "${HACK_DIR}/kind/cluster.sh" up
run_step "snapshot storage (VolumeSnapshot CRDs, snapshot controller, our CSI host-path driver)" \
  "${HACK_DIR}/kind/snapshots.sh" up
run_step "helm install" "${HACK_DIR}/kind/deploy.sh"
# PYTEST_ARGS is split as a shell would (as `make test` does): PYTEST_ARGS='-k "test_a or test_b"' works.
E2E_PYTEST_ARGS=()
if [[ -n ${PYTEST_ARGS:-} ]]; then
  mapfile -t E2E_PYTEST_ARGS < <("$PY" -c 'import os, shlex; print(*shlex.split(os.environ["PYTEST_ARGS"]), sep="\n")')
fi
run_step "e2e tests" env SHADOW_E2E_KUBECONFIG="$("${HACK_DIR}/kind/cluster.sh" kubeconfig)" \
  "$PY" -m pytest -m e2e "${REPO_ROOT}/tests/e2e" "${E2E_PYTEST_ARGS[@]}"
steps_end
step "make e2e passed in $((SECONDS - STARTED))s (steps: ${SHADOW_CACHE}/logs/e2e-steps.txt)"
