#!/usr/bin/env bash
# Docker and the local image registry, for machines without systemd and without registry access.
# Idempotent: a running dockerd or registry is left alone.
#
#   hack/docker.sh                 # daemon + registry
#   hack/docker.sh daemon          # install Debian's docker.io if missing, start dockerd if not running
#   hack/docker.sh registry        # start Debian's docker-registry (storage under the cache)
#   hack/docker.sh registry-host   # print HOST:PORT of the registry as kind nodes reach it
#   hack/docker.sh stop-registry   # stop the registry (and its loopback forward) this script started
#
# The registry listens on the Docker bridge gateway only, the address kind nodes use. This host pushes to
# 127.0.0.1:PORT, which Docker trusts as an insecure registry without daemon configuration; a socat forward
# bound to loopback carries those connections to the registry. distribution's `http.addr` takes a single
# address, hence the forward. Nothing listens on the wildcard address.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

LOG_DIR="${SHADOW_CACHE}/logs"
REGISTRY_DIR="${SHADOW_CACHE}/registry"
REGISTRY_PORT="${SHADOW_REGISTRY_PORT:-5000}"
mkdir -p "${LOG_DIR}"

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
  # setsid: dockerd outlives this script and the make invocation that started it (detached: and holds none of
  # their files, such as a lock).
  detached as_root setsid nohup dockerd >>"${LOG_DIR}/dockerd.log" 2>&1 </dev/null &
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

# url_up URL: the registry answers its API root there.
url_up() { curl -fsS -m 5 "$1/v2/" >/dev/null 2>&1; }
# registry_up: reachable both where kind nodes pull (bridge gateway) and where this host pushes (loopback).
registry_up() { url_up "http://$(bridge_gateway):${REGISTRY_PORT}" && url_up "http://127.0.0.1:${REGISTRY_PORT}"; }

# ours NAME PIDFILE: the process recorded in PIDFILE is alive and is NAME.
ours() { [[ -f $2 ]] && kill -0 "$(<"$2")" 2>/dev/null && grep -q "$1" "/proc/$(<"$2")/cmdline" 2>/dev/null; }

stop_pid() { # stop_pid NAME PIDFILE: stop that process if it is still NAME; wait for it to exit.
  local pid i
  if ours "$1" "$2"; then
    pid=$(<"$2")
    kill "$pid" 2>/dev/null || true
    for ((i = 0; i < 40; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$2"
}

registry_config() { # registry_config ADDR
  cat <<YAML
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: ${REGISTRY_DIR}/data
  delete:
    enabled: true
http:
  addr: $1
YAML
}

port_listeners() { ss -Hltn "sport = :${REGISTRY_PORT}" 2>/dev/null | awk '{print $4}'; }

ensure_registry() {
  local gw config
  command -v curl >/dev/null || apt_install curl
  command -v ss >/dev/null || apt_install iproute2
  gw=$(bridge_gateway)
  config=$(registry_config "${gw}:${REGISTRY_PORT}")
  # Reuse a registry and forward this script started with the same configuration (same gateway); anything
  # else of ours (older configuration, e.g. a wildcard listener, or a half-dead pair) is restarted.
  if ours docker-registry "${REGISTRY_DIR}/pid" && ours socat "${REGISTRY_DIR}/forward.pid" \
    && [[ -f "${REGISTRY_DIR}/config.yml" && $(<"${REGISTRY_DIR}/config.yml") == "$config" ]] && registry_up; then
    info "registry: serving on ${gw}:${REGISTRY_PORT} (forwarded from 127.0.0.1:${REGISTRY_PORT})"
    return
  fi
  stop_registry
  if [[ -n $(port_listeners) ]]; then
    die "port ${REGISTRY_PORT} is taken by a process this script did not start ($(port_listeners | xargs)); stop it or set SHADOW_REGISTRY_PORT"
  fi
  command -v docker-registry >/dev/null || apt_install docker-registry
  command -v socat >/dev/null || apt_install socat
  mkdir -p "${REGISTRY_DIR}/data"
  echo "$config" >"${REGISTRY_DIR}/config.yml"
  step "starting docker-registry on ${gw}:${REGISTRY_PORT}, forwarded from 127.0.0.1 (log: ${LOG_DIR}/registry.log)"
  # setsid: both outlive this script and the make invocation that started it.
  detached setsid nohup docker-registry serve "${REGISTRY_DIR}/config.yml" >>"${LOG_DIR}/registry.log" 2>&1 </dev/null &
  echo $! >"${REGISTRY_DIR}/pid"
  wait_for 20 registry url_up "http://${gw}:${REGISTRY_PORT}" \
    || die "docker-registry did not start on ${gw}:${REGISTRY_PORT}; see ${LOG_DIR}/registry.log"
  detached setsid nohup socat "TCP-LISTEN:${REGISTRY_PORT},bind=127.0.0.1,reuseaddr,fork,backlog=128" "TCP:${gw}:${REGISTRY_PORT}" \
    >>"${LOG_DIR}/registry-forward.log" 2>&1 </dev/null &
  echo $! >"${REGISTRY_DIR}/forward.pid"
  wait_for 20 forward url_up "http://127.0.0.1:${REGISTRY_PORT}" \
    || die "the loopback forward to the registry did not start; see ${LOG_DIR}/registry-forward.log"
}

stop_registry() {
  stop_pid socat "${REGISTRY_DIR}/forward.pid"
  stop_pid docker-registry "${REGISTRY_DIR}/pid"
}

case "${1:-all}" in
  all) ensure_daemon; ensure_registry ;;
  daemon) ensure_daemon ;;
  registry) ensure_registry ;;
  registry-host) echo "$(bridge_gateway):${REGISTRY_PORT}" ;;
  stop-registry) stop_registry ;;
  *) die "usage: $0 [all|daemon|registry|registry-host|stop-registry]" ;;
esac
