#!/usr/bin/env bash
# A release: every image the chart runs, the chart as an OCI artifact, wheels and sdists of each Python
# distribution, and SHA256SUMS of it all in dist/release-VERSION/.
#
#   hack/release.sh VERSION REGISTRY [options]          # everything (what `make release` runs)
#   hack/release.sh chart VERSION REGISTRY [options]    # only package (and push) the chart
#   hack/release.sh set-version VERSION                 # write VERSION into the sources (the release commit)
#
#   VERSION   semver without a leading v: 1.2.0, 1.3.0-rc.1
#   REGISTRY  where images and the chart go, with any path: ghcr.io/my-org, registry.internal:5000/platform
#             Images: REGISTRY/{operator,workspace,preview-router,gitea,egress-gateway}:VERSION
#             Chart:  oci://REGISTRY/charts/shadow-operator, version VERSION, whose image defaults are those
#
# Options:
#   --out DIR       where artifacts go (default dist/release-VERSION)
#   --skip-images   no image build, tag or push
#   --skip-push     build and package only; push nothing (a dry run of everything else)
#   --no-build      release the app images hack/images.sh has already built for these sources; fail if
#                   one is missing instead of building it
#   --skip-python   no wheels or sdists (images and chart only, e.g. for the kind cluster's install)
#   --push-to ADDR  push images and chart to ADDR (host[:port][/path]) instead of REGISTRY: the same registry
#                   under the address this machine reaches it by, e.g. kind's local registry, which nodes
#                   pull from at the Docker bridge gateway and this host pushes to at 127.0.0.1:5000
#   --plain-http    talk HTTP to the registry pushed to (automatic for localhost and 127.0.0.0/8)
#
# Log in first where the registry needs it (`docker login`, `helm registry login`). Images are the ones
# hack/images.sh builds, cached by content: a tag is added to the image built from exactly these sources.
# Python distributions are built with `python -m build` (PyPI reachable for the build backend); publishing
# them is the CI workflow's job (.github/workflows/release.yml, PyPI trusted publishing).
set -euo pipefail
source "$(dirname "$0")/lib.sh"

CHART_SRC="${REPO_ROOT}/charts/shadow-operator"
# App images hack/images.sh builds -> the chart's values.yaml image blocks that run them.
IMAGES=(operator workspace preview-router gitea egress-gateway)
# Python distributions: directories holding a pyproject.toml, relative to the repository.
PY_DISTS=(. sandbox-runtime)
# Files that carry the version in the sources (set-version writes them, a release checks them).
VERSION_FILES=(pyproject.toml sandbox-runtime/pyproject.toml operator/shadow_operator/__init__.py
  sandbox-runtime/sandbox_runtime/__init__.py charts/shadow-operator/Chart.yaml)
SEMVER='^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?$'
# host[:port] followed by lowercase path components, as OCI references allow.
REGISTRY_RE='^[A-Za-z0-9.-]+(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*$'

usage() { sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

helm_bin() {
  local helm="${TOOLS_BIN}/helm-${HELM_VERSION}"
  [[ -x $helm ]] || "${HACK_DIR}/build-tools.sh" helm >&2
  echo "$helm"
}

python_bin() {
  local py="${REPO_ROOT}/.venv/bin/python"
  [[ -x $py ]] || py=python3
  echo "$py"
}

# pep440 VERSION: the Python spelling of a semver version (1.3.0-rc.1 -> 1.3.0rc1).
pep440() { "$(python_bin)" -c 'import sys; from packaging.version import Version; print(Version(sys.argv[1]))' "$1"; }

# ------------------------------------------------------------------------------------------- versions
set_version() {
  local v=$1 py
  py=$(pep440 "$v")
  cd "${REPO_ROOT}"
  sed -i -E "0,/^version = \".*\"$/s//version = \"${py}\"/" pyproject.toml sandbox-runtime/pyproject.toml
  sed -i -E "s/^__version__ = \".*\"$/__version__ = \"${py}\"/" \
    operator/shadow_operator/__init__.py sandbox-runtime/sandbox_runtime/__init__.py
  sed -i -E "s/^version: .*/version: ${v}/; s/^appVersion: .*/appVersion: \"${v}\"/" charts/shadow-operator/Chart.yaml
  check_source_version "$v"
  info "version ${v} written to ${VERSION_FILES[*]}"
}

# check_source_version VERSION: images and Python distributions are built from the sources as they are, so
# what they report (shadow-operator --version, package metadata) must already say VERSION.
check_source_version() {
  local v=$1 py found f
  py=$(pep440 "$v")
  for f in "${VERSION_FILES[@]}"; do
    case $f in
      *.toml) found=$(sed -n -E '0,/^version = "(.*)"$/s//\1/p' "${REPO_ROOT}/$f") ;;
      *.py) found=$(sed -n -E 's/^__version__ = "(.*)"$/\1/p' "${REPO_ROOT}/$f") ;;
      *) found=$(sed -n -E 's/^appVersion: "?([^"]*)"?$/\1/p' "${REPO_ROOT}/$f") ;;
    esac
    [[ $found == "$py" || $found == "$v" ]] \
      || die "$f says version '${found}', not ${v}: run \`hack/release.sh set-version ${v}\` and commit it first"
  done
}

# ----------------------------------------------------------------------------------------------- images
release_images() {
  local refs line name ref target digest
  if ((NO_BUILD == 0)); then "${HACK_DIR}/images.sh" apps; fi
  refs=$("${HACK_DIR}/images.sh" app-refs)
  : >"${OUT}/images.txt"
  for name in "${IMAGES[@]}"; do
    line=$(grep "^${name}=" <<<"$refs") || die "hack/images.sh app-refs names no ${name} image"
    ref=${line#*=}
    docker image inspect "$ref" >/dev/null 2>&1 \
      || die "${ref} is not built for these sources: run hack/images.sh apps (or drop --no-build)"
    target="${PUSH_REGISTRY}/${name}:${VERSION}"
    docker tag "$ref" "$target"
    if ((SKIP_PUSH)); then
      echo "${REGISTRY}/${name}:${VERSION}" >>"${OUT}/images.txt"
      continue
    fi
    step "pushing ${target}"
    digest=$(docker push "$target" | sed -n -E 's/.*digest: (sha256:[0-9a-f]{64}).*/\1/p' | tail -n1)
    [[ -n $digest ]] || die "docker push ${target} reported no digest"
    echo "${REGISTRY}/${name}:${VERSION}@${digest}" >>"${OUT}/images.txt"
  done
}

# ------------------------------------------------------------------------------------------------ chart
# stage_chart DIR: a copy of the chart whose version, appVersion and image defaults are the release's.
stage_chart() {
  local dir=$1 host path n digest
  host=${REGISTRY%%/*}
  path=${REGISTRY#"$host"}
  path=${path#/}
  [[ -n $path ]] && path="${path}/"
  rm -rf "$dir" && mkdir -p "$dir" && cp -a "${CHART_SRC}/." "$dir/"
  sed -i -E "s/^version: .*/version: ${VERSION}/; s/^appVersion: .*/appVersion: \"${VERSION}\"/" "$dir/Chart.yaml"
  # values.yaml keeps its comments: only the image blocks' registry and repository lines change, and each
  # must change exactly once per image (a reworded values.yaml fails here, not in a user's cluster).
  n=$(grep -cE '^ +registry: ghcr\.io$' "$dir/values.yaml" || true)
  ((n == ${#IMAGES[@]})) || die "values.yaml has ${n} 'registry: ghcr.io' image defaults, expected ${#IMAGES[@]}"
  sed -i -E "s|^( +)registry: ghcr\.io$|\1registry: ${host}|" "$dir/values.yaml"
  for name in "${IMAGES[@]}"; do
    n=$(grep -cE "^ +repository: shadow-operator/${name}$" "$dir/values.yaml" || true)
    ((n == 1)) || die "values.yaml has ${n} image defaults for shadow-operator/${name}, expected 1"
    sed -i -E "s|^( +)repository: shadow-operator/${name}$|\1repository: ${path}${name}|" "$dir/values.yaml"
    # Pushed images are pinned by digest: a node never runs a stale image cached under the same tag, and
    # what a release installs cannot change after it is published.
    digest=$(sed -n -E "s|^${REGISTRY}/${name}:${VERSION}@(sha256:[0-9a-f]{64})$|\1|p" "${OUT}/images.txt" 2>/dev/null || true)
    if [[ -n $digest ]]; then
      # The block's `digest: ""` is the first one after its repository line.
      sed -i -E "\|^ +repository: ${path}${name}$|,/^ +digest: \"\"$/ s|^( +)digest: \"\"$|\1digest: \"${digest}\"|" "$dir/values.yaml"
      grep -qF "digest: \"${digest}\"" "$dir/values.yaml" || die "could not pin ${name} to ${digest} in values.yaml"
    fi
  done
}

# verify_chart TGZ: the packaged chart renders every image as REGISTRY/NAME:VERSION and nothing else.
verify_chart() {
  local rendered expected
  rendered=$("$HELM" template release "$1" --set previewRouter.enabled=true --set egressGateway.enabled=true \
    | awk '/name: SHADOW_GITEA_IMAGE$/ { getline; sub(/^ *value: /, ""); print; next }
           /^ *(- )?image: / { sub(/^ *(- )?image: /, ""); print }' | tr -d '"' | sort -u)
  expected=$(for name in "${IMAGES[@]}"; do
    # REGISTRY/NAME@DIGEST when the images were pushed (pinned), REGISTRY/NAME:VERSION otherwise.
    sed -n -E "s|^${REGISTRY}/${name}:${VERSION}@(sha256:[0-9a-f]{64})$|${REGISTRY}/${name}@\1|p" "${OUT}/images.txt" 2>/dev/null \
      | grep . || echo "${REGISTRY}/${name}:${VERSION}"
  done | sort -u)
  [[ $rendered == "$expected" ]] || die "the packaged chart renders the images
${rendered}
instead of
${expected}"
}

release_chart() {
  local staged="${OUT}/.chart/shadow-operator" tgz
  step "packaging the chart ${VERSION} (images from ${REGISTRY})"
  stage_chart "$staged"
  "$HELM" lint "$staged" >/dev/null
  "$HELM" package "$staged" --destination "${OUT}" >/dev/null
  rm -rf "${OUT}/.chart"
  tgz="${OUT}/shadow-operator-${VERSION}.tgz"
  [[ -f $tgz ]] || die "helm package wrote no ${tgz}"
  verify_chart "$tgz"
  if ((SKIP_PUSH)); then return; fi
  step "pushing the chart to oci://${PUSH_REGISTRY}/charts"
  local pushed digest
  pushed=$("$HELM" push "$tgz" "oci://${PUSH_REGISTRY}/charts" "${PLAIN_HTTP_ARGS[@]}" 2>&1) \
    || die "helm push failed: ${pushed}"
  info "${pushed//$'\n'/ }"
  digest=$(sed -n -E 's/^Digest: (sha256:[0-9a-f]{64})$/\1/p' <<<"$pushed")
  [[ -n $digest ]] || die "helm push reported no digest: ${pushed}"
  echo "oci://${PUSH_REGISTRY}/charts/shadow-operator:${VERSION}@${digest}" >"${OUT}/chart.txt"
}

# ----------------------------------------------------------------------------------------------- python
# Built from a copy of the tracked (and new, unignored) files, so nothing local (.venv, build/, egg-info)
# ends up in an sdist.
release_python() {
  local py dist src="${OUT}/.src"
  py=$(python_bin)
  "$py" -c 'import build' 2>/dev/null || die "python -m build is missing: make dev (it is a dev dependency)"
  rm -rf "$src" && mkdir -p "$src"
  (cd "${REPO_ROOT}" && git ls-files -z --cached --others --exclude-standard \
    | tar --null --ignore-failed-read -T - -cf - 2>/dev/null) | tar -xf - -C "$src"
  for dist in "${PY_DISTS[@]}"; do
    step "building the Python distribution in ${dist}"
    "$py" -m build --sdist --wheel --outdir "${OUT}" "${src}/${dist}" >"${SHADOW_CACHE}/logs/release-build.log" 2>&1 \
      || { tail -n 20 "${SHADOW_CACHE}/logs/release-build.log" >&2; die "python -m build ${dist} failed"; }
  done
  rm -rf "$src"
}

checksums() {
  (cd "${OUT}" && find . -maxdepth 1 -type f ! -name SHA256SUMS -printf '%f\n' | sort | xargs sha256sum >SHA256SUMS)
  step "release ${VERSION}: ${OUT}"
  sed 's/^/    /' "${OUT}/SHA256SUMS" >&2
}

# ------------------------------------------------------------------------------------------------- main
MODE=all
case "${1:-}" in
  chart) MODE=chart; shift ;;
  set-version)
    [[ ${2:-} =~ $SEMVER ]] || die "set-version needs a semver VERSION (e.g. 1.2.0), got '${2:-}'"
    set_version "$2"
    exit ;;
  -h | --help | "") usage ;;
esac
VERSION=${1:-} REGISTRY=${2:-}
shift 2 || usage
OUT="" SKIP_IMAGES=0 SKIP_PUSH=0 SKIP_PYTHON=0 NO_BUILD=0 PLAIN_HTTP=0 PUSH_REGISTRY=""
while (($#)); do
  case $1 in
    --out) OUT=$2; shift ;;
    --skip-images) SKIP_IMAGES=1 ;;
    --skip-push) SKIP_PUSH=1 ;;
    --skip-python) SKIP_PYTHON=1 ;;
    --no-build) NO_BUILD=1 ;;
    --plain-http) PLAIN_HTTP=1 ;;
    --push-to) PUSH_REGISTRY=$2; shift ;;
    *) die "unknown option '$1' (see hack/release.sh --help)" ;;
  esac
  shift
done
VERSION=${VERSION#v}
[[ $VERSION =~ $SEMVER ]] || die "VERSION must be semver without build metadata (1.2.0, 1.3.0-rc.1), got '${VERSION}'"
REGISTRY=${REGISTRY%/}
[[ $REGISTRY =~ $REGISTRY_RE ]] \
  || die "REGISTRY must be host[:port][/path] in lowercase (e.g. ghcr.io/my-org), got '${REGISTRY}'"
PUSH_REGISTRY=${PUSH_REGISTRY:-$REGISTRY}
PUSH_REGISTRY=${PUSH_REGISTRY%/}
[[ $PUSH_REGISTRY =~ $REGISTRY_RE ]] || die "--push-to must be host[:port][/path] in lowercase, got '${PUSH_REGISTRY}'"
case ${PUSH_REGISTRY%%/*} in
  localhost | localhost:* | 127.* | \[::1\]*) PLAIN_HTTP=1 ;;
esac
PLAIN_HTTP_ARGS=()
((PLAIN_HTTP)) && PLAIN_HTTP_ARGS=(--plain-http)
OUT=${OUT:-${REPO_ROOT}/dist/release-${VERSION}}
mkdir -p "${OUT}" "${SHADOW_CACHE}/logs"
OUT=$(cd "${OUT}" && pwd)
HELM=$(helm_bin)

if [[ $MODE == chart ]]; then
  release_chart
  exit
fi
check_source_version "${VERSION}"
rm -f "${OUT}"/*
((SKIP_IMAGES)) || release_images
release_chart
((SKIP_PYTHON)) || release_python
checksums
