#!/usr/bin/env bash
# Protego development/test setup for Debian 12 (run as root).
#
# Idempotent: installs only the packages that are missing, runs `apt-get update`
# only when apt does not know a missing package (or the first install attempt
# fails), never starts system daemons, and makes sure no system-wide strongSwan
# or etcd daemon runs (the interop tests start their own, one per namespace).
#
# Usage: scripts/setup.sh            (quiet; prints one line when all is in place)
#        VERBOSE=1 scripts/setup.sh  (show apt output)
set -euo pipefail

# Every package the build, the demo and the tests use: the second column of
# scripts/requirements.tsv (one home for the list; the tests name the same packages
# when something is missing).
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mapfile -t PACKAGES < <(awk -F'\t' '!/^#/ && NF >= 2 { print $2 }' "$HERE/requirements.tsv" | sort -u)
[[ ${#PACKAGES[@]} -gt 0 ]] || { printf 'setup: error: no packages in %s\n' "$HERE/requirements.tsv" >&2; exit 1; }
# System units shipped by the packages above that must not run: the tests start
# their own charon (per network namespace) and their own etcd.
UNITS=(strongswan.service strongswan-starter.service ipsec.service etcd.service prometheus.service)

log() { printf 'setup: %s\n' "$*"; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

[[ $(id -u) -eq 0 ]] || die "must run as root (the test bed creates network namespaces)"
command -v dpkg-query >/dev/null 2>&1 || die "dpkg-query not found: this script supports Debian 12 only"

export DEBIAN_FRONTEND=noninteractive

missing_packages() {
    local p status
    for p in "${PACKAGES[@]}"; do
        status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null || true)
        [[ $status == ii* ]] || printf '%s\n' "$p"
    done
}

# Runs a command quietly; on failure shows its output and returns its status.
quiet() {
    if [[ -n ${VERBOSE:-} ]]; then
        "$@"
        return
    fi
    local out rc=0
    out=$(mktemp)
    "$@" >"$out" 2>&1 || rc=$?
    if [[ $rc -ne 0 ]]; then
        printf 'setup: command failed (exit %d): %s\n' "$rc" "$*" >&2
        tail -n 30 "$out" >&2
    fi
    rm -f "$out"
    return "$rc"
}

# A policy-rc.d that forbids starting services, installed only for the duration of
# the apt run (and only if the system has none of its own).
POLICY=/usr/sbin/policy-rc.d
POLICY_OURS=0
restore_policy() {
    if [[ $POLICY_OURS -eq 1 ]]; then
        rm -f "$POLICY"
    fi
}
trap restore_policy EXIT

install_missing() {
    local -a missing=("$@")
    log "installing: ${missing[*]}"
    if [[ ! -e $POLICY ]]; then
        printf '#!/bin/sh\n# installed temporarily by protego scripts/setup.sh\nexit 101\n' >"$POLICY"
        chmod 0755 "$POLICY"
        POLICY_OURS=1
    fi
    # tshark asks whether non-root users may capture; answer "no" up front.
    echo "wireshark-common wireshark-common/install-setuid boolean false" \
        | quiet debconf-set-selections || true

    local need_update=0 p
    if ! compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null; then
        need_update=1
    else
        for p in "${missing[@]}"; do
            if ! apt-cache show "$p" >/dev/null 2>&1; then
                need_update=1
                break
            fi
        done
    fi
    if [[ $need_update -eq 1 ]]; then
        log "apt-get update"
        quiet apt-get update -q || die "apt-get update failed"
    fi
    local -a install=(apt-get install -y -q --no-install-recommends
        -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "${missing[@]}")
    if ! quiet "${install[@]}"; then
        if [[ $need_update -eq 0 ]]; then
            log "install failed with the current package lists; running apt-get update and retrying"
            quiet apt-get update -q || die "apt-get update failed"
            quiet "${install[@]}" || die "apt-get install failed"
        else
            die "apt-get install failed"
        fi
    fi
    restore_policy
    POLICY_OURS=0
}

mapfile -t MISSING < <(missing_packages)
if [[ ${#MISSING[@]} -gt 0 ]]; then
    install_missing "${MISSING[@]}"
    mapfile -t STILL < <(missing_packages)
    [[ ${#STILL[@]} -eq 0 ]] || die "still missing after install: ${STILL[*]}"
fi

# Keep the packaged daemons from running now and at boot.
if command -v systemctl >/dev/null 2>&1 && [[ -d /run/systemd/system ]]; then
    for unit in "${UNITS[@]}"; do
        if systemctl list-unit-files "$unit" >/dev/null 2>&1 \
            && systemctl cat "$unit" >/dev/null 2>&1; then
            if systemctl is-enabled --quiet "$unit" 2>/dev/null \
                || systemctl is-active --quiet "$unit" 2>/dev/null; then
                log "disabling system unit $unit"
                quiet systemctl disable --now "$unit" || die "could not disable $unit"
            fi
        fi
    done
fi

# A charon or etcd in the root network namespace that we did not start would
# fight over ports 500/4500/2379 with tests that use the root namespace; refuse
# rather than kill someone else's daemon.
root_ns=$(readlink /proc/1/ns/net 2>/dev/null || true)
for name in charon charon-systemd etcd; do
    for pid in $(pgrep -x "$name" 2>/dev/null || true); do
        ns=$(readlink "/proc/$pid/ns/net" 2>/dev/null || true)
        if [[ -n $root_ns && $ns == "$root_ns" ]]; then
            die "a system-wide $name (pid $pid) is running in the root network namespace; stop it first (e.g. systemctl stop strongswan etcd)"
        fi
    done
done

# The second strongSwan peer: strongSwan 6 from Debian 13 in a root of its own (the host keeps
# Debian 12's 5.9); nothing happens when it is in place.
bash "$HERE/strongswan6.sh" || die "could not install strongSwan 6 (scripts/strongswan6.sh)"

# Kernel features the test bed needs.
[[ -c /dev/net/tun ]] || die "/dev/net/tun is missing (strongSwan's kernel-libipsec needs TUN)"
if ! ip netns list >/dev/null 2>&1; then
    die "'ip netns' does not work here (network namespaces are required)"
fi

# Rust toolchain.
if ! command -v cargo >/dev/null 2>&1; then
    if [[ -x ${HOME:-/root}/.cargo/bin/cargo ]]; then
        die "cargo is installed in ${HOME:-/root}/.cargo/bin but not on PATH (add it, or run via 'sudo -E env PATH=\$PATH make ...')"
    fi
    die "cargo not found: install Rust (https://rustup.rs), version 1.85 or newer"
fi

# cargo-deb for `make deb` and the package test (crates/protego/tests/package.rs); nothing
# happens when the pinned version is in place.
bash "$HERE/deb.sh" --install-tool || die "could not install cargo-deb (scripts/deb.sh)"

log "ok (packages present, strongSwan 6 root present, no system daemons, cargo $(cargo --version 2>/dev/null | awk '{print $2}'), cargo-deb $(cargo deb --version 2>/dev/null | awk '{print $NF}'))"
