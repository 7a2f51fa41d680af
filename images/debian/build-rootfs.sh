#!/usr/bin/env bash
# Build a minimal Debian root filesystem with debootstrap and stream it, as a tar, to stdout.
# Usage: build-rootfs.sh SUITE MIRROR WORKDIR  (run as root; WORKDIR is removed afterwards)
set -euo pipefail
suite=$1 mirror=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
debootstrap --variant=minbase --include=ca-certificates "$suite" "$work/rootfs" "$mirror" >&2
root="$work/rootfs"
# Containers never start services through invoke-rc.d; keep apt lean and non-interactive.
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d" && chmod 0755 "$root/usr/sbin/policy-rc.d"
cat >"$root/etc/apt/apt.conf.d/90container" <<'APT'
APT::Install-Recommends "false";
APT::Install-Suggests "false";
Acquire::Languages "none";
APT
cat >"$root/etc/dpkg/dpkg.cfg.d/90container" <<'DPKG'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/info/*
DPKG
cat >"$root/etc/apt/sources.list" <<LIST
deb ${mirror} ${suite} main
deb ${mirror} ${suite}-updates main
deb ${mirror%/debian}/debian-security ${suite}-security main
LIST
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
  "$root"/var/log/*.log "$root"/tmp/* "$root"/usr/share/man/* "$root"/usr/share/info/*
: >"$root/etc/machine-id"
tar --numeric-owner --xattrs -C "$root" -c .
