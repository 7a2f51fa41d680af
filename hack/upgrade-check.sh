#!/usr/bin/env bash
# Upgrade check on the project's kind cluster: install an earlier version, create an environment and claims,
# upgrade to this checkout the documented way (the release's CRDs applied server-side, then `helm upgrade`),
# and check that nothing was lost and everything is Ready.
#
#   hack/upgrade-check.sh [--from GIT_REF | --from-chart OCI_CHART --from-version VERSION] [--replace] [--keep]
#
#   --from GIT_REF      the earlier version from git (default: the newest v* tag): its images are built by its
#                       own hack/images.sh and it is installed by its own hack/kind/deploy.sh, as it was then
#   --from-chart, --from-version
#                       a published release instead, e.g. oci://ghcr.io/org/charts/shadow-operator 0.1.0
#   --replace           uninstall shadow-operator releases already on the cluster first (default: refuse)
#   --keep              leave the check's namespace and objects for a look
#
# Needs the kind cluster (make kind-up). It takes over the cluster's shadow-operator install: at the end this
# checkout is installed exactly as hack/kind/deploy.sh installs it (release SHADOW_RELEASE, namespace
# SHADOW_RELEASE_NAMESPACE). Building the earlier version's images makes hack/images.sh untag the current ones, so the
# upgrade step rebuilds them (minutes, not a cold build).
set -euo pipefail
source "$(dirname "$0")/lib.sh"

RELEASE="${SHADOW_RELEASE}"
NAMESPACE="${SHADOW_RELEASE_NAMESPACE}"
CHECK_NS=upgrade-check
TEMPLATE=workspace
FROM_REF="" FROM_CHART="" FROM_VERSION="" REPLACE=0 KEEP=0
while (($#)); do
  case $1 in
    --from) FROM_REF=$2; shift ;;
    --from-chart) FROM_CHART=$2; shift ;;
    --from-version) FROM_VERSION=$2; shift ;;
    --replace) REPLACE=1 ;;
    --keep) KEEP=1 ;;
    -h | --help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
    *) die "unknown option '$1' (hack/upgrade-check.sh --help)" ;;
  esac
  shift
done
if [[ -n $FROM_CHART ]]; then
  [[ -n $FROM_VERSION ]] || die "--from-chart needs --from-version"
elif [[ -z $FROM_REF ]]; then
  FROM_REF=$(git -C "${REPO_ROOT}" describe --tags --abbrev=0 --match 'v[0-9]*' 2>/dev/null) \
    || die "no release tag yet: pass --from GIT_REF (e.g. --from main~20) or --from-chart/--from-version"
fi

export KUBECONFIG
KUBECONFIG=$("${HACK_DIR}/kind/cluster.sh" kubeconfig)
kubectl get --raw /readyz >/dev/null 2>&1 || die "the kind cluster does not answer: make kind-up"
HELM="${TOOLS_BIN}/helm-${HELM_VERSION}"
[[ -x $HELM ]] || "${HACK_DIR}/build-tools.sh" helm >&2
SHADOWCTL="${REPO_ROOT}/.venv/bin/shadowctl"
[[ -x $SHADOWCTL ]] || die "no .venv: make dev"
WORK=$(mktemp -d)
cleanup() {
  if [[ -d "${WORK}/from" ]]; then git -C "${REPO_ROOT}" worktree remove --force "${WORK}/from" >/dev/null 2>&1 || true; fi
  rm -rf "${WORK}"
}
trap cleanup EXIT
FAILURES=()
check() { # check DESCRIPTION COMMAND...: run, record a failure instead of stopping
  local what=$1
  shift
  if "$@"; then info "ok: ${what}"; else FAILURES+=("${what}"); printf '    \033[1;31mFAILED:\033[0m %s\n' "${what}" >&2; fi
}

# ------------------------------------------------------------------------------------------ clean slate
existing=$("$HELM" list -A -o json | python3 -c '
import json, sys
for r in json.load(sys.stdin):
    if r["chart"].startswith("shadow-operator-"):
        print(r["namespace"], r["name"])')
if [[ -n $existing ]]; then
  ((REPLACE)) || die "shadow-operator is installed already (namespace release): ${existing//$'\n'/, }. Rerun with --replace to uninstall it first"
  while read -r ns name; do
    step "uninstalling ${ns}/${name}"
    "$HELM" uninstall "$name" -n "$ns" --wait --timeout 3m >/dev/null
  done <<<"$existing"
fi
if kubectl get namespace "${CHECK_NS}" >/dev/null 2>&1; then
  step "removing the namespace ${CHECK_NS} left by an earlier check"
  kubectl delete namespace "${CHECK_NS}" --wait --timeout 3m >/dev/null
fi

# ------------------------------------------------------------------------------------ the earlier version
if [[ -n $FROM_REF ]]; then
  step "installing the earlier version ${FROM_REF} ($(git -C "${REPO_ROOT}" rev-parse --short "${FROM_REF}"))"
  git -C "${REPO_ROOT}" worktree add --detach "${WORK}/from" "${FROM_REF}" >/dev/null
  "${WORK}/from/hack/images.sh" push
  # Earlier versions' deploy.sh read SHADOW_NAMESPACE.
  SHADOW_RELEASE=$RELEASE SHADOW_NAMESPACE=$NAMESPACE SHADOW_RELEASE_NAMESPACE=$NAMESPACE "${WORK}/from/hack/kind/deploy.sh"
else
  step "installing the earlier version ${FROM_CHART} ${FROM_VERSION}"
  # Helm keeps CRDs that exist: apply the earlier release's own, as a cluster that had it would have them.
  "$HELM" pull "${FROM_CHART}" --version "${FROM_VERSION}" --untar --untardir "${WORK}/from-chart"
  kubectl apply --server-side --force-conflicts -f "${WORK}/from-chart/shadow-operator/crds" >/dev/null
  "$HELM" install "${RELEASE}" "${FROM_CHART}" --version "${FROM_VERSION}" -n "${NAMESPACE}" --create-namespace \
    --set 'networkPolicy.clusterCIDRs={10.244.0.0/16,10.96.0.0/16}' --wait --timeout 5m >/dev/null
fi

# ------------------------------------------------------------------------------- what users have before
step "creating an environment and claims in ${CHECK_NS}"
kubectl create namespace "${CHECK_NS}" >/dev/null
kubectl get sandboxtemplate "${TEMPLATE}" -n "${NAMESPACE}" -o json | python3 -c '
import json, sys
t = json.load(sys.stdin)
print(json.dumps({"apiVersion": t["apiVersion"], "kind": t["kind"], "metadata": {"name": t["metadata"]["name"]},
                  "spec": t["spec"]}))' | kubectl apply -n "${CHECK_NS}" -f - >/dev/null
kubectl apply -n "${CHECK_NS}" -f - >/dev/null <<YAML
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxClaim
metadata: {name: claim-beta}
spec: {sandboxTemplateRef: {name: ${TEMPLATE}}}
---
# The older claim form (Amicable's): still served after the upgrade.
apiVersion: extensions.agents.x-k8s.io/v1alpha1
kind: SandboxClaim
metadata: {name: claim-alpha}
spec: {sandboxTemplateRef: {name: ${TEMPLATE}}}
YAML
mkdir -p "${WORK}/src"
git -C "${WORK}/src" init -q
echo "before the upgrade" >"${WORK}/src/hello.txt"
git -C "${WORK}/src" add hello.txt
git -C "${WORK}/src" -c user.name=check -c user.email=check@localhost commit -qm hello
"$SHADOWCTL" create env-before -n "${CHECK_NS}" --local "${WORK}/src" --verify 'test -f src/hello.txt' --timeout 600 \
  || die "the earlier version could not create an environment (shadowctl create above)"
kubectl wait -n "${CHECK_NS}" --for=condition=Ready sandboxclaim/claim-beta sandboxclaim/claim-alpha --timeout 5m >/dev/null
"$SHADOWCTL" exec env-before -n "${CHECK_NS}" -- sh -c 'echo kept > /workspace/marker.txt'

inventory() { # kind/name=uid of everything users have in the check namespace, sorted. A Gitea Pod is its
  # StatefulSet's: a new operator (or new gitea.* values) may change the template and roll it, so its uid is not
  # compared; its volume (PersistentVolumeClaim data-*-gitea-0) is, and must be the same.
  kubectl get shadowenvironments,sandboxclaims,sandboxes,pods,persistentvolumeclaims,secrets,services -n "${CHECK_NS}" \
    -o jsonpath='{range .items[*]}{.kind}/{.metadata.name}={.metadata.uid}{"\n"}{end}' \
    | sed -E 's|^(Pod/.*-gitea-0)=.*|\1=(rolled by its StatefulSet)|' | sort
}
verdict() { kubectl get shadowenvironment "$1" -n "${CHECK_NS}" -o jsonpath='{.status.verdict.result}'; }
inventory >"${WORK}/before.txt"
verdict_before=$(verdict env-before)
info "$(wc -l <"${WORK}/before.txt") objects, verdict ${verdict_before}"

# ------------------------------------------------------------------------------------------ the upgrade
step "upgrading to this checkout ($(git -C "${REPO_ROOT}" rev-parse --short HEAD)): CRDs server-side, then helm upgrade"
"${HACK_DIR}/images.sh" push
kubectl apply --server-side --force-conflicts -f "${REPO_ROOT}/charts/shadow-operator/crds" >/dev/null
SHADOW_RELEASE=$RELEASE SHADOW_RELEASE_NAMESPACE=$NAMESPACE "${HACK_DIR}/kind/deploy.sh"
kubectl rollout status -n "${NAMESPACE}" deployment/"$(shadow_fullname "${RELEASE}")" --timeout 3m >/dev/null

# ---------------------------------------------------------------------------------------------- checks
step "checking"
ready() { kubectl wait -n "${CHECK_NS}" --for=condition=Ready "$@" --timeout 3m >/dev/null; }
same_objects() {
  inventory >"${WORK}/after.txt"
  diff -u "${WORK}/before.txt" "${WORK}/after.txt" >&2
}
stored_versions_served() { # every stored version of our CRDs is still served
  kubectl get crd -l app.kubernetes.io/part-of=shadow-operator -o json | python3 -c '
import json, sys
bad = [(c["metadata"]["name"], v) for c in json.load(sys.stdin)["items"] for v in c["status"]["storedVersions"]
       if v not in {s["name"] for s in c["spec"]["versions"] if s["served"]}]
print(*bad, sep="\n", file=sys.stderr)
sys.exit(1 if bad else 0)'
}
marker_kept() { [[ $("$SHADOWCTL" exec env-before -n "${CHECK_NS}" -- cat /workspace/marker.txt) == kept ]]; }
verdict_kept() { [[ $(verdict env-before) == "${verdict_before}" && -n ${verdict_before} ]]; }
new_claim_ready() {
  kubectl apply -n "${CHECK_NS}" -f - >/dev/null <<YAML
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxClaim
metadata: {name: claim-after}
spec: {sandboxTemplateRef: {name: ${TEMPLATE}}}
YAML
  ready sandboxclaim/claim-after
}
alpha_still_served() { kubectl get sandboxclaims.v1alpha1.extensions.agents.x-k8s.io claim-alpha -n "${CHECK_NS}" >/dev/null; }
new_environment_passes() {
  "$SHADOWCTL" create env-after -n "${CHECK_NS}" --local "${WORK}/src" --verify 'test -f src/hello.txt' --timeout 600 >/dev/null \
    && [[ $(verdict env-after) == PASS ]]
}

check "the same objects with the same uids (nothing deleted or recreated, workspace pods not restarted, Gitea's volume kept)" same_objects
check "environment, claims and sandboxes Ready" ready shadowenvironment/env-before sandboxclaim/claim-beta \
  sandboxclaim/claim-alpha sandbox/claim-beta sandbox/claim-alpha
check "the verdict kept (${verdict_before})" verdict_kept
check "the workspace's files kept" marker_kept
check "every stored CRD version still served" stored_versions_served
check "the v1alpha1 claim still readable as v1alpha1" alpha_still_served
check "a claim made after the upgrade becomes Ready" new_claim_ready
check "an environment made after the upgrade reaches PASS" new_environment_passes
check "shadowctl doctor is green" "$SHADOWCTL" doctor -n "${CHECK_NS}"

if ((KEEP == 0)); then
  "$SHADOWCTL" destroy env-before -n "${CHECK_NS}" >/dev/null 2>&1 || true
  "$SHADOWCTL" destroy env-after -n "${CHECK_NS}" >/dev/null 2>&1 || true
  kubectl delete namespace "${CHECK_NS}" --wait=false >/dev/null
fi
if ((${#FAILURES[@]})); then
  die "upgrade from ${FROM_REF:-${FROM_CHART}:${FROM_VERSION}}: ${#FAILURES[@]} check(s) failed: ${FAILURES[*]}"
fi
step "upgrade from ${FROM_REF:-${FROM_CHART}:${FROM_VERSION}} to $(git -C "${REPO_ROOT}" rev-parse --short HEAD): every check passed"
