#!/usr/bin/env bash
# Docker and the local image registry, for machines without systemd and without registry access.
# Idempotent: a running dockerd or registry is left alone.
#
#   hack/docker.sh                 # daemon + registry
#   hack/docker.sh daemon          # install Debian's docker.io if missing, start dockerd if not running
#   hack/docker.sh registry        # start Debian's docker-registry (storage under the cache)
#   hack/docker.sh registry-host   # print HOST:PORT of the registry as kind nodes reach it
#   hack/docker.sh stop-registry   # stop the registry this script started
set -euo pipefail
source "$(dirname "$0")/lib.sh"

LOG_DIR="${SHADOW_CACHE}/logs"
REGISTRY_DIR="${SHADOW_CACHE}/registry"
REGISTRY_PORT="${SHADOW_REGISTRY_PORT:-5000}"
# Listening on every address lets `docker push 127.0.0.1:PORT/...` work without an insecure-registries
# entry in the daemon (Docker trusts loopback) while kind nodes reach the same process through the
# bridge gateway. Set SHADOW_REGISTRY_LISTEN to narrow it.
REGISTRY_LISTEN="${SHADOW_REGISTRY_LISTEN:-0.0.0.0:${REGISTRY_PORT}}"
mkdir -p "${LOG_DIR}"

as_root() { if ((EUID == 0)); then "$@"; else sudo "$@"; fi; }

apt_install() {
  step "installing Debian packages: $*"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" \
    >"${LOG_DIR}/apt.log" 2>&1 || {
    as_root apt-get update >>"${LOG_DIR}/apt.log" 2>&1
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" \
      >>"${LOG_DIR}/apt.log" 2>&1
  } || die "apt-get install $* failed; see ${LOG_DIR}/apt.log"
}

wait_for() { # wait_for SECONDS DESCRIPTION COMMAND...
  local seconds=$1 what=$2 i
  shift 2
  for ((i = 0; i < seconds * 4; i++)); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.25
  done
  return 1
}

ensure_daemon() {
  if docker info >/dev/null 2>&1; then info "dockerd: running"; return; fi
  command -v dockerd >/dev/null || apt_install docker.io
  command -v docker >/dev/null || apt_install docker.io
  # Another dockerd may own the socket but be unhealthy; starting a second one would fail obscurely.
  if [[ -S /var/run/docker.sock ]] && pgrep -x dockerd >/dev/null; then
    wait_for 30 dockerd docker info || die "dockerd is running but not answering; see ${LOG_DIR}/dockerd.log"
    return
  fi
  step "starting dockerd (log: ${LOG_DIR}/dockerd.log)"
  # setsid: dockerd outlives this script and the make invocation that started it.
  as_root setsid nohup dockerd >>"${LOG_DIR}/dockerd.log" 2>&1 </dev/null &
  wait_for 60 dockerd docker info || die "dockerd did not start within 60s; see ${LOG_DIR}/dockerd.log"
  info "dockerd: started"
}

# The gateway of Docker's default bridge: a host address every container (kind nodes included) can reach.
bridge_gateway() {
  local gw
  gw=$(docker network inspect bridge --format '{{range .IPAM.Config}}{{.Gateway}}{{end}}' 2>/dev/null || true)
  [[ -n $gw ]] || gw=$(ip -4 -o addr show docker0 2>/dev/null | awk '{split($4, a, "/"); print a[1]}')
  [[ -n $gw ]] || die "cannot find the docker bridge gateway (is dockerd running?)"
  echo "$gw"
}

registry_up() { curl -fsS "http://127.0.0.1:${REGISTRY_PORT}/v2/" >/dev/null 2>&1; }

ensure_registry() {
  if registry_up; then info "registry: serving on port ${REGISTRY_PORT}"; return; fi
  command -v docker-registry >/dev/null || apt_install docker-registry
  mkdir -p "${REGISTRY_DIR}/data"
  cat >"${REGISTRY_DIR}/config.yml" <<YAML
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: ${REGISTRY_DIR}/data
  delete:
    enabled: true
http:
  addr: ${REGISTRY_LISTEN}
YAML
  step "starting docker-registry on ${REGISTRY_LISTEN} (log: ${LOG_DIR}/registry.log)"
  setsid nohup docker-registry serve "${REGISTRY_DIR}/config.yml" >>"${LOG_DIR}/registry.log" 2>&1 </dev/null &
  echo $! >"${REGISTRY_DIR}/pid"
  wait_for 20 registry registry_up || die "docker-registry did not start; see ${LOG_DIR}/registry.log"
}

stop_registry() {
  local pid
  [[ -f "${REGISTRY_DIR}/pid" ]] || return 0
  pid=$(<"${REGISTRY_DIR}/pid")
  if kill -0 "$pid" 2>/dev/null && grep -q docker-registry "/proc/$pid/cmdline" 2>/dev/null; then
    kill "$pid"
  fi
  rm -f "${REGISTRY_DIR}/pid"
}

case "${1:-all}" in
  all) ensure_daemon; ensure_registry ;;
  daemon) ensure_daemon ;;
  registry) ensure_registry ;;
  registry-host) echo "$(bridge_gateway):${REGISTRY_PORT}" ;;
  stop-registry) stop_registry ;;
  *) die "usage: $0 [all|daemon|registry|registry-host|stop-registry]" ;;
esac
