#!/usr/bin/env bash
# The second strongSwan the interop tests run against: strongSwan 6 from Debian 13 (trixie),
# installed with debootstrap into its own root (the host keeps Debian 12's strongSwan 5.9).
# The test bed runs its charon-systemd and swanctl chrooted there, inside the test's network
# namespace (crates/testbed/src/strongswan/mod.rs, `Flavor::Strongswan6`).
#
# Idempotent: does nothing when the root holds the packages below; otherwise builds a new root
# beside it and moves it in place only when complete, so an interrupted run leaves no half
# root behind. Called by scripts/setup.sh; run as root.
#
# PROTEGO_STRONGSWAN6_ROOT overrides where the root goes (default below); the test bed reads
# the same variable.
set -euo pipefail

ROOT=${PROTEGO_STRONGSWAN6_ROOT:-/var/lib/protego-test/strongswan6}
SUITE=trixie
MIRROR=${PROTEGO_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# charon-systemd (the daemon), swanctl, the openssl plugin (x25519, AES-GCM, ML-KEM), and the
# extra plugins with kernel-libipsec (userspace ESP: the kernel here has no ESP).
PACKAGES=charon-systemd,strongswan-swanctl,libstrongswan-standard-plugins,libstrongswan-extra-plugins,libcharon-extra-plugins
# What a complete root has (written last).
STAMP=$ROOT/.protego-strongswan6

log() { printf 'setup: strongswan6: %s\n' "$*"; }
die() { printf 'setup: error: strongswan6: %s\n' "$*" >&2; exit 1; }

[[ $(id -u) -eq 0 ]] || die "must run as root (debootstrap)"
if [[ -f $STAMP && $(cat "$STAMP") == "$PACKAGES" && -x $ROOT/usr/sbin/charon-systemd ]]; then
    exit 0
fi
command -v debootstrap >/dev/null 2>&1 || die "debootstrap not found (scripts/setup.sh installs it)"

parent=$(dirname "$ROOT")
mkdir -p "$parent"
# Leftovers of a run that was killed (its trap did not run): debootstrap may have left /proc
# or /sys mounted inside.
for stale in "$parent"/.strongswan6.*; do
    [[ -d $stale ]] || continue
    umount -R "$stale/proc" "$stale/sys" 2>/dev/null || true
    rm -rf --one-file-system "$stale" || die "cannot remove the leftover $stale"
done
new=$(mktemp -d "$parent/.strongswan6.XXXXXX")
out=
cleanup() {
    if [[ -n ${new:-} && -d $new ]]; then
        rm -rf --one-file-system "$new"
    fi
    if [[ -n ${out:-} ]]; then
        rm -f "$out"
    fi
}
trap cleanup EXIT

log "installing strongSwan 6 (Debian $SUITE) into $ROOT (about a minute)"
out=$(mktemp)
if ! debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$new" "$MIRROR" >"$out" 2>&1; then
    tail -n 30 "$out" >&2
    die "debootstrap $SUITE failed"
fi
[[ -x $new/usr/sbin/charon-systemd && -x $new/usr/sbin/swanctl ]] \
    || die "debootstrap finished but charon-systemd or swanctl is missing"
# No daemon of the root ever starts by itself: it is only run by the tests.
rm -f "$new"/etc/systemd/system/multi-user.target.wants/strongswan*.service
printf '%s' "$PACKAGES" >"$new/.protego-strongswan6"
if [[ -e $ROOT ]]; then
    rm -rf --one-file-system "$ROOT"
fi
mv "$new" "$ROOT"
new=
log "ok ($(chroot "$ROOT" dpkg-query -W -f='${Version}' charon-systemd))"
