#!/usr/bin/env bash
# `make demo`: from a fresh machine to a running sandbox. Sets everything up (dockerd, tools, offline
# images, the kind cluster, the operator via Helm), claims a workspace, runs a command in it, serves a
# preview from it through the preview router, and prints how to use and clean up what it made.
set -Eeuo pipefail
source "$(dirname "$0")/lib.sh"

NAMESPACE="${SHADOW_RELEASE_NAMESPACE}"
RELEASE="${SHADOW_RELEASE}"
FULLNAME=$(shadow_fullname "$RELEASE")
CLAIM="${SHADOW_DEMO_CLAIM:-demo}"
STARTED=$SECONDS
PIDS=()
cleanup() { local p; for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
steps_begin "make demo"

run_step "docker daemon and local registry" "${HACK_DIR}/docker.sh"
run_step "tools: kind, helm and Kubernetes built from Go modules (cold: ~30 min on 2 cores)" \
  "${HACK_DIR}/build-tools.sh" kind helm node control-plane coredns local-path-provisioner
run_step "container images, built offline (cold: ~10 min)" "${HACK_DIR}/images.sh"
run_step "kind cluster" "${HACK_DIR}/kind/cluster.sh" up
export KUBECONFIG
KUBECONFIG=$("${HACK_DIR}/kind/cluster.sh" kubeconfig)
run_step "operator (helm upgrade --install)" "${HACK_DIR}/kind/deploy.sh"

claim_ready() {
  kubectl -n "$NAMESPACE" get sandboxclaims.extensions.agents.x-k8s.io "$CLAIM" \
    -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null | grep -qx True
}

create_claim() {
  kubectl -n "$NAMESPACE" apply -f - >/dev/null <<YAML
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxClaim
metadata:
  name: ${CLAIM}
spec:
  sandboxTemplateRef:
    name: workspace
YAML
  local t0=$SECONDS
  until claim_ready; do
    ((SECONDS - t0 < 240)) || {
      kubectl -n "$NAMESPACE" describe sandboxclaims.extensions.agents.x-k8s.io "$CLAIM" >&2 || true
      die "the claim did not become Ready in 240s (operator log: kubectl -n $NAMESPACE logs deploy/$FULLNAME)"
    }
    printf '\r    waiting for sandbox Ready... %ss' "$((SECONDS - t0))" >&2
    sleep 1
  done
  printf '\r    sandbox Ready after %ss          \n' "$((SECONDS - t0))" >&2
}
run_step "claim a workspace (SandboxClaim ${NAMESPACE}/${CLAIM})" create_claim

SANDBOX=$(kubectl -n "$NAMESPACE" get sandboxclaims.extensions.agents.x-k8s.io "$CLAIM" -o jsonpath='{.status.sandbox.name}')
SANDBOX=${SANDBOX:-$CLAIM}
TOKEN_SECRET=$(kubectl -n "$NAMESPACE" get sandboxes.agents.x-k8s.io "$SANDBOX" -o jsonpath='{.status.runtimeTokenSecret}')
TOKEN=
[[ -z $TOKEN_SECRET ]] || TOKEN=$(kubectl -n "$NAMESPACE" get secret "$TOKEN_SECRET" -o jsonpath='{.data.token}' | base64 -d)

# port_forward TARGET REMOTE_PORT: forward a free local port; prints the local port.
port_forward() {
  local out
  out=$(mktemp)
  kubectl -n "$NAMESPACE" port-forward "$1" ":$2" >"$out" 2>&1 &
  PIDS+=($!)
  local i
  for ((i = 0; i < 100; i++)); do
    grep -q 'Forwarding from 127.0.0.1:' "$out" && break
    sleep 0.1
  done
  sed -n 's/^Forwarding from 127\.0\.0\.1:\([0-9]*\) .*/\1/p' "$out" | head -n 1
}

runtime_call() { # runtime_call METHOD PATH [JSON]
  local auth=()
  [[ -z $TOKEN ]] || auth=(-H "Authorization: Bearer ${TOKEN}")
  curl -fsS -X "$1" "${auth[@]}" -H 'Content-Type: application/json' ${3:+--data "$3"} "http://127.0.0.1:${RUNTIME_PORT}$2"
}

run_command() {
  RUNTIME_PORT=$(port_forward "pod/${SANDBOX}" 8888)
  [[ -n $RUNTIME_PORT ]] || die "kubectl port-forward to pod/${SANDBOX} failed"
  local cmd='echo "hello from $(hostname) as $(id -un)"; python3 --version; node --version; git --version'
  echo "    \$ ${cmd}"
  runtime_call POST /v1/exec "$(python3 -c 'import json,sys; print(json.dumps({"argv": ["sh", "-c", sys.argv[1]]}))' "$cmd")" \
    | python3 -c 'import json,sys; r=json.load(sys.stdin); print("".join("    " + l + "\n" for l in (r["stdout"] + r["stderr"]).splitlines()), end=""); sys.exit(r["exit_code"])'
}
run_step "run a command in the sandbox (through its runtime API)" run_command

PREVIEW_URL=$(kubectl -n "$NAMESPACE" get sandboxes.agents.x-k8s.io "$SANDBOX" -o jsonpath='{.status.previewURL}')
serve_preview() {
  runtime_call POST /v1/processes '{"argv": ["sh", "-c", "echo \"<h1>preview of $(hostname)</h1>\" > index.html && exec python3 -m http.server 3000"]}' >/dev/null
  ROUTER_PORT=$(port_forward "svc/${FULLNAME}-preview-router" 80)
  [[ -n $ROUTER_PORT ]] || die "kubectl port-forward to the preview router failed"
  local i body=
  for ((i = 0; i < 50; i++)); do
    body=$(curl -fsS -H "Host: ${SANDBOX}.preview.localhost" "http://127.0.0.1:${ROUTER_PORT}/" 2>/dev/null) && break
    sleep 0.2
  done
  [[ -n $body ]] || die "the preview router did not answer for ${SANDBOX}.preview.localhost"
  echo "    router answered: ${body}"
}
run_step "serve a preview (python http.server on port 3000) through the nginx preview router" serve_preview
# A ShadowEnvironment from a local repository (SHADOW_DEMO_SOURCE=PATH[:org/name], default: a sample package
# with an uncommitted change), driven with shadowctl: create (upload, its own Gitea, a verdict), exec (install
# from the rewritten GitHub URL), an edit in the workspace, diff, promote back into the local directory.
run_step "a ShadowEnvironment with shadowctl: create, exec, diff, promote" \
  "${REPO_ROOT}/.venv/bin/python" "${HACK_DIR}/demo_environment.py" --namespace "$NAMESPACE" \
  ${SHADOW_DEMO_SOURCE:+--source "$SHADOW_DEMO_SOURCE"}
steps_end

cat <<EOF

  Demo ready in $((SECONDS - STARTED))s.

  Sandbox:      ${NAMESPACE}/${SANDBOX} (claim ${CLAIM})
  Preview URL:  ${PREVIEW_URL:-http://${SANDBOX}.preview.localhost}
                reach it from this machine with:
                  kubectl -n ${NAMESPACE} port-forward svc/${FULLNAME}-preview-router 8080:80 &
                  curl http://${SANDBOX}.preview.localhost:8080/
  Cluster:      export KUBECONFIG=${KUBECONFIG}
                kubectl get pods -A

  Environment:  kubectl -n ${NAMESPACE} get shadowenvironments demo-env   # READY, SOURCES, VERDICT
                try your own repository: SHADOW_DEMO_SOURCE=~/src/myrepo make demo

  Clean up:     kubectl -n ${NAMESPACE} delete sandboxclaims.extensions.agents.x-k8s.io ${CLAIM}  # the sandbox and everything it owns
                kubectl -n ${NAMESPACE} delete shadowenvironment demo-env   # its workspace, Gitea and volumes
                make kind-down                                        # the whole cluster
EOF
