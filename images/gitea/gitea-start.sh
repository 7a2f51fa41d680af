#!/bin/sh
# Start Gitea configured for shadow-operator: SQLite, no SSH, no mail, offline, nothing external.
# The entrypoint of the gitea image and what tests/support/gitea.py runs on the host.
#
#   GITEA_BIN            gitea binary (default: gitea on PATH)
#   GITEA_DATA           everything Gitea stores: conf/app.ini, data/ (SQLite), repositories/ (default /data)
#   GITEA_STATIC_ROOT    holds Gitea's templates/, options/ and public/ (default /usr/share/gitea)
#   GITEA_HTTP_ADDR      listen address (default 0.0.0.0)
#   GITEA_HTTP_PORT      listen port (default 3000)
#   GITEA_ROOT_URL       public URL (default http://localhost:$GITEA_HTTP_PORT/)
#   GITEA_ADMIN_USERNAME, GITEA_ADMIN_PASSWORD, GITEA_ADMIN_EMAIL (default <username>@shadow.local):
#                        an admin account created once, when no user of that name exists (the password
#                        is passed to `gitea admin user create` and never printed)
#   GITEA__section__KEY  any other app.ini setting (`gitea config edit-ini --apply-env`)
#
# app.ini is written on the first start, with generated secrets. Every start re-applies the settings
# above (address, port, URL, run user), so a data directory survives restarts and new ports.
set -eu

GITEA_BIN=${GITEA_BIN:-gitea}
GITEA_DATA=${GITEA_DATA:-/data}
GITEA_STATIC_ROOT=${GITEA_STATIC_ROOT:-/usr/share/gitea}
GITEA_HTTP_ADDR=${GITEA_HTTP_ADDR:-0.0.0.0}
GITEA_HTTP_PORT=${GITEA_HTTP_PORT:-3000}
GITEA_ROOT_URL=${GITEA_ROOT_URL:-http://localhost:${GITEA_HTTP_PORT}/}
GITEA_ADMIN_USERNAME=${GITEA_ADMIN_USERNAME:-}
GITEA_ADMIN_PASSWORD=${GITEA_ADMIN_PASSWORD:-}
GITEA_ADMIN_EMAIL=${GITEA_ADMIN_EMAIL:-${GITEA_ADMIN_USERNAME}@shadow.local}
CONF="${GITEA_DATA}/conf/app.ini"

log() { printf 'gitea-start: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

command -v "${GITEA_BIN}" >/dev/null 2>&1 || die "gitea binary '${GITEA_BIN}' not found"
[ -d "${GITEA_STATIC_ROOT}/templates" ] || die "${GITEA_STATIC_ROOT}/templates not found (GITEA_STATIC_ROOT)"
if [ -n "${GITEA_ADMIN_USERNAME}" ] && [ -z "${GITEA_ADMIN_PASSWORD}" ]; then
  die "GITEA_ADMIN_PASSWORD is required with GITEA_ADMIN_USERNAME"
fi

# Gitea refuses to run as root unless told; RUN_USER must name the current user. A UID without a passwd
# entry (OpenShift-style random UIDs) is named through $USER, which Gitea falls back to.
if [ "$(id -u)" = 0 ]; then
  RUN_AS_ROOT=true
  export GITEA_I_AM_BEING_UNSAFE_RUNNING_AS_ROOT=true
else
  RUN_AS_ROOT=false
fi
if RUN_USER=$(id -un 2>/dev/null); then :; else
  RUN_USER="uid-$(id -u)"
fi
export USER="${RUN_USER}"
# git (run by Gitea) needs a HOME; Gitea points it at its own data/home for repository operations.
export HOME="${HOME:-${GITEA_DATA}}"
[ -w "${HOME}" ] || export HOME="${GITEA_DATA}"

mkdir -p "${GITEA_DATA}/conf" "${GITEA_DATA}/data" "${GITEA_DATA}/repositories"

gitea_cmd() { "${GITEA_BIN}" --config "${CONF}" --work-path "${GITEA_DATA}" "$@"; }

if [ ! -f "${CONF}" ]; then
  log "writing ${CONF}"
  secret_key=$("${GITEA_BIN}" generate secret SECRET_KEY)
  internal_token=$("${GITEA_BIN}" generate secret INTERNAL_TOKEN)
  jwt_secret=$("${GITEA_BIN}" generate secret JWT_SECRET)
  : >"${CONF}.tmp" && chmod 600 "${CONF}.tmp"
  cat >>"${CONF}.tmp" <<EOF
APP_NAME = Gitea (shadow-operator)
RUN_MODE = prod
RUN_USER = ${RUN_USER}
WORK_PATH = ${GITEA_DATA}

[server]
PROTOCOL = http
HTTP_ADDR = ${GITEA_HTTP_ADDR}
HTTP_PORT = ${GITEA_HTTP_PORT}
ROOT_URL = ${GITEA_ROOT_URL}
APP_DATA_PATH = ${GITEA_DATA}/data
STATIC_ROOT_PATH = ${GITEA_STATIC_ROOT}
DISABLE_SSH = true
START_SSH_SERVER = false
OFFLINE_MODE = true
LFS_START_SERVER = false

[database]
DB_TYPE = sqlite3
PATH = ${GITEA_DATA}/data/gitea.db
SQLITE_JOURNAL_MODE = WAL

[repository]
ROOT = ${GITEA_DATA}/repositories
DEFAULT_BRANCH = main
DISABLE_MIGRATIONS = true

[security]
INSTALL_LOCK = true
SECRET_KEY = ${secret_key}
INTERNAL_TOKEN = ${internal_token}
PASSWORD_COMPLEXITY = off
PASSWORD_CHECK_PWN = false

[oauth2]
JWT_SECRET = ${jwt_secret}

[service]
DISABLE_REGISTRATION = true
REQUIRE_SIGNIN_VIEW = false
ENABLE_NOTIFY_MAIL = false

[mailer]
ENABLED = false

[cache]
ADAPTER = memory

[session]
PROVIDER = memory

[queue]
TYPE = channel

[indexer]
ISSUE_INDEXER_TYPE = db
REPO_INDEXER_ENABLED = false

[log]
MODE = console
LEVEL = Warn

[migrations]
ALLOW_LOCALNETWORKS = false

[cron.update_checker]
ENABLED = false
EOF
  mv "${CONF}.tmp" "${CONF}"
fi

# Re-apply what the environment decides on every start (a restart may come with a new port or user), and
# what keeps Gitea from calling out (a data directory written by an older version gets it too): Gitea only
# serves, it never fetches (no migrations, no pull mirrors, no local-network addresses, no webhooks).
# Only these variables go to edit-ini; other GITEA__* variables from the caller pass through as well.
GITEA____RUN_USER="${RUN_USER}" \
  GITEA__repository__DISABLE_MIGRATIONS=true \
  GITEA__migrations__ALLOW_LOCALNETWORKS=false \
  GITEA__mirror__ENABLED=false \
  GITEA__security__DISABLE_WEBHOOKS=true \
  GITEA____WORK_PATH="${GITEA_DATA}" \
  GITEA____I_AM_BEING_UNSAFE_RUNNING_AS_ROOT="${RUN_AS_ROOT}" \
  GITEA__server__HTTP_ADDR="${GITEA_HTTP_ADDR}" \
  GITEA__server__HTTP_PORT="${GITEA_HTTP_PORT}" \
  GITEA__server__ROOT_URL="${GITEA_ROOT_URL}" \
  GITEA__server__STATIC_ROOT_PATH="${GITEA_STATIC_ROOT}" \
  gitea_cmd config edit-ini --apply-env --in-place

gitea_cmd migrate >/dev/null

if [ -n "${GITEA_ADMIN_USERNAME}" ]; then
  # Any existing account of that name counts: its password and admin flag are left as they are.
  if gitea_cmd admin user list | awk -v u="${GITEA_ADMIN_USERNAME}" 'NR > 1 && $2 == u {found = 1} END {exit !found}'; then
    log "admin user '${GITEA_ADMIN_USERNAME}' exists"
  else
    log "creating admin user '${GITEA_ADMIN_USERNAME}'"
    gitea_cmd admin user create --admin --username "${GITEA_ADMIN_USERNAME}" --password "${GITEA_ADMIN_PASSWORD}" \
      --email "${GITEA_ADMIN_EMAIL}" --must-change-password=false >/dev/null
  fi
fi

log "starting gitea web on ${GITEA_HTTP_ADDR}:${GITEA_HTTP_PORT} (${GITEA_ROOT_URL})"
exec "${GITEA_BIN}" --config "${CONF}" --work-path "${GITEA_DATA}" web
