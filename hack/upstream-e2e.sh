#!/usr/bin/env bash
# The conformance check (issue 33): kubernetes-sigs/agent-sandbox's own end-to-end suite (test/e2e and
# test/e2e/extensions, Go), unmodified, against this operator on the kind cluster `shadow` (make e2e's). Not part
# of `make e2e` or .ci/run: its cold Go build takes minutes of both cores.
#
#   hack/upstream-e2e.sh                 # checkout, build, prepare the cluster, run both packages
#   hack/upstream-e2e.sh -run 'TestX|Y'  # extra flags for both test binaries (-test. prefix optional)
#
# 1. Upstream at AGENT_SANDBOX_COMMIT (hack/versions.env), cloned from AGENT_SANDBOX_GIT (default GitHub; any
#    clone or mirror holding the commit) into ~/.cache/shadow-operator/upstream/agent-sandbox. None of its code
#    enters this repository.
# 2. Its test binaries, `go test -c`, cached under ~/.cache/shadow-operator/upstream/bin by commit.
# 3. The cluster as the suite expects it: the operator installed (hack/kind/deploy.sh, not redone here), the
#    images it names served offline (hack/images.sh conformance: our pause as registry.k8s.io/pause:3.10,
#    images/conformance-shell as busybox:1.36), and the install check it makes satisfied by a Deployment
#    `agent-sandbox-controller` in `agent-sandbox-system` with 0 replicas (our operator does the work).
# 4. Both binaries, one test at a time (-test.parallel=1, as upstream's README runs them), then a summary: tests
#    run, passed, failed, not applicable (with why). Logs: ~/.cache/shadow-operator/logs/upstream-e2e-*.log.
# 5. Whatever happened, the cluster is left as make e2e expects it: the namespaces the suite made are deleted,
#    after taking off the finalizers its tests put on objects to hold their deletion (a failing or interrupted
#    test leaves them, and its namespace would stay Terminating with a Sandbox in it for ever), and the
#    install-check namespace goes too.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

COMMIT="${AGENT_SANDBOX_COMMIT}"
GIT_SOURCE="${AGENT_SANDBOX_GIT:-https://github.com/kubernetes-sigs/agent-sandbox.git}"
UPSTREAM_DIR="${SHADOW_CACHE}/upstream"
SRC="${UPSTREAM_DIR}/agent-sandbox"
BIN_DIR="${UPSTREAM_DIR}/bin"
LOG_DIR="${SHADOW_CACHE}/logs"
PACKAGES=(test/e2e test/e2e/extensions)
mkdir -p "${BIN_DIR}" "${LOG_DIR}"

# Tests that cannot run here, and why: an image upstream builds from its own sources and pushes to a registry
# (no offline build of those is part of this check; the suite's other tests name only pause and busybox), or a
# load test. Tests that skip themselves (the density tests without -run-perf-load-test) are reported from the
# run.
NOT_APPLICABLE=(
  "TestRunChromeSandbox=needs upstream's chrome-sandbox image (examples/chrome-sandbox, Chromium)"
  "TestRunPythonRuntimeSandbox=needs upstream's python-runtime-sandbox image"
  "TestRunPythonRuntimeSandboxClaim=needs upstream's python-runtime-sandbox image"
  "TestRunPythonRuntimeSandboxWarmpool=needs upstream's python-runtime-sandbox image"
  "TestRunSandboxdSandbox=needs upstream's sandboxd image"
  "TestRuntimeClassBurstRecovery=a load test (waves of sandboxes sized to the workers' CPU capacity, minutes long), not a check of the API"
)
# Upstream's runtime-class tests run under SANDBOX_RUNTIME_CLASS; the kind cluster's gVisor class when it has one
# (hack/kind/cluster.sh creates it where runsc runs on the node), else they skip themselves.

checkout() {
  if [[ ! -d "${SRC}/.git" ]]; then
    step "cloning agent-sandbox from ${GIT_SOURCE}"
    git clone --quiet --no-checkout "${GIT_SOURCE}" "${SRC}"
  fi
  if ! git -C "${SRC}" cat-file -e "${COMMIT}^{commit}" 2>/dev/null; then
    step "fetching ${COMMIT} from ${GIT_SOURCE}"
    git -C "${SRC}" fetch --quiet "${GIT_SOURCE}" "${COMMIT}"
  fi
  if [[ $(git -C "${SRC}" rev-parse HEAD 2>/dev/null) != "${COMMIT}" ]] \
    || [[ -n $(git -C "${SRC}" status --porcelain --untracked-files=no) ]]; then
    git -C "${SRC}" checkout --quiet --force --detach "${COMMIT}"
  fi
  info "agent-sandbox ${COMMIT:0:8} ($(git -C "${SRC}" log -1 --format=%cs))"
}

binary() { echo "${BIN_DIR}/$(echo "$1" | tr '/' '-')-${COMMIT:0:12}.test"; }

build() {
  local pkg out
  for pkg in "${PACKAGES[@]}"; do
    out=$(binary "$pkg")
    if [[ -x $out ]]; then info "$(basename "$out"): cached"; continue; fi
    step "building ${pkg} test binary (cold: several minutes on 2 cores)"
    (cd "${SRC}" && CGO_ENABLED=0 GOFLAGS="${GOFLAGS:--buildvcs=false}" go test -c -o "$out.tmp" "./${pkg}")
    mv "$out.tmp" "$out"
  done
}

prepare_cluster() {
  "${HACK_DIR}/images.sh" conformance
  if [[ -z ${SANDBOX_RUNTIME_CLASS:-} ]] && kubectl get runtimeclass gvisor >/dev/null 2>&1; then
    export SANDBOX_RUNTIME_CLASS=gvisor
  fi
  info "runtime-class tests: ${SANDBOX_RUNTIME_CLASS:-skipped (no SANDBOX_RUNTIME_CLASS, no RuntimeClass gvisor)}"
  step "the suite's install check: Deployment agent-sandbox-system/agent-sandbox-controller, 0 replicas"
  kubectl apply -f - >/dev/null <<'EOF'
apiVersion: v1
kind: Namespace
metadata:
  name: agent-sandbox-system
---
# Only for the install check upstream's e2e framework makes: shadow-operator serves the API; nothing runs here.
apiVersion: apps/v1
kind: Deployment
metadata:
  name: agent-sandbox-controller
  namespace: agent-sandbox-system
  labels: {app: agent-sandbox-controller}
spec:
  replicas: 0
  selector:
    matchLabels: {app: agent-sandbox-controller}
  template:
    metadata:
      labels: {app: agent-sandbox-controller}
    spec:
      containers:
        - name: controller
          image: registry.k8s.io/pause:3.10
EOF
  kubectl get deploy -n "${SHADOW_RELEASE_NAMESPACE}" -l app.kubernetes.io/component=operator -o name | grep -q . \
    || die "shadow-operator is not installed on the cluster: run hack/kind/deploy.sh (or make e2e) first"
}

# run PACKAGE FLAGS...: run one test binary from its package directory (the tests read files beside them).
run() {
  local pkg=$1 log skip="" entry
  shift
  log="${LOG_DIR}/upstream-e2e-$(echo "$pkg" | tr '/' '-').log"
  for entry in "${NOT_APPLICABLE[@]}"; do skip+="${skip:+|}^${entry%%=*}\$"; done
  step "running ${pkg} (log: ${log})"
  (cd "${SRC}/${pkg}" && ARTIFACTS="${UPSTREAM_DIR}/artifacts" \
    "$(binary "$pkg")" -test.v -test.parallel=1 -test.timeout=60m -test.skip="${skip}" "$@") \
    >"$log" 2>&1 || true
}

summarize() {
  local log status name why passed=0 failed=0 skipped=0 entry
  local -a failures=() skips=()
  for log in "${LOG_DIR}"/upstream-e2e-test-e2e*.log; do
    # Top-level results; a skipped test's reason is the last line it logged before its `--- SKIP`.
    while IFS=$'\t' read -r status name why; do
      case $status in
        PASS) passed=$((passed + 1)) ;;
        FAIL) failed=$((failed + 1)); failures+=("$name") ;;
        SKIP) skipped=$((skipped + 1)); skips+=("$name: $why") ;;
      esac
    done < <(awk '/^=== RUN/ {why = ""} /^    [a-z_]+\.go:[0-9]+: / {why = $0; sub(/^ *[a-z_]+\.go:[0-9]+: /, "", why)}
      /^--- (PASS|FAIL|SKIP): / {print substr($2, 1, 4) "\t" $3 "\t" why}' "$log")
  done
  step "agent-sandbox ${COMMIT:0:8} e2e against shadow-operator: $((passed + failed)) run, ${passed} passed, ${failed} failed, $((skipped + ${#NOT_APPLICABLE[@]})) not applicable"
  for entry in "${failures[@]}"; do info "FAIL ${entry}"; done
  for entry in "${NOT_APPLICABLE[@]}"; do info "n/a  ${entry%%=*}: ${entry#*=}"; done
  for entry in "${skips[@]}"; do info "n/a  ${entry} (skipped by the test)"; done
  ((failed == 0))
}

namespaces() { kubectl get namespaces -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}' | sort; }

# strip_test_finalizers NS: remove the suite's own finalizers (e2e.agent-sandbox.dev/...) from the objects of NS,
# keeping any other.
strip_test_finalizers() {
  local ns=$1 kind name finalizers keep
  for kind in pods sandboxes.agents.x-k8s.io sandboxclaims.extensions.agents.x-k8s.io \
    sandboxwarmpools.extensions.agents.x-k8s.io sandboxtemplates.extensions.agents.x-k8s.io; do
    while read -r name finalizers; do
      [[ $finalizers == *e2e.agent-sandbox.dev/* ]] || continue
      keep=$(tr ' ' '\n' <<<"$finalizers" | grep -v '^e2e\.agent-sandbox\.dev/' | sed 's/.*/"&"/' | paste -sd, -) || true
      kubectl patch -n "$ns" "$kind/$name" --type=merge -p "{\"metadata\":{\"finalizers\":[${keep}]}}" >/dev/null
    done < <(kubectl get "$kind" -n "$ns" \
      -o jsonpath='{range .items[*]}{.metadata.name}{" "}{.metadata.finalizers[*]}{"\n"}{end}' 2>/dev/null)
  done
}

terminating() {
  kubectl get namespaces -o jsonpath='{range .items[?(@.status.phase=="Terminating")]}{.metadata.name}{"\n"}{end}'
}

# The namespaces made since the start, the install check's, and any left Terminating (by an earlier run).
cleanup() {
  local ns
  step "cleaning up: the suite's namespaces and the install-check Deployment"
  for ns in $({ comm -13 <(echo "${NAMESPACES_BEFORE}") <(namespaces); terminating; echo agent-sandbox-system; } | sort -u); do
    strip_test_finalizers "$ns"
    kubectl delete namespace "$ns" --ignore-not-found --wait=false >/dev/null
  done
}

KUBECONFIG=$("${HACK_DIR}/kind/cluster.sh" kubeconfig)
export KUBECONFIG
[[ -f $KUBECONFIG ]] || die "no kind cluster: run make e2e (or hack/kind/cluster.sh up and hack/kind/deploy.sh)"
flags=()
for f in "$@"; do
  if [[ $f == -* && $f != -test.* ]]; then flags+=("-test.${f#-}"); else flags+=("$f"); fi
done
checkout
build
NAMESPACES_BEFORE=$(namespaces)
trap cleanup EXIT
prepare_cluster
rm -f "${LOG_DIR}"/upstream-e2e-test-e2e*.log
for pkg in "${PACKAGES[@]}"; do run "$pkg" "${flags[@]}"; done
summarize
