#!/usr/bin/env bash
# Builds Protego's Debian package (`make deb`): the release binary, the systemd units, the
# example configuration, the manual pages and the docs, as listed in crates/protego/Cargo.toml
# ([package.metadata.deb]). Uses cargo-deb, installed here (pinned version, `cargo install
# --locked`) when it is missing or another version.
#
# Usage: scripts/deb.sh [--no-build] [--output DIR] [-- CARGO_DEB_ARGS...]
#        scripts/deb.sh --install-tool     only make sure cargo-deb is installed (setup.sh)
#
#   --no-build    package the binary already in $CARGO_TARGET_DIR/release (default
#                 target/release) instead of building it (the package test puts its own build
#                 there)
#   --output DIR  where the .deb goes (default target/debian); its path is the last line printed
#
# The manual pages are rendered by the binary being packaged (`protego man`) into
# <target>/release/man and gzipped; they are not kept in the repository.
set -euo pipefail

# The cargo-deb release this script and the package metadata were written for.
CARGO_DEB_VERSION=3.8.0

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
CARGO=${CARGO:-cargo}

log() { printf 'deb: %s\n' "$*" >&2; }
die() { printf 'deb: error: %s\n' "$*" >&2; exit 1; }

# Installs cargo-deb $CARGO_DEB_VERSION unless `cargo deb --version` already reports it.
ensure_cargo_deb() {
    local have
    have=$("$CARGO" deb --version 2>/dev/null || true)
    if [[ $have != *"$CARGO_DEB_VERSION"* ]]; then
        log "installing cargo-deb $CARGO_DEB_VERSION (cargo install --locked; a few minutes, once)"
        "$CARGO" install --quiet --locked cargo-deb --version "$CARGO_DEB_VERSION" \
            || die "cargo install cargo-deb $CARGO_DEB_VERSION failed"
        have=$("$CARGO" deb --version 2>/dev/null || true)
        [[ $have == *"$CARGO_DEB_VERSION"* ]] \
            || die "cargo-deb $CARGO_DEB_VERSION installed but \`cargo deb --version\` says: ${have:-nothing} (is ~/.cargo/bin on PATH?)"
    fi
}

BUILD=1
OUTPUT=
EXTRA=()
while [[ $# -gt 0 ]]; do
    case $1 in
        --install-tool)
            ensure_cargo_deb
            exit 0
            ;;
        --no-build) BUILD=0 ;;
        --output)
            [[ $# -ge 2 ]] || die "--output needs a directory"
            OUTPUT=$2
            shift
            ;;
        --)
            shift
            EXTRA=("$@")
            break
            ;;
        *) die "unknown argument: $1 (see the header of $0)" ;;
    esac
    shift
done

cd "$ROOT"
ensure_cargo_deb
command -v dpkg-shlibdeps >/dev/null 2>&1 \
    || die "dpkg-shlibdeps not found: the package's Depends are computed with it (make setup installs dpkg-dev)"

TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
[[ $TARGET_DIR == /* ]] || TARGET_DIR=$ROOT/$TARGET_DIR
OUTPUT=${OUTPUT:-$TARGET_DIR/debian}
[[ $OUTPUT == /* ]] || OUTPUT=$PWD/$OUTPUT

if [[ $BUILD -eq 1 ]]; then
    log "building the release binary"
    "$CARGO" build --release -p protego --bin protego
fi
BIN=$TARGET_DIR/release/protego
[[ -x $BIN ]] || die "$BIN not found (build it, or leave out --no-build)"

MAN=$TARGET_DIR/release/man
rm -rf "$MAN"
# The pages' date: the last commit's (the same sources give the same pages), else today's.
DATE=$(git -C "$ROOT" log -1 --format=%cs 2>/dev/null || true)
DATE=${DATE:-$(date -u +%Y-%m-%d)}
"$BIN" man --out "$MAN" --date "$DATE" >/dev/null || die "$BIN man --out $MAN failed"
gzip -9 -n "$MAN"/*.1
log "$(find "$MAN" -name '*.1.gz' | wc -l) manual pages in $MAN"

mkdir -p "$OUTPUT"
# --strip: the release profile keeps line tables for profiling (Cargo.toml); the package ships
# the binary without them, as Debian does.
"$CARGO" deb -p protego --no-build --strip --output "$OUTPUT" "${EXTRA[@]}"
