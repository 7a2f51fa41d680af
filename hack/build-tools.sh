#!/usr/bin/env bash
# Build the pinned external tools from Go modules into ~/.cache/shadow-operator/bin.
# Idempotent: a tool whose versioned binary exists is skipped, so a warm run is a no-op.
#
#   hack/build-tools.sh                 # the set used by `make test`: control-plane, helm, gitea,
#                                       # csi-sanity, snapshot-crds (both small)
#   hack/build-tools.sh kind helm node  # named groups (control-plane, etcd, kwok, kind, helm, node,
#                                       # coredns, local-path-provisioner, gitea, snapshots, csi-sanity,
#                                       # snapshot-crds, argocd, gvisor)
#   hack/build-tools.sh snapshots       # snapshot-controller, csi-snapshotter, csi-provisioner, csi-sanity
#                                       # and the snapshot CRDs (share/snapshot-crds-VERSION)
#   hack/build-tools.sh argocd          # argocd (every ArgoCD component, by argv[0]) and its CRDs and
#                                       # install manifests (share/argocd-VERSION); only on request
#   hack/build-tools.sh gvisor          # runsc and containerd-shim-runsc-v1 for the kind node image
set -euo pipefail
source "$(dirname "$0")/lib.sh"

GO_BUILD_FLAGS=(-trimpath)
export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:--buildvcs=false}"
SRC_DIR="${SHADOW_CACHE}/src"
mkdir -p "${SRC_DIR}"

# have NAME VERSION: true when the versioned binary is already built.
have() { [[ -x "${TOOLS_BIN}/$1-$2" ]]; }

# link NAME VERSION: point the unversioned name at the versioned binary.
link() { ln -sfn "$1-$2" "${TOOLS_BIN}/$1"; }

# install_module NAME VERSION PACKAGE: `go install PACKAGE@VERSION` for modules without replace directives.
install_module() {
  local name=$1 version=$2 pkg=$3 tmp
  if have "$name" "$version"; then info "$name $version: cached"; link "$name" "$version"; return; fi
  step "building $name $version from $pkg"
  tmp=$(mktemp -d)
  GOBIN="$tmp" go install "${GO_BUILD_FLAGS[@]}" -ldflags="-s -w" "${pkg}@${version}"
  mv "$tmp/$(basename "$pkg")" "${TOOLS_BIN}/$name-$version"
  rm -rf "$tmp"
  link "$name" "$version"
}

build_etcd() {
  local v=${ETCD_VERSION} dir="${SRC_DIR}/etcd-${ETCD_VERSION}"
  if have etcd "$v"; then info "etcd $v: cached"; link etcd "$v"; return; fi
  step "building etcd $v (wrapper module; etcd's server module uses local replaces)"
  mkdir -p "$dir"
  cat >"$dir/go.mod" <<GOMOD
module shadow-operator.local/tools/etcd

go 1.24

require go.etcd.io/etcd/server/v3 $v

replace (
	go.etcd.io/etcd/api/v3 => go.etcd.io/etcd/api/v3 $v
	go.etcd.io/etcd/client/pkg/v3 => go.etcd.io/etcd/client/pkg/v3 $v
	go.etcd.io/etcd/client/v3 => go.etcd.io/etcd/client/v3 $v
	go.etcd.io/etcd/pkg/v3 => go.etcd.io/etcd/pkg/v3 $v
)
GOMOD
  printf '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n' >"$dir/tools.go"
  (cd "$dir" && go mod tidy && go build "${GO_BUILD_FLAGS[@]}" -ldflags="-s -w" -o "${TOOLS_BIN}/etcd-$v" go.etcd.io/etcd/server/v3)
  link etcd "$v"
}

# CoreDNS for the kind cluster, built with just the plugins the Corefile kubeadm writes uses (errors, health,
# ready, kubernetes, prometheus, forward, cache, loop, reload, loadbalance; log and whoami besides): upstream's
# main links about 60 plugins whose cloud SDKs (AWS, Azure, Google, Datadog tracing) made it one of the slowest
# cold builds. Same module and versions (its go.mod decides every dependency); plugins register in init().
COREDNS_PLUGINS=(cache errors forward health kubernetes loadbalance log loop metrics ready reload whoami)
build_coredns() {
  local v=${COREDNS_VERSION} dir="${SRC_DIR}/coredns-${COREDNS_VERSION}" p
  if have coredns "$v"; then info "coredns $v: cached"; link coredns "$v"; return; fi
  step "building coredns $v with the plugins kubeadm's Corefile uses (${COREDNS_PLUGINS[*]})"
  mkdir -p "$dir"
  printf 'module shadow-operator.local/tools/coredns\n\ngo 1.24\n\nrequire github.com/coredns/coredns %s\n' "$v" \
    >"$dir/go.mod"
  {
    printf 'package main\n\nimport (\n\t"github.com/coredns/coredns/coremain"\n\n'
    for p in "${COREDNS_PLUGINS[@]}"; do printf '\t_ "github.com/coredns/coredns/plugin/%s"\n' "$p"; done
    printf ')\n\nfunc main() { coremain.Run() }\n'
  } >"$dir/main.go"
  (cd "$dir" && go mod tidy && go build "${GO_BUILD_FLAGS[@]}" -ldflags="-s -w" -o "${TOOLS_BIN}/.coredns-$v.tmp" .)
  mv "${TOOLS_BIN}/.coredns-$v.tmp" "${TOOLS_BIN}/coredns-$v"
  link coredns "$v"
}

# Kubernetes: k8s.io/kubernetes requires its staging modules at v0.0.0 through local replaces that do not
# apply to consumers, so a wrapper module pins each staging module to the matching v0.X.Y (kubernetes#79384).
k8s_module_dir() { echo "${SRC_DIR}/kubernetes-${KUBERNETES_VERSION}"; }

prepare_k8s_module() {
  local v=${KUBERNETES_VERSION} dir staging_v gomod
  dir=$(k8s_module_dir)
  [[ -f "$dir/go.sum" ]] && return
  staging_v="v0.${v#v1.}"
  step "preparing wrapper module for k8s.io/kubernetes $v (staging modules at $staging_v)"
  mkdir -p "$dir"
  gomod=$(cd "$dir" && go mod download -json "k8s.io/kubernetes@$v" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')
  {
    printf 'module shadow-operator.local/tools/kubernetes\n\ngo 1.24\n\nrequire k8s.io/kubernetes %s\n\nreplace (\n' "$v"
    sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\t\1 => \1 '"$staging_v"'#p' "$gomod"
    printf ')\n'
  } >"$dir/go.mod"
  {
    printf '//go:build tools\n\npackage tools\n\nimport (\n'
    for c in kube-apiserver kube-controller-manager kube-scheduler kubelet kubeadm kube-proxy; do
      printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$c"
    done
    printf '\t_ "k8s.io/kubectl/pkg/cmd"\n)\n'
  } >"$dir/tools.go"
  (cd "$dir" && go mod tidy)
}

# build_k8s CMD...: build Kubernetes commands with version information stamped in (kubeadm and the
# kind node-image build read it).
build_k8s() {
  local v=${KUBERNETES_VERSION} dir minor ldflags missing=() c pkgs=()
  for c in "$@"; do have "$c" "$v" || missing+=("$c"); done
  if ((${#missing[@]} == 0)); then info "$* $v: cached"; for c in "$@"; do link "$c" "$v"; done; return; fi
  prepare_k8s_module
  dir=$(k8s_module_dir)
  minor=${v#v1.}; minor=${minor%%.*}
  ldflags="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $p.gitVersion=$v -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
    ldflags+=" -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  for c in "${missing[@]}"; do
    if [[ $c == kubectl ]]; then pkgs+=(k8s.io/kubernetes/cmd/kubectl); else pkgs+=("k8s.io/kubernetes/cmd/$c"); fi
  done
  step "building ${missing[*]} $v (cold: several minutes per binary on 2 cores)"
  local out; out=$(mktemp -d)
  (cd "$dir" && go build "${GO_BUILD_FLAGS[@]}" -ldflags="$ldflags" -o "$out/" "${pkgs[@]}")
  for c in "${missing[@]}"; do mv "$out/$c" "${TOOLS_BIN}/$c-$v"; link "$c" "$v"; done
  rm -rf "$out"
}

# Gitea: its go.mod declares the module path gitea.dev (not code.gitea.io/gitea) and has replace
# directives, so `go install` cannot build it; the downloaded module is copied and built as the main module.
# v1.27 picks its SQLite driver by tag: the default is the pure-Go modernc driver (what upstream ships);
# `sqlite` is no longer a tag and `sqlite_unlock_notify` only matters with `sqlite_mattn` (cgo). So no tags
# and CGO_ENABLED=0: a static binary and no C compiler needed.
# Without the bindata tag Gitea reads templates/, options/ and public/ from [server] STATIC_ROOT_PATH: they
# go to share/gitea-VERSION. The web UI bundle (public/assets, built with npm/pnpm) is not built: the API,
# /api/healthz and git smart HTTP do not use it; only HTML pages would lack scripts and styles.
gitea_share_dir() { echo "${SHADOW_CACHE}/share/gitea-$1"; }

# Modules Gitea requires under gitea.dev, a host the module proxy may refuse. The same releases are served
# under their former paths (their go.mod already says gitea.dev/...): they are re-packaged under gitea.dev
# into a local file proxy, and Go checks them against Gitea's own go.sum, so the content is upstream's.
GITEA_MOVED_MODULES=("gitea.dev/actions-proto-go=code.gitea.io/actions-proto-go" "gitea.dev/sdk=code.gitea.io/sdk")
# Versions the proxy refuses, replaced by the nearest newer release it serves (verified by the checksum
# database). client-go is only used by Gitea's GitLab migration importer.
GITEA_VERSION_REPLACES=("gitlab.com/gitlab-org/api/client-go/v2=gitlab.com/gitlab-org/api/client-go/v2@v2.43.0")

# gitea_local_proxy SRC_DIR PROXY_DIR: fill PROXY_DIR (a file:// GOPROXY) with the moved modules.
gitea_local_proxy() {
  local src=$1 proxy=$2 pair path old version json zip mod
  for pair in "${GITEA_MOVED_MODULES[@]}"; do
    path=${pair%%=*} old=${pair#*=}
    version=$(awk -v m="$path" '$1 == m {print $2}' "$src/go.mod")
    [[ -n $version ]] || die "gitea: $path is not required by Gitea's go.mod"
    [[ -f "$proxy/$path/@v/$version.zip" ]] && continue
    # The checksum database need not list the old path (it has no code.gitea.io/sdk v1.1.0): skip that
    # lookup; the build checks the re-packaged module against Gitea's go.sum, which is what counts.
    json=$(cd "${SRC_DIR}" && GONOSUMDB="$old" go mod download -json "$old@$version")
    zip=$(sed -n 's/.*"Zip": "\(.*\)",/\1/p' <<<"$json")
    mod=$(sed -n 's/.*"GoMod": "\(.*\)",/\1/p' <<<"$json")
    [[ -f $zip && -f $mod ]] || die "gitea: could not download $old@$version"
    mkdir -p "$proxy/$path/@v"
    cp "$mod" "$proxy/$path/@v/$version.mod"
    printf '{"Version":"%s"}\n' "$version" >"$proxy/$path/@v/$version.info"
    echo "$version" >>"$proxy/$path/@v/list"
    python3 - "$zip" "$old@$version/" "$path@$version/" "$proxy/$path/@v/$version.zip" <<'PY'
import sys, zipfile
src, old, new, out = sys.argv[1:]
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(out + ".tmp", "w", zipfile.ZIP_DEFLATED) as zout:
    for info in zin.infolist():
        assert info.filename.startswith(old), info.filename
        zout.writestr(new + info.filename[len(old):], zin.read(info))
PY
    mv "$proxy/$path/@v/$version.zip.tmp" "$proxy/$path/@v/$version.zip"
  done
}

build_gitea() {
  local v=${GITEA_VERSION} dir share mod proxy tmp r
  share=$(gitea_share_dir "$v")
  if have gitea "$v" && [[ -f "$share/.complete" ]]; then info "gitea $v: cached"; link gitea "$v"; return; fi
  step "building gitea $v from code.gitea.io/gitea (cold: several minutes on 2 cores)"
  mod=$(cd "${SRC_DIR}" && go mod download -json "code.gitea.io/gitea@$v" | sed -n 's/.*"Dir": "\(.*\)",/\1/p')
  [[ -f "$mod/main.go" ]] || die "gitea $v sources not found in the Go module cache"
  dir="${SRC_DIR}/gitea-$v"
  if [[ ! -f "$dir/.prepared" ]]; then
    rm -rf "$dir" && cp -r "$mod" "$dir" && chmod -R u+w "$dir"
    for r in "${GITEA_VERSION_REPLACES[@]}"; do (cd "$dir" && go mod edit -replace "$r"); done
    touch "$dir/.prepared"
  fi
  proxy="${SRC_DIR}/gitea-goproxy"
  gitea_local_proxy "$dir" "$proxy"
  if ! have gitea "$v"; then
    tmp="${TOOLS_BIN}/.gitea-$v.tmp"
    (cd "$dir" && GOPROXY="file://${proxy},$(go env GOPROXY)" GOFLAGS="${GOFLAGS} -mod=mod" \
      go build "${GO_BUILD_FLAGS[@]}" -ldflags="-s -w -X main.Version=${v#v}" -o "$tmp" .)
    mv "$tmp" "${TOOLS_BIN}/gitea-$v"
  fi
  rm -rf "$share.tmp" && mkdir -p "$share.tmp"
  cp -r "$dir/templates" "$dir/options" "$dir/public" "$share.tmp/"
  touch "$share.tmp/.complete"
  rm -rf "$share" && mv "$share.tmp" "$share"
  link gitea "$v"
}

# module_dir MODULE@VERSION: the module's directory in the Go module cache, downloading it when missing.
module_dir() { (cd "${SRC_DIR}" && go mod download -json "$1" | sed -n 's/.*"Dir": "\(.*\)",/\1/p'); }

# copy_main_module NAME VERSION MODULE: modules whose go.mod has replace directives cannot be built with
# `go install`; the downloaded module is copied to SRC_DIR/NAME-VERSION and built there as the main module,
# with its own go.mod and go.sum (so every dependency is checked against upstream's sums).
# `prepare_NAME DIR`, when defined, completes the copy first.
copy_main_module() {
  local name=$1 v=$2 module=$3 mod dir="${SRC_DIR}/$1-$2"
  [[ -f "$dir/.prepared" ]] && return
  mod=$(module_dir "$module@$v")
  [[ -f "$mod/go.mod" ]] || die "$module@$v not found in the Go module cache"
  rm -rf "$dir" && cp -r "$mod" "$dir" && chmod -R u+w "$dir"
  if declare -F "prepare_${name//-/_}" >/dev/null; then "prepare_${name//-/_}" "$dir"; fi
  touch "$dir/.prepared"
}

# build_main_module NAME VERSION MODULE CMD...: build the copied module's packages under cmd/; each
# binary is stamped with VERSION.
build_main_module() {
  local name=$1 v=$2 module=$3 missing=() c dir out
  shift 3
  for c in "$@"; do have "$c" "$v" || missing+=("$c"); done
  if ((${#missing[@]} == 0)); then info "$* $v: cached"; for c in "$@"; do link "$c" "$v"; done; return; fi
  step "building ${missing[*]} $v from $module"
  copy_main_module "$name" "$v" "$module"
  dir="${SRC_DIR}/$name-$v"
  out=$(mktemp -d)
  # One `go build` for all of them: shared packages are loaded once and the links run side by side.
  (cd "$dir" && go build "${GO_BUILD_FLAGS[@]}" -ldflags="-s -w -X main.version=$v" -o "$out/" \
    "${missing[@]/#/./cmd/}")
  for c in "${missing[@]}"; do
    mv "$out/$c" "${TOOLS_BIN}/$c-$v"
    link "$c" "$v"
  done
  rm -rf "$out"
}

# external-snapshotter replaces its client module with ./client, a nested module that its module zip
# leaves out: the client module of the same release comes from the proxy instead (its go.mod requires the
# same Kubernetes libraries). Its config/crd holds the snapshot CRDs, installed beside the binaries.
prepare_external_snapshotter() {
  local client
  client=$(module_dir "github.com/kubernetes-csi/external-snapshotter/client/v8@${SNAPSHOTTER_CLIENT_VERSION}")
  [[ -f "$client/go.mod" ]] || die "external-snapshotter client ${SNAPSHOTTER_CLIENT_VERSION} not downloaded"
  grep -q '=> ./client$' "$1/go.mod" || die "external-snapshotter no longer replaces its client with ./client"
  rm -rf "$1/client" && cp -r "$client" "$1/client" && chmod -R u+w "$1/client"
}

snapshot_crds_dir() { echo "${SHADOW_CACHE}/share/snapshot-crds-${SNAPSHOTTER_CLIENT_VERSION}"; }

# The VolumeSnapshot, VolumeSnapshotContent and VolumeSnapshotClass CRDs (not the group-snapshot ones:
# the snapshot controller runs without them when told to), for hack/kind/snapshots.
install_snapshot_crds() {
  local dir client
  dir=$(snapshot_crds_dir)
  if [[ -f "$dir/.complete" ]]; then info "snapshot CRDs ${SNAPSHOTTER_CLIENT_VERSION}: cached"; return; fi
  client=$(module_dir "github.com/kubernetes-csi/external-snapshotter/client/v8@${SNAPSHOTTER_CLIENT_VERSION}")
  rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
  cp "$client"/config/crd/snapshot.storage.k8s.io_*.yaml "$dir.tmp/"
  chmod u+w "$dir.tmp"/*.yaml
  touch "$dir.tmp/.complete"
  rm -rf "$dir" && mv "$dir.tmp" "$dir"
}

build_snapshots() {
  build_main_module external-snapshotter "${EXTERNAL_SNAPSHOTTER_VERSION}" \
    github.com/kubernetes-csi/external-snapshotter/v8 snapshot-controller csi-snapshotter
  install_snapshot_crds
  build_main_module external-provisioner "${EXTERNAL_PROVISIONER_VERSION}" \
    github.com/kubernetes-csi/external-provisioner/v5 csi-provisioner
  build_csi_sanity
}

# csi-sanity, the CSI conformance suite, runs against images/csi-hostpath in the integration tests.
build_csi_sanity() { install_module csi-sanity "${CSI_TEST_VERSION}" github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity; }

# ArgoCD (issue 22; not in the default set): one binary, built from cmd/main.go, runs as argocd-server,
# argocd-repo-server, argocd-application-controller, ... by the name it is invoked as (argv[0], or
# $ARGOCD_BINARY_NAME); an image links those names to it. Its go.mod asks for Go >= 1.27, so this build alone
# runs the toolchain pinned as ARGOCD_GO_TOOLCHAIN, which the go command fetches from the module proxy.
# It replaces gitops-engine with ./gitops-engine, a nested module its zip leaves out; the same release is
# served as github.com/argoproj/argo-cd/gitops-engine/v3 and copied in (3.5 and 3.4 name it without /v3,
# and the proxy serves that at no version: why 3.6 and a newer Go rather than a 3.5 the machine's Go builds).
# The web UI (ui/dist/app, built with pnpm) is not built: the zip keeps the placeholder files its go:embed
# needs, and the server answers its API without it (only the HTML pages are missing).
argocd_share_dir() { echo "${SHADOW_CACHE}/share/argocd-${ARGOCD_VERSION}"; }

prepare_argocd() {
  local engine
  grep -q '^replace github.com/argoproj/argo-cd/gitops-engine/v3 => ./gitops-engine$' "$1/go.mod" ||
    die "argo-cd ${ARGOCD_VERSION} no longer replaces gitops-engine/v3 with ./gitops-engine"
  engine=$(module_dir "github.com/argoproj/argo-cd/gitops-engine/v3@${ARGOCD_VERSION}")
  [[ -f "$engine/go.mod" ]] || die "gitops-engine ${ARGOCD_VERSION} not downloaded"
  rm -rf "$1/gitops-engine" && cp -r "$engine" "$1/gitops-engine" && chmod -R u+w "$1/gitops-engine"
  rm -rf "$1/docs" # 190 of its 250 MB (mostly vulnerability reports); nothing in the build reads it
}

# For the e2e, in share/argocd-VERSION: crds/ holds the Application, ApplicationSet and AppProject CRDs
# (for `kubectl apply -f`); manifests/ holds install.yaml, core-install.yaml (no API server, UI or Dex) and
# the kustomize tree they are built from, so a kustomization can swap upstream's images (quay.io/argoproj/
# argocd, redis) for the locally built ones; bin/ holds the two scripts the repo server runs from PATH for
# every revision it renders, GPG enabled or not (upstream's image puts them in /usr/local/bin).
ARGOCD_MANIFESTS=(install.yaml core-install.yaml base crds cluster-rbac cluster-install core-install namespace-install)
ARGOCD_SCRIPTS=(git-verify-wrapper.sh gpg-wrapper.sh)

install_argocd_manifests() {
  local src=$1 share m
  share=$(argocd_share_dir)
  rm -rf "$share.tmp" && mkdir -p "$share.tmp/crds" "$share.tmp/manifests" "$share.tmp/bin"
  cp "$src"/manifests/crds/*-crd.yaml "$share.tmp/crds/"
  for m in "${ARGOCD_MANIFESTS[@]}"; do cp -r "$src/manifests/$m" "$share.tmp/manifests/"; done
  for m in "${ARGOCD_SCRIPTS[@]}"; do install -m 0755 "$src/hack/$m" "$share.tmp/bin/"; done
  touch "$share.tmp/.complete"
  rm -rf "$share" && mv "$share.tmp" "$share"
}

build_argocd() {
  local v=${ARGOCD_VERSION} dir share tmp kubectl_v pkg=github.com/argoproj/argo-cd/v3/common
  local -x GOTOOLCHAIN=${ARGOCD_GO_TOOLCHAIN}
  share=$(argocd_share_dir)
  if have argocd "$v" && [[ -f "$share/.complete" ]]; then info "argocd $v: cached"; link argocd "$v"; return; fi
  step "building argocd $v from github.com/argoproj/argo-cd/v3 with ${GOTOOLCHAIN} (cold: ~5 minutes on 2 cores, 1.4 GB of modules)"
  copy_main_module argocd "$v" github.com/argoproj/argo-cd/v3
  dir="${SRC_DIR}/argocd-$v"
  if ! have argocd "$v"; then
    # Stamped as upstream's Makefile does (the module zip has no commit, so it reports v3.x.y+unknown).
    kubectl_v=$(cd "$dir" && go list -m -f '{{with .Replace}}{{.Version}}{{else}}{{.Version}}{{end}}' k8s.io/client-go)
    tmp="${TOOLS_BIN}/.argocd-$v.tmp"
    (cd "$dir" && go build "${GO_BUILD_FLAGS[@]}" -o "$tmp" \
      -ldflags="-s -w -X $pkg.version=${v#v} -X $pkg.kubectlVersion=${kubectl_v}" ./cmd)
    mv "$tmp" "${TOOLS_BIN}/argocd-$v"
  fi
  install_argocd_manifests "$dir"
  link argocd "$v"
}

# gVisor (issue 28): runsc and its containerd shim from the module's Go branch (gvisor.dev/gvisor, a
# pseudo-version: upstream tags only its Bazel branch). The module is copied and built as the main module (its
# own go.mod and go.sum) with one change, made by prepare_gvisor: the shim's `start` lowers the OOM score of the
# shim it spawns to -999, which needs CAP_SYS_RESOURCE; on machines whose capability bounding set lacks it (this
# one: hack/kind/restricted.yaml) that write is refused and the shim failed to start. A refused write is now let
# pass, as containerd's own shims do where they may not lower it; where it is allowed nothing changes. runsc is
# stamped with the pin (`runsc --version`); the shim is installed under the name containerd looks up for the
# runtime type io.containerd.runsc.v1.
GVISOR_OOM_LINE='if err := sys.SetOOMScore(cmd.Process.Pid, oomScoreMax); err != nil {'
prepare_gvisor() {
  local f="$1/pkg/shim/v1/manager.go"
  grep -qF "$GVISOR_OOM_LINE" "$f" || die "gvisor ${GVISOR_VERSION}: the shim's OOM score line changed ($f)"
  sed -i "s/$(sed 's/[][\\/.*^$]/\\&/g' <<<"$GVISOR_OOM_LINE")/if err := sys.SetOOMScore(cmd.Process.Pid, oomScoreMax); err != nil \&\& !os.IsPermission(err) {/" "$f"
  grep -qF '!os.IsPermission(err) {' "$f" || die "gvisor: patching $f failed"
}

build_gvisor() {
  local v=${GVISOR_VERSION} dir out
  if have runsc "$v" && have containerd-shim-runsc-v1 "$v"; then
    info "runsc, containerd-shim-runsc-v1 $v: cached"
    link runsc "$v"; link containerd-shim-runsc-v1 "$v"
    return
  fi
  step "building runsc and containerd-shim-runsc-v1 $v from gvisor.dev/gvisor (cold: ~4 minutes on 2 cores)"
  copy_main_module gvisor "$v" gvisor.dev/gvisor
  dir="${SRC_DIR}/gvisor-$v"
  out=$(mktemp -d)
  (cd "$dir" && go build "${GO_BUILD_FLAGS[@]}" -ldflags="-s -w -X gvisor.dev/gvisor/runsc/version.version=$v" \
    -o "$out/" ./runsc ./shim)
  mv "$out/runsc" "${TOOLS_BIN}/runsc-$v"
  mv "$out/shim" "${TOOLS_BIN}/containerd-shim-runsc-v1-$v"
  rm -rf "$out"
  link runsc "$v"; link containerd-shim-runsc-v1 "$v"
}

build_group() {
  case $1 in
    control-plane) build_etcd; build_k8s kube-apiserver kube-controller-manager kube-scheduler
                   install_module kwok "${KWOK_VERSION}" sigs.k8s.io/kwok/cmd/kwok ;;
    etcd) build_etcd ;;
    kwok) install_module kwok "${KWOK_VERSION}" sigs.k8s.io/kwok/cmd/kwok ;;
    kind) install_module kind "${KIND_VERSION}" sigs.k8s.io/kind ;;
    helm) install_module helm "${HELM_VERSION}" helm.sh/helm/v3/cmd/helm ;;
    node) build_k8s kubelet kubeadm kubectl kube-proxy ;;
    coredns) build_coredns ;;
    local-path-provisioner)
      install_module local-path-provisioner "${LOCAL_PATH_PROVISIONER_VERSION}" github.com/rancher/local-path-provisioner ;;
    gitea) build_gitea ;;
    snapshots) build_snapshots ;;
    csi-sanity) build_csi_sanity ;;
    snapshot-crds) install_snapshot_crds ;;
    argocd) build_argocd ;;
    gvisor) build_gvisor ;;
    *) die "unknown tool group '$1' (control-plane, etcd, kwok, kind, helm, node, coredns, local-path-provisioner, gitea, snapshots, csi-sanity, snapshot-crds, argocd, gvisor)" ;;
  esac
}

command -v go >/dev/null || die "Go is required (https://go.dev/dl); it builds every pinned tool"
groups=("$@"); ((${#groups[@]})) || groups=(control-plane helm gitea csi-sanity snapshot-crds)
for g in "${groups[@]}"; do
  t0=$SECONDS
  build_group "$g"
  ((SECONDS - t0 < 2)) || info "$g: $((SECONDS - t0))s"
done
step "tools ready in ${TOOLS_BIN}"
