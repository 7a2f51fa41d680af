# Shared helpers for hack/*.sh: cache locations, pinned versions, progress output.
# shellcheck shell=bash
HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${HACK_DIR}/.." && pwd)"
# shellcheck source=versions.env
source "${HACK_DIR}/versions.env"
SHADOW_CACHE="${SHADOW_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/shadow-operator}"
TOOLS_BIN="${SHADOW_CACHE}/bin"
mkdir -p "${TOOLS_BIN}"
# The kind cluster's install (make demo, make e2e): a release of any name in a namespace of any name, as a
# user installs one; nothing in the chart, CLI or tests may assume `shadow-operator` in `shadow-system`.
export SHADOW_RELEASE="${SHADOW_RELEASE:-sandboxes}"
export SHADOW_RELEASE_NAMESPACE="${SHADOW_RELEASE_NAMESPACE:-sandbox-platform}"
# The chart's name for its objects (templates/_helpers.tpl "shadow-operator.fullname").
shadow_fullname() { if [[ $1 == *shadow-operator* ]]; then echo "$1"; else echo "$1-shadow-operator"; fi; }

step() { printf '\033[1;34m==>\033[0m %s\n' "$*" >&2; }
info() { printf '    %s\n' "$*" >&2; }
die() { printf '\033[1;31merror:\033[0m %s\n' "$*" >&2; exit 1; }

as_root() { if ((EUID == 0)); then "$@"; else sudo "$@"; fi; }
# detached [as_root] COMMAND...: become COMMAND (run in the background: `detached … &`, so $! is its pid) with no
# file descriptor of the caller's but 0-2. A daemon otherwise keeps what it inherits open for its whole life: a
# dockerd started under `flock LOCK make e2e` held LOCK until it stopped.
detached() {
  local fd
  for fd in /proc/"$BASHPID"/fd/*; do
    fd=${fd##*/}
    if ((fd > 2)); then eval "exec ${fd}>&-"; fi
  done 2>/dev/null
  if [[ $1 == as_root ]]; then
    shift
    if ((EUID != 0)); then set -- sudo "$@"; fi
  fi
  exec "$@"
}

# apt_install PACKAGE...: install Debian packages, refreshing the package lists once if the install fails
# (a clean machine may have none). Output goes to the cache's logs/apt.log.
apt_install() {
  local log="${SHADOW_CACHE}/logs/apt.log"
  mkdir -p "${SHADOW_CACHE}/logs"
  step "installing Debian packages: $*"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" >"$log" 2>&1 || {
    as_root apt-get update >>"$log" 2>&1
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" >>"$log" 2>&1
  } || die "apt-get install $* failed; see $log"
}

# Named, timed steps for long scripts (`make demo`, `make e2e`): a failure names the step that failed and
# where the logs are. `steps_begin "make demo"` once, then `run_step NAME COMMAND...`; `steps_end` clears
# the current step. With STEPS_RECORD set to a file, each finished step appends "NAME=SECONDS" to it.
CURRENT_STEP=
steps_begin() {
  STEPS_TITLE=$1
  mkdir -p "${SHADOW_CACHE}/logs"
  trap _step_failed ERR
}
_step_failed() {
  [[ -n $CURRENT_STEP && $BASH_SUBSHELL -eq 0 ]] || return 0
  printf '\033[1;31merror:\033[0m %s failed during: %s\n       logs: %s/logs; rerun %s: finished steps are cached\n' \
    "$STEPS_TITLE" "$CURRENT_STEP" "$SHADOW_CACHE" "$STEPS_TITLE" >&2
  CURRENT_STEP=
}
run_step() {
  local t0=$SECONDS
  CURRENT_STEP=$1
  shift
  step "$CURRENT_STEP"
  "$@"
  info "done in $((SECONDS - t0))s"
  if [[ -n ${STEPS_RECORD:-} ]]; then echo "$CURRENT_STEP=$((SECONDS - t0))" >>"$STEPS_RECORD"; fi
}
steps_end() { CURRENT_STEP=; }

# argocd_inputs_hash: a hash of what `make e2e-argocd` tests beyond `make e2e` (the chart, its ArgoCD health
# checks, hack/kind/argocd.sh, the ArgoCD images, tests/e2e_argocd, the ArgoCD pins). hack/kind/argocd.sh writes
# it to .ci/argocd-passed when the tier passes; .ci/run skips the tier on a cold machine while they are equal.
argocd_inputs_hash() {
  (
    cd "${REPO_ROOT}"
    find charts/shadow-operator hack/kind/argocd.sh images/argocd images/argocd-redis tests/e2e_argocd -type f \
      ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
    grep '^ARGOCD_' "${HACK_DIR}/versions.env"
  ) | sha256sum | cut -c1-16
}
