#!/usr/bin/env bash
# Install (or upgrade) shadow-operator on the project's kind cluster the way a user installs a release:
# hack/release.sh releases the locally built images and the chart (version from Chart.yaml) into the local
# registry, images pinned by digest; then the release's CRDs are applied server-side (Helm never upgrades
# crds/) and `helm upgrade --install RELEASE oci://.../charts/shadow-operator --version V`, with no image
# values. Release and namespace: SHADOW_RELEASE and SHADOW_RELEASE_NAMESPACE (hack/lib.sh: sandboxes in
# sandbox-platform); another install of the chart on this cluster is uninstalled first (the cluster is the
# project's own).
# One 2-CPU kind node (about 1 CPU left beside the control plane) carries the demo, the e2e tests and several
# environments at once, so each sandbox of the default template and each environment's Gitea reserves 10m of CPU
# here (the chart's defaults are 100m and 50m).
#   hack/kind/deploy.sh [extra helm args...]
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

NAMESPACE="${SHADOW_RELEASE_NAMESPACE}"
RELEASE="${SHADOW_RELEASE}"
KUBECONFIG_PATH=$("${HACK_DIR}/kind/cluster.sh" kubeconfig)
export KUBECONFIG="${KUBECONFIG_PATH}"
HELM="${TOOLS_BIN}/helm-${HELM_VERSION}"
[[ -x $HELM ]] || "${HACK_DIR}/build-tools.sh" helm >&2

FULLNAME=$(shadow_fullname "$RELEASE")
VERSION=$(sed -n -E 's/^version: *//p' "${REPO_ROOT}/charts/shadow-operator/Chart.yaml")
NODE_REGISTRY=$("${HACK_DIR}/docker.sh" registry-host)
PUSH_HOST="127.0.0.1:${SHADOW_REGISTRY_PORT:-5000}"
OUT="${SHADOW_CACHE}/release"

step "releasing ${VERSION} into the local registry (images pulled by nodes from ${NODE_REGISTRY})"
"${HACK_DIR}/release.sh" "${VERSION}" "${NODE_REGISTRY}/shadow-operator" --push-to "${PUSH_HOST}/shadow-operator" \
  --skip-python --out "${OUT}" >"${SHADOW_CACHE}/logs/release-kind.log" 2>&1 \
  || { tail -n 20 "${SHADOW_CACHE}/logs/release-kind.log" >&2; die "hack/release.sh failed (log above)"; }
CHART_REF="oci://${PUSH_HOST}/shadow-operator/charts/shadow-operator"

others=$("$HELM" list -A -o json | python3 -c '
import json, sys
release, namespace = sys.argv[1:]
for r in json.load(sys.stdin):
    if r["chart"].startswith("shadow-operator-") and (r["name"], r["namespace"]) != (release, namespace):
        print(r["namespace"], r["name"])' "$RELEASE" "$NAMESPACE")
while read -r ns name; do
  [[ -n $name ]] || continue
  step "uninstalling the earlier install ${ns}/${name} (one install per cluster)"
  "$HELM" uninstall "$name" -n "$ns" --wait --timeout 3m >/dev/null
done <<<"$others"

# Helm installs crds/ only on first install and never upgrades them: apply the release's own, server-side
# (the documented upgrade path).
step "applying the release's CRDs"
PULLED=$(mktemp -d)
trap 'rm -rf "${PULLED}"' EXIT
tar -xzf "${OUT}/shadow-operator-${VERSION}.tgz" -C "${PULLED}" shadow-operator/crds
kubectl apply --server-side --force-conflicts -f "${PULLED}/shadow-operator/crds" >/dev/null

# Tenants' namespaces (the chart prepares each: default template, discovery, routing; users get `edit` there).
TENANTS="${SHADOW_TENANT_NAMESPACES:-team-a}"
for ns in ${TENANTS//,/ }; do
  kubectl create namespace "$ns" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
done

# Private previews are signed with keys from this Secret (the chart renders nothing random, so it is made
# here, once; rotating means adding a key and later removing the old one).
kubectl create namespace "${NAMESPACE}" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
if ! kubectl -n "${NAMESPACE}" get secret "${FULLNAME}-preview-keys" >/dev/null 2>&1; then
  step "creating the preview signing key Secret ${FULLNAME}-preview-keys"
  kubectl -n "${NAMESPACE}" create secret generic "${FULLNAME}-preview-keys" \
    --from-literal="k$(date +%Y%m%d)=$(head -c 32 /dev/urandom | base64 | tr -d '\n')" >/dev/null
fi

step "helm upgrade --install ${RELEASE} ${CHART_REF} --version ${VERSION} (namespace ${NAMESPACE})"
"$HELM" upgrade --install "${RELEASE}" "${CHART_REF}" --version "${VERSION}" --plain-http \
  --namespace "${NAMESPACE}" --create-namespace \
  --set previewRouter.enabled=true --set previewRouter.domain=preview.localhost --set previewRouter.scheme=http \
  --set 'networkPolicy.clusterCIDRs={10.244.0.0/16,10.96.0.0/16}' \
  --set gitea.resources.requests.cpu=10m --set defaultTemplate.resources.requests.cpu=10m \
  --set "tenants.namespaces={${TENANTS}}" \
  --set egressGateway.enabled=true --set egressGateway.resources.requests.cpu=10m \
  --set 'egressGateway.allowPrivateRanges={10.244.0.0/16,10.96.0.0/16}' \
  --wait --timeout 3m "$@" >/dev/null \
  || {
    kubectl -n "${NAMESPACE}" get pods -o wide >&2 || true
    kubectl -n "${NAMESPACE}" logs deploy/"${FULLNAME}" --tail 30 >&2 || true
    die "helm install failed (pods and operator log above)"
  }
kubectl -n "${NAMESPACE}" rollout status deploy/"${FULLNAME}" --timeout 180s >/dev/null
info "operator ready: $(kubectl -n "${NAMESPACE}" get pods -l app.kubernetes.io/component=operator -o name)"
