#!/usr/bin/env bash
# `make e2e-argocd`: a real ArgoCD (core install: application controller, repo server, redis; no API server,
# UI or Dex) on the project's kind cluster installs the chart and a team's environments from a git server on
# the cluster (the project's own Gitea image), then tests/e2e_argocd runs against it. All images are built
# offline (hack/images.sh, plus its `argocd` group).
#
# One install of the chart per cluster: `up` uninstalls the Helm releases of the chart (make e2e's
# `sandboxes`) and, when no object of theirs is left, the chart's CRDs, so that ArgoCD's first sync creates
# them (CRD ordering is part of what is tested). The tests delete their Applications (and with them every
# object ArgoCD made); `down` removes ArgoCD and its git server, after which hack/kind/deploy.sh installs the
# release again (make e2e does that itself).
#
#   hack/kind/argocd.sh           # tools, images, cluster, up, the tests, down (what make e2e-argocd runs)
#   hack/kind/argocd.sh up        # ArgoCD and the git server on the cluster, the chart's releases removed
#   hack/kind/argocd.sh test      # the tests (ArgoCD up)
#   hack/kind/argocd.sh down      # the Applications (with their objects), ArgoCD, its CRDs and namespace
set -Eeuo pipefail
source "$(dirname "$0")/../lib.sh"

ARGOCD_NS=argocd
PY="${REPO_ROOT}/.venv/bin/python"
KUBECONFIG_PATH=$("${HACK_DIR}/kind/cluster.sh" kubeconfig)
HELM="${TOOLS_BIN}/helm-${HELM_VERSION}"
SHARE="${SHADOW_CACHE}/share/argocd-${ARGOCD_VERSION}"
BUILD="${SHADOW_CACHE}/build/argocd-kind"
VERSION=$(sed -n -E 's/^version: *//p' "${REPO_ROOT}/charts/shadow-operator/Chart.yaml")
CHART_CRDS=(sandboxes.agents.x-k8s.io sandboxclaims.extensions.agents.x-k8s.io
  sandboxtemplates.extensions.agents.x-k8s.io sandboxwarmpools.extensions.agents.x-k8s.io
  shadowenvironments.shadow.dev)
k() { kubectl --kubeconfig "${KUBECONFIG_PATH}" "$@"; }

# The chart as a release of these sources (images pinned by digest in the local registry), which the tests
# push into the git server: ${SHADOW_CACHE}/release/shadow-operator-VERSION.tgz, as hack/kind/deploy.sh makes it.
release_chart() {
  local registry
  registry=$("${HACK_DIR}/docker.sh" registry-host)
  "${HACK_DIR}/release.sh" "${VERSION}" "${registry}/shadow-operator" \
    --push-to "127.0.0.1:${SHADOW_REGISTRY_PORT:-5000}/shadow-operator" --skip-python \
    --out "${SHADOW_CACHE}/release" >"${SHADOW_CACHE}/logs/release-kind.log" 2>&1 \
    || { tail -n 20 "${SHADOW_CACHE}/logs/release-kind.log" >&2; die "hack/release.sh failed (log above)"; }
}

uninstall_helm_releases() {
  local ns name
  # Namespaces the e2e tests deleted finish first, while the operator still runs their finalizers: what they
  # hold would otherwise keep the CRDs below (and, without the operator, never go).
  local deadline=$((SECONDS + 180))
  while [[ -n $(k get namespaces --no-headers 2>/dev/null | awk '$2 == "Terminating" {print $1}') ]]; do
    if ((SECONDS > deadline)); then
      info "namespaces still terminating after 180 s: $(k get namespaces --no-headers | awk '$2 == "Terminating" {print $1}' | tr '\n' ' ')"
      break
    fi
    sleep 2
  done
  while read -r ns name; do
    [[ -n $name ]] || continue
    step "uninstalling the Helm release ${ns}/${name} (one install of the chart per cluster)"
    KUBECONFIG="${KUBECONFIG_PATH}" "$HELM" uninstall "$name" -n "$ns" --wait --timeout 3m >/dev/null
  done < <(KUBECONFIG="${KUBECONFIG_PATH}" "$HELM" list -A -o json | python3 -c '
import json, sys
for r in json.load(sys.stdin):
    if r["chart"].startswith("shadow-operator-"):
        print(r["namespace"], r["name"])')
  # Helm leaves crds/ behind. Without objects left in them they go too, so that ArgoCD creates them in its
  # first sync; objects left (someone's environments) keep them, and the CRD-ordering test says so.
  local crd count=0
  for crd in "${CHART_CRDS[@]}"; do
    k get crd "$crd" >/dev/null 2>&1 || continue
    count=$((count + $(k get "$crd" -A --no-headers 2>/dev/null | wc -l)))
  done
  if ((count == 0)); then
    k delete crd --ignore-not-found --wait=true "${CHART_CRDS[@]}" >/dev/null
  else
    info "keeping the chart's CRDs: ${count} objects of theirs are left on the cluster"
  fi
}

# ArgoCD's core install through kustomize: the local images, low CPU requests (one 2-CPU node carries the
# control plane, the operator and the environments), no ApplicationSet controller, the chart's health
# checks in argocd-cm under the keys charts/shadow-operator/README.md gives, health kept in the status.
kustomization() {
  local argocd redis
  argocd=$(sed -n 's/^SHADOW_ARGOCD_IMAGE=//p' "${SHADOW_CACHE}/images/argocd.env")
  redis=$(sed -n 's/^SHADOW_ARGOCD_REDIS_IMAGE=//p' "${SHADOW_CACHE}/images/argocd.env")
  [[ -n $argocd && -n $redis ]] || die "no argocd images pushed yet: run hack/images.sh argocd"
  rm -rf "${BUILD}" && mkdir -p "${BUILD}/health"
  cp -r "${SHARE}/manifests" "${BUILD}/manifests"
  cp "${REPO_ROOT}"/charts/shadow-operator/argocd/*.lua "${BUILD}/health/"
  local requests='resources: {requests: {cpu: 10m, memory: 64Mi}}'
  cat >"${BUILD}/kustomization.yaml" <<EOF
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: ${ARGOCD_NS}
resources:
  - manifests/core-install
images:
  - name: quay.io/argoproj/argocd
    newName: ${argocd%:*}
    newTag: ${argocd##*:}
  - name: public.ecr.aws/docker/library/redis
    newName: ${redis%:*}
    newTag: ${redis##*:}
generatorOptions:
  disableNameSuffixHash: true
configMapGenerator:
  - name: argocd-cm
    behavior: merge
    files:
      - resource.customizations.health.shadow.dev_ShadowEnvironment=health/shadowenvironment-health.lua
      - resource.customizations.health.shadow.dev_ShadowEnvironmentPool=health/shadowenvironmentpool-health.lua
      - resource.customizations.health.agents.x-k8s.io_Sandbox=health/sandbox-health.lua
      - resource.customizations.health.extensions.agents.x-k8s.io_SandboxClaim=health/sandboxclaim-health.lua
  # Each object's health in the Application's status.resources (ArgoCD 2's behaviour; 3 keeps it only in
  # the resource tree the API server serves, and a core install has no API server): what the tests read.
  - name: argocd-cmd-params-cm
    behavior: merge
    literals:
      - controller.resource.health.persist=true
patches:
  - target: {kind: Deployment, name: argocd-applicationset-controller}
    patch: '[{"op": "replace", "path": "/spec/replicas", "value": 0}]'
  - patch: |
      {apiVersion: apps/v1, kind: StatefulSet, metadata: {name: argocd-application-controller},
       spec: {template: {spec: {containers: [{name: argocd-application-controller, ${requests}}]}}}}
  - patch: |
      {apiVersion: apps/v1, kind: Deployment, metadata: {name: argocd-repo-server},
       spec: {template: {spec: {containers: [{name: argocd-repo-server, ${requests}}]}}}}
  - patch: |
      {apiVersion: apps/v1, kind: Deployment, metadata: {name: argocd-redis},
       spec: {template: {spec: {containers: [{name: redis, ${requests}}]}}}}
EOF
}

# The git server the Applications come from: one Gitea Pod of the project's image (data in an emptyDir: the
# tests push what they need), an admin whose password is generated here, repositories created by a push
# and public (ArgoCD clones without credentials).
git_server() {
  local gitea registry
  gitea=$(sed -n 's/^SHADOW_GITEA_IMAGE=//p' "${SHADOW_CACHE}/images/pushed.env")
  registry=$(sed -n 's/^SHADOW_REGISTRY=//p' "${SHADOW_CACHE}/images/pushed.env")
  [[ -n $gitea && -n $registry ]] || die "no gitea image pushed yet: run hack/images.sh"
  if ! k -n "${ARGOCD_NS}" get secret gitops-git-admin >/dev/null 2>&1; then
    k -n "${ARGOCD_NS}" create secret generic gitops-git-admin --from-literal=username=gitops \
      --from-literal="password=$(head -c 18 /dev/urandom | base64 | tr -d '/+\n')" >/dev/null
  fi
  k apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Service
metadata: {name: gitops-git, namespace: ${ARGOCD_NS}}
spec:
  selector: {app.kubernetes.io/name: gitops-git}
  ports: [{name: http, port: 3000, targetPort: 3000}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: gitops-git, namespace: ${ARGOCD_NS}, labels: {app.kubernetes.io/name: gitops-git}}
spec:
  replicas: 1
  strategy: {type: Recreate}
  selector: {matchLabels: {app.kubernetes.io/name: gitops-git}}
  template:
    metadata: {labels: {app.kubernetes.io/name: gitops-git}}
    spec:
      automountServiceAccountToken: false
      securityContext: {runAsNonRoot: true, runAsUser: 1000, runAsGroup: 1000, fsGroup: 1000,
                        seccompProfile: {type: RuntimeDefault}}
      containers:
        - name: gitea
          image: ${registry}/${gitea}
          env:
            - {name: GITEA_ROOT_URL, value: "http://gitops-git.${ARGOCD_NS}.svc.cluster.local:3000/"}
            - {name: GITEA_ADMIN_USERNAME, valueFrom: {secretKeyRef: {name: gitops-git-admin, key: username}}}
            - {name: GITEA_ADMIN_PASSWORD, valueFrom: {secretKeyRef: {name: gitops-git-admin, key: password}}}
            - {name: GITEA__repository__ENABLE_PUSH_CREATE_USER, value: "true"}
            - {name: GITEA__repository__DEFAULT_PUSH_CREATE_PRIVATE, value: "false"}
          ports: [{containerPort: 3000}]
          readinessProbe: {httpGet: {path: /api/healthz, port: 3000}, periodSeconds: 2}
          resources: {requests: {cpu: 10m, memory: 64Mi}, limits: {memory: 512Mi}}
          securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}
          volumeMounts: [{name: data, mountPath: /data}]
      volumes: [{name: data, emptyDir: {}}]
EOF
}

up() {
  export KUBECONFIG="${KUBECONFIG_PATH}"
  step "releasing the chart ${VERSION} into the local registry"
  release_chart
  uninstall_helm_releases
  step "installing ArgoCD ${ARGOCD_VERSION} (core) into namespace ${ARGOCD_NS}"
  kustomization
  k create namespace "${ARGOCD_NS}" --dry-run=client -o yaml | k apply -f - >/dev/null
  # Server-side: the Application CRD is too large for the last-applied annotation of a client-side apply.
  k kustomize "${BUILD}" >"${BUILD}/rendered.yaml"
  k apply --server-side --force-conflicts -f "${BUILD}/rendered.yaml" >/dev/null
  # The project the Applications name; ArgoCD's API server creates it, and the core install has none.
  local i
  for ((i = 0; i < 60; i++)); do
    [[ $(k get crd appprojects.argoproj.io -o jsonpath='{.status.conditions[?(@.type=="Established")].status}' 2>/dev/null) == True ]] \
      && break
    sleep 1
  done
  k apply -f - >/dev/null <<EOF
apiVersion: argoproj.io/v1alpha1
kind: AppProject
metadata: {name: default, namespace: ${ARGOCD_NS}}
spec:
  sourceRepos: ['*']
  destinations: [{namespace: '*', server: '*'}]
  clusterResourceWhitelist: [{group: '*', kind: '*'}]
EOF
  git_server
  k -n "${ARGOCD_NS}" rollout status statefulset/argocd-application-controller --timeout 180s >/dev/null
  k -n "${ARGOCD_NS}" rollout status deploy/argocd-repo-server --timeout 180s >/dev/null
  k -n "${ARGOCD_NS}" rollout status deploy/argocd-redis --timeout 180s >/dev/null
  k -n "${ARGOCD_NS}" rollout status deploy/gitops-git --timeout 180s >/dev/null
  info "ArgoCD and its git server are ready"
}

run_tests() {
  SHADOW_E2E_KUBECONFIG="${KUBECONFIG_PATH}" SHADOW_CHART_RELEASE="${SHADOW_CACHE}/release/shadow-operator-${VERSION}.tgz" \
    "$PY" -m pytest -m argocd "${REPO_ROOT}/tests/e2e_argocd" ${PYTEST_ARGS:-}
}

down() {
  export KUBECONFIG="${KUBECONFIG_PATH}"
  if k get crd applications.argoproj.io >/dev/null 2>&1; then
    # The root's automated sync would bring back what is deleted under it: switched off first. Then the
    # tenants' Applications before the platform's: the operator finalizes environments while it still runs.
    # A sync still retrying holds up the deletion of its Application: stopped too.
    local app
    for app in gitops team-a shadow-operator; do
      k -n "${ARGOCD_NS}" patch application "$app" --type merge -p '{"spec": {"syncPolicy": null}, "operation": null}' \
        >/dev/null 2>&1 || true
    done
    for app in team-a shadow-operator gitops; do
      k -n "${ARGOCD_NS}" delete application "$app" --ignore-not-found --wait=true --timeout 5m >/dev/null
    done
  fi
  step "removing ArgoCD (namespace ${ARGOCD_NS}, its cluster roles and CRDs)"
  k delete namespace "${ARGOCD_NS}" --ignore-not-found --wait=true --timeout 5m >/dev/null
  k delete clusterrole,clusterrolebinding -l app.kubernetes.io/part-of=argocd --ignore-not-found >/dev/null
  k delete crd applications.argoproj.io applicationsets.argoproj.io appprojects.argoproj.io \
    --ignore-not-found >/dev/null
}

all() {
  local started=$SECONDS
  steps_begin "make e2e-argocd"
  STEPS_RECORD="${SHADOW_CACHE}/logs/e2e-argocd-steps.txt"
  : >"$STEPS_RECORD"
  run_step "docker daemon and local registry" "${HACK_DIR}/docker.sh"
  run_step "tools (kind, helm, Kubernetes node binaries, argocd)" "${HACK_DIR}/build-tools.sh" kind helm node \
    control-plane coredns local-path-provisioner argocd
  run_step "images (offline, cached)" "${HACK_DIR}/images.sh"
  run_step "argocd images (offline, cached)" "${HACK_DIR}/images.sh" argocd
  run_step "kind cluster" "${HACK_DIR}/kind/cluster.sh" up
  run_step "ArgoCD and its git server" up
  local rc=0 t0=$SECONDS
  step "e2e-argocd tests"
  run_tests || rc=$?
  echo "e2e-argocd tests=$((SECONDS - t0))" >>"$STEPS_RECORD"
  run_step "removing ArgoCD" down
  steps_end
  ((rc == 0)) || die "the e2e-argocd tests failed (ArgoCD removed; hack/kind/argocd.sh up && hack/kind/argocd.sh test to debug)"
  # What passed, for .ci/run's rule (a cold CI run skips this tier while its inputs are unchanged): commit it.
  argocd_inputs_hash >"${REPO_ROOT}/.ci/argocd-passed"
  step "make e2e-argocd passed in $((SECONDS - started))s (steps: ${STEPS_RECORD})"
}

case "${1:-all}" in
  all) all ;;
  up) up ;;
  test) run_tests ;;
  down) down ;;
  *) die "usage: $0 [all|up|test|down]" ;;
esac
