# Shared helpers for hack/*.sh: cache locations, pinned versions, progress output.
# shellcheck shell=bash
HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${HACK_DIR}/.." && pwd)"
# shellcheck source=versions.env
source "${HACK_DIR}/versions.env"
SHADOW_CACHE="${SHADOW_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/shadow-operator}"
TOOLS_BIN="${SHADOW_CACHE}/bin"
mkdir -p "${TOOLS_BIN}"

step() { printf '\033[1;34m==>\033[0m %s\n' "$*" >&2; }
info() { printf '    %s\n' "$*" >&2; }
die() { printf '\033[1;31merror:\033[0m %s\n' "$*" >&2; exit 1; }
