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
# Two passes: the tests that may share the cluster, on E2E_WORKERS processes (a test module per worker: each
# makes its own namespaces), then the ones marked e2e_alone, in one process with nothing beside them (they kill
# the operator's leader, or assert a time or a memory figure). With PYTEST_ARGS a pass may select nothing
# (pytest's exit 5); that is fine as long as the other pass ran something.
E2E_WORKERS=${E2E_WORKERS:-2}
E2E_SELECTED=0
e2e_pass() {
  local rc=0
  env SHADOW_E2E_KUBECONFIG="$("${HACK_DIR}/kind/cluster.sh" kubeconfig)" \
    "$PY" -m pytest "${REPO_ROOT}/tests/e2e" "$@" "${E2E_PYTEST_ARGS[@]}" || rc=$?
  if ((rc == 5)) && [[ -n ${PYTEST_ARGS:-} ]]; then
    info "this pass selected no test (PYTEST_ARGS=${PYTEST_ARGS})"
    return 0
  fi
  ((rc == 0)) && E2E_SELECTED=1
  return "$rc"
}
E2E_PARALLEL=(-n "${E2E_WORKERS}" --dist loadfile)
if [[ ${E2E_WORKERS} == 0 ]]; then E2E_PARALLEL=(-p no:xdist); fi
run_step "e2e tests (${E2E_WORKERS} workers)" e2e_pass -m "e2e and not e2e_alone" "${E2E_PARALLEL[@]}"
run_step "e2e tests (alone)" e2e_pass -m "e2e and e2e_alone" -p no:xdist
((E2E_SELECTED)) || die "PYTEST_ARGS=${PYTEST_ARGS:-} selected no e2e test"
steps_end
step "make e2e passed in $((SECONDS - STARTED))s (steps: ${SHADOW_CACHE}/logs/e2e-steps.txt)"
