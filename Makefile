# Protego developer entry points. Run as root: `make test` and `make demo` build
# network namespaces, veth pairs, VXLAN devices and strongSwan peers.
#
#   make setup   install/check system packages (Debian 12) and cargo
#   make build   debug build of the whole workspace (all binaries)
#   make test    setup + build + preflight (what the tests will find) + cargo test --workspace
#                (unit + interop tests; a missing requirement fails, never skips), then the
#                loom models of the lock-free ESP state (own target dir: --cfg loom)
#   make demo    setup + release build + run the namespace demo (DEMO_ARGS=...)
#   make bench   setup + release build + `protego bench` (BENCH_ARGS=..., e.g. --quick --compare-strongswan)
#   make deb     setup + the Debian package (release binary, systemd units, man pages, example
#                configuration, docs) in target/debian/ (scripts/deb.sh, cargo-deb)
#   make lint    rustfmt check + clippy -D warnings
#   make sweep   remove test-bed leftovers of killed runs

SHELL := /bin/bash
CARGO ?= cargo
DEMO_ARGS ?=
BENCH_ARGS ?=

.PHONY: all setup build release test demo bench deb lint fmt sweep

all: test

setup:
	@bash scripts/setup.sh

# The interop tests run the workspace's binaries (e.g. `protego`) from the same
# profile as the tests, so build every binary in the dev profile first; the test
# build then reuses the same artifacts (one profile, no double compile).
build: setup
	$(CARGO) build --workspace --bins

release: setup
	$(CARGO) build --workspace --release

# Under `make test` a test whose program or kernel feature is missing fails (naming what to
# install) instead of skipping: PROTEGO_TEST_STRICT=1 (see crates/testreq). The preflight
# prints what the tests will find before they run.
test: build
	PROTEGO_TEST_STRICT=1 $(CARGO) run -q -p protego-testreq --bin protego-preflight
	PROTEGO_TEST_STRICT=1 $(CARGO) test --workspace
	RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom $(CARGO) test -p protego-esp --release --lib loom

demo: release
	$(CARGO) run --release -q -p protego-testbed --bin protego-demo -- $(DEMO_ARGS)

bench: release
	./target/release/protego bench $(BENCH_ARGS)

# scripts/deb.sh builds the release binary itself, renders the man pages with it and runs
# cargo-deb (installed by setup); the .deb's path is printed last.
deb: setup
	CARGO=$(CARGO) bash scripts/deb.sh

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

sweep:
	$(CARGO) run -q -p protego-testbed --bin protego-demo -- --sweep
