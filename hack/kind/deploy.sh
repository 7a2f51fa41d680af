#!/usr/bin/env bash
# Install (or upgrade) charts/shadow-operator on the project's kind cluster from the locally built images,
# served by the local registry: the air-gapped install path (global.imageRegistry) exercised for real.
# One 2-CPU kind node carries the demo, the e2e tests and several environments at once, so each environment's
# Gitea reserves 10m of CPU here (the chart's default is 50m).
#   hack/kind/deploy.sh [extra helm args...]
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

NAMESPACE="${SHADOW_NAMESPACE:-shadow-system}"
RELEASE="${SHADOW_RELEASE:-shadow-operator}"
CHART="${REPO_ROOT}/charts/shadow-operator"
KUBECONFIG_PATH=$("${HACK_DIR}/kind/cluster.sh" kubeconfig)
export KUBECONFIG="${KUBECONFIG_PATH}"
HELM="${TOOLS_BIN}/helm-${HELM_VERSION}"
[[ -x $HELM ]] || "${HACK_DIR}/build-tools.sh" helm >&2

eval "$("${HACK_DIR}/images.sh" env 2>/dev/null)"
tag() { echo "${1##*:}"; }

# Helm installs crds/ only on first install and never upgrades them; apply them so a changed API lands.
step "applying the Sandbox API CRDs"
kubectl apply --server-side --force-conflicts -f "${CHART}/crds" >/dev/null

# Private previews are signed with keys from this Secret (the chart renders nothing random, so it is made
# here, once; rotating means adding a key and later removing the old one).
kubectl create namespace "${NAMESPACE}" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
if ! kubectl -n "${NAMESPACE}" get secret "${RELEASE}-preview-keys" >/dev/null 2>&1; then
  step "creating the preview signing key Secret ${RELEASE}-preview-keys"
  kubectl -n "${NAMESPACE}" create secret generic "${RELEASE}-preview-keys" \
    --from-literal="k$(date +%Y%m%d)=$(head -c 32 /dev/urandom | base64 | tr -d '\n')" >/dev/null
fi

step "helm upgrade --install ${RELEASE} (namespace ${NAMESPACE}, images from ${SHADOW_REGISTRY})"
"$HELM" upgrade --install "${RELEASE}" "${CHART}" --namespace "${NAMESPACE}" --create-namespace \
  --set "global.imageRegistry=${SHADOW_REGISTRY}" \
  --set "operator.image.tag=$(tag "${SHADOW_OPERATOR_IMAGE}")" \
  --set "workspace.image.tag=$(tag "${SHADOW_WORKSPACE_IMAGE}")" \
  --set "previewRouter.image.tag=$(tag "${SHADOW_ROUTER_IMAGE}")" \
  --set "gitea.image.tag=$(tag "${SHADOW_GITEA_IMAGE:?no gitea image pushed yet: run hack/images.sh}")" \
  --set previewRouter.enabled=true --set previewRouter.domain=preview.localhost --set previewRouter.scheme=http \
  --set 'networkPolicy.clusterCIDRs={10.244.0.0/16,10.96.0.0/16}' \
  --set gitea.resources.requests.cpu=10m \
  --wait --timeout 3m "$@" >/dev/null \
  || {
    kubectl -n "${NAMESPACE}" get pods -o wide >&2 || true
    kubectl -n "${NAMESPACE}" logs deploy/"${RELEASE}" --tail 30 >&2 || true
    die "helm install failed (pods and operator log above)"
  }
kubectl -n "${NAMESPACE}" rollout status deploy/"${RELEASE}" --timeout 180s >/dev/null
info "operator ready: $(kubectl -n "${NAMESPACE}" get pods -l app.kubernetes.io/component=operator -o name)"
