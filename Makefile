# nsfast — every target installs what it needs (Debian packages via apt-get) and works as root
# on a fresh Debian 12 machine; `make build` and `make install` also work as any user once the
# build packages are there.
#
#   make build    the release binaries (needs only the build packages: DEB_BUILD)
#   make install  PREFIX=/usr/local DESTDIR=: binaries, nsfast-cni, man pages, completions, units
#   make deb      build/nsfast_<version>_<arch>.deb from the install tree
#   make demo   install, build, run the main job (nsfast bench --quick) in throwaway namespaces
#   make test   install, then every test: format, lints, fuzzers (short), unit + root
#               integration tests, VM matrix
#   make test-stress  the root tests and VM lines 3 times each on a loaded machine (flaky-test hunt)
#   make check  the fast lane, as any user, installs nothing: format, lints, unit tests, fuzz
#               smoke (every fuzz target over its seed corpus, stable toolchain)
#   make fuzz   every fuzz target for longer (FUZZ_SECS each, default 600; docs/fuzzing.md)
#   make bench  the full benchmark

SHELL := /bin/bash
CARGO ?= cargo
RELEASE_BIN := target/release/nsfast

# Debian packages the build and the tests need (prometheus: promtool and a real server for
# crates/integration-test/tests/metrics.rs).
DEB_BUILD := clang-19 llvm-19 libbpf-dev linux-libc-dev pkg-config make gcc
DEB_TEST  := haproxy bird2 golang-go iproute2 bpftool sockperf iperf3 procps python3 containernetworking-plugins rootlesskit slirp4netns uidmap nftables iptables util-linux passwd busybox-static wireguard-go wireguard-tools conntrack podman runc prometheus
DEB_VM    := qemu-system-x86 kmod xz-utils debian-archive-keyring binutils libc-bin socat nftables
# Packages `make deb` and `make test-install` use (man-db renders, binutils strips and reads ELF,
# zsh/fish check the completions, lintian checks the .deb).
DEB_SHIP  := man-db groff-base binutils zsh fish lintian
DEB_ALL   := $(DEB_BUILD) $(DEB_TEST) $(DEB_VM) $(DEB_SHIP)

.PHONY: all check check-cargo check-tools deps deps-build build demo test test-unit test-root test-vm test-stress lint fuzz fuzz-ci bench clean

all: build

# --- package sets -----------------------------------------------------------------------------
# `deps-build`: only what `make build` needs (no root needed when it is all there already).
# `deps`: everything the tests, the VM matrix and the demo need.
# Both install only what is missing and run `apt-get update` only when something must be
# installed; without root they name the missing packages and stop.
define install_missing
	@missing=$$(for p in $(1); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "nsfast: installing Debian packages:" $$missing; \
		if [ "$$(id -u)" != 0 ]; then echo "nsfast: need root to install packages (or install them yourself): $$missing" >&2; exit 1; fi; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi
endef

check-cargo:
	@command -v $(CARGO) >/dev/null || { echo "nsfast: cargo not found: install Rust (rustup, stable >= 1.95) first" >&2; exit 1; }

deps-build: check-cargo
	$(call install_missing,$(DEB_BUILD))

deps: check-cargo
	$(call install_missing,$(DEB_ALL))
# --- end package sets -------------------------------------------------------------------------

build: deps-build
	$(CARGO) build --release --workspace --bins

# host / veth / routed / sockmap, every workload, 3 interleaved rounds: table + JSON + SVGs.
demo: deps build
	$(RELEASE_BIN) bench --quick --json bench-results/bench.json

# The fast lane: no root, no apt-get, no namespaces. It runs what `lint` and `test-unit` run
# plus fuzz/smoke.sh, and stops naming the Debian package when a build tool is missing
# (install it yourself, or run `make deps-build` as root).
check: check-cargo check-tools
	$(CARGO) fmt --all -- --check
	rustfmt --edition 2021 --check fuzz/fuzz_targets/*.rs
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps --quiet
	$(CARGO) test --workspace --lib --bins
	fuzz/smoke.sh

# Tools the BPF build (crates/nsfast-bpf/build.rs: $$NSFAST_CLANG, else clang-19, -20, -18 or
# clang; headers from libbpf-dev and linux-libc-dev) and the fuzz smoke's libFuzzer (C++) need.
check-tools:
	@command -v rustfmt >/dev/null && $(CARGO) clippy --version >/dev/null 2>&1 || { echo "nsfast: rustfmt or clippy missing: rustup component add rustfmt clippy" >&2; exit 1; }
	@for c in $${NSFAST_CLANG:-clang-19 clang-20 clang-18 clang}; do command -v $$c >/dev/null && exit 0; done; \
		echo "nsfast: no clang for the BPF build: install the Debian package clang-19 (or set NSFAST_CLANG)" >&2; exit 1
	@[ -e /usr/include/bpf/bpf_helpers.h ] || { echo "nsfast: /usr/include/bpf/bpf_helpers.h missing (BPF build): install the Debian package libbpf-dev" >&2; exit 1; }
	@[ -e /usr/include/linux/bpf.h ] || { echo "nsfast: /usr/include/linux/bpf.h missing (BPF build): install the Debian package linux-libc-dev" >&2; exit 1; }
	@command -v c++ >/dev/null || { echo "nsfast: no C++ compiler (builds libFuzzer for fuzz/smoke.sh): install the Debian package g++" >&2; exit 1; }

lint: deps
	$(CARGO) fmt --all -- --check
	rustfmt --edition 2021 --check fuzz/fuzz_targets/*.rs
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps --quiet

test-unit: deps
	$(CARGO) test --workspace --lib --bins

# Root integration tests: throwaway namespaces, cgroups, BPF (all removed afterwards).
# The workspace binaries tests run as processes (the traffic peer, vpnrelay, nsfast-cni) are
# the ones this same `cargo test --workspace --tests` builds into target/debug before any test
# runs; without these variables each test would `cargo build` its own copy, with the feature
# set of a build without dev-dependencies: a second debug compile of ~25 crates.
TEST_BIN_DIR := $(CURDIR)/target/debug
TEST_BINS_ENV := NSFAST_SHIPPED_BIN_DIR=$(TEST_BIN_DIR) NSFAST_TESTPEER_BIN=$(TEST_BIN_DIR)/nsfast-testpeer \
	VPNRELAY_TEST_BIN=$(TEST_BIN_DIR)/vpnrelay NSFAST_VPNRELAY_BIN=$(TEST_BIN_DIR)/vpnrelay
test-root: deps
	$(TEST_BINS_ENV) $(CARGO) test --workspace --tests

test-vm: deps
	tests/vm/run.sh

# --- install / package ------------------------------------------------------------------------
# `make install` installs what `make build` built (it builds only when a binary is missing, so
# it runs as any user who can write $(DESTDIR)$(PREFIX)); man pages and completions are
# generated from the clap definitions by the built binary (`nsfast __gen-docs`), naming the
# documentation where it is installed: README.md and docs/*.md under DOCDIR.
PREFIX  ?= /usr/local
DESTDIR ?=
BINDIR  := $(PREFIX)/bin
CNIDIR  := $(PREFIX)/lib/cni
MANDIR  := $(PREFIX)/share/man
UNITDIR := $(PREFIX)/lib/systemd/system
USERUNITDIR := $(PREFIX)/lib/systemd/user
DOCDIR  := $(PREFIX)/share/doc/nsfast
BASHDIR := $(PREFIX)/share/bash-completion/completions
ZSHDIR  := $(PREFIX)/share/zsh/vendor-completions
FISHDIR := $(PREFIX)/share/fish/vendor_completions.d
SHIP_BINS := target/release/nsfast target/release/vpnrelay target/release/nsfast-cni
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
DEB_ARCH = $(shell dpkg --print-architecture)
DEB_ROOT := build/deb/root
DEB_FILE = build/nsfast_$(VERSION)_$(DEB_ARCH).deb

.PHONY: install uninstall deb test-install

install:
	@for b in $(SHIP_BINS); do [ -x $$b ] || { echo "nsfast: $$b missing: building"; $(MAKE) build || exit 1; break; }; done
	@set -e; d="$(DESTDIR)"; gen=$$(mktemp -d); trap 'rm -rf "$$gen"' EXIT; \
	$(RELEASE_BIN) __gen-docs --man-dir "$$gen/man" --completions-dir "$$gen/comp" --doc-dir $(DOCDIR) >/dev/null; \
	install -d "$$d$(BINDIR)" "$$d$(CNIDIR)" "$$d$(MANDIR)/man1" "$$d$(MANDIR)/man8" "$$d$(UNITDIR)" \
		"$$d$(USERUNITDIR)" "$$d$(DOCDIR)/docs" "$$d$(BASHDIR)" "$$d$(ZSHDIR)" "$$d$(FISHDIR)"; \
	install -m755 target/release/nsfast target/release/vpnrelay "$$d$(BINDIR)/"; \
	install -m755 target/release/nsfast-cni "$$d$(CNIDIR)/"; \
	install -m644 "$$gen"/man/*.8 dist/man/*.8 "$$d$(MANDIR)/man8/"; \
	install -m644 "$$gen"/man/*.1 "$$d$(MANDIR)/man1/"; \
	install -m644 "$$gen"/comp/bash/* "$$d$(BASHDIR)/"; \
	install -m644 "$$gen"/comp/zsh/* "$$d$(ZSHDIR)/"; \
	install -m644 "$$gen"/comp/fish/* "$$d$(FISHDIR)/"; \
	for u in nsfast-sockmap@.service nsfast-vsock-bridge.service; do \
		sed 's|@BINDIR@|$(BINDIR)|g' dist/systemd/$$u > "$$d$(UNITDIR)/$$u"; chmod 644 "$$d$(UNITDIR)/$$u"; done; \
	sed 's|@BINDIR@|$(BINDIR)|g' dist/systemd/vpnrelay@.service > "$$d$(USERUNITDIR)/vpnrelay@.service"; \
	chmod 644 "$$d$(USERUNITDIR)/vpnrelay@.service"; \
	install -m644 examples/cni/10-nsfast.conflist dist/systemd/nsfast-vsock-bridge.default dist/bird/bird.conf README.md "$$d$(DOCDIR)/"; \
	install -m644 docs/*.md "$$d$(DOCDIR)/docs/"; \
	echo "nsfast: installed nsfast and vpnrelay into $$d$(BINDIR), man pages into $$d$(MANDIR), units into $$d$(UNITDIR) and $$d$(USERUNITDIR)"; \
	echo "nsfast: installed the CNI plugin into $(CNIDIR)/nsfast-cni: add $(CNIDIR) to your runtime's CNI plugin path (cni_plugin_dirs, bin_dir)"

# Removes what `make install` (same PREFIX/DESTDIR) installed.
uninstall:
	rm -f $(DESTDIR)$(BINDIR)/nsfast $(DESTDIR)$(BINDIR)/vpnrelay $(DESTDIR)$(CNIDIR)/nsfast-cni
	rm -f $(DESTDIR)$(MANDIR)/man8/nsfast*.8 $(DESTDIR)$(MANDIR)/man1/vpnrelay*.1
	rm -f $(DESTDIR)$(BASHDIR)/nsfast $(DESTDIR)$(BASHDIR)/vpnrelay $(DESTDIR)$(ZSHDIR)/_nsfast $(DESTDIR)$(ZSHDIR)/_vpnrelay
	rm -f $(DESTDIR)$(FISHDIR)/nsfast.fish $(DESTDIR)$(FISHDIR)/vpnrelay.fish
	rm -f $(DESTDIR)$(UNITDIR)/nsfast-sockmap@.service $(DESTDIR)$(UNITDIR)/nsfast-vsock-bridge.service $(DESTDIR)$(USERUNITDIR)/vpnrelay@.service
	rm -rf $(DESTDIR)$(DOCDIR)

# A Debian package from the install tree (PREFIX=/usr): dpkg-deb only, no debhelper.
deb:
	rm -rf build/deb
	$(MAKE) --no-print-directory install PREFIX=/usr DESTDIR=$(CURDIR)/$(DEB_ROOT)
	strip --strip-unneeded --remove-section=.comment --remove-section=.note $(DEB_ROOT)/usr/bin/nsfast \
		$(DEB_ROOT)/usr/bin/vpnrelay $(DEB_ROOT)/usr/lib/cni/nsfast-cni
	gzip -9n $(DEB_ROOT)/usr/share/man/man*/*
	install -m644 dist/deb/copyright $(DEB_ROOT)/usr/share/doc/nsfast/copyright
	install -D -m644 dist/deb/lintian-overrides $(DEB_ROOT)/usr/share/lintian/overrides/nsfast
	scripts/deb-control.sh $(DEB_ROOT) $(VERSION) $(DEB_ARCH)
	install -m755 dist/deb/postinst dist/deb/prerm dist/deb/postrm $(DEB_ROOT)/DEBIAN/
	dpkg-deb --build --root-owner-group $(DEB_ROOT) $(DEB_FILE)
	@echo "nsfast: built $(DEB_FILE) (install: dpkg -i $(DEB_FILE))"

# make install as a non-root user, man pages, completions, units, the .deb (install, run, purge).
test-install: deps build
	tests/install/check.sh
# --- end install / package --------------------------------------------------------------------

# Coverage-guided fuzzers (cargo-fuzz on the nightly toolchain; cargo-fuzz is installed into
# build/tools once). New inputs go to build/fuzz/, never into the tree; any crash fails.
FUZZ_SECS ?= 600
FUZZ_CI_SECS ?= 15
fuzz-ci: deps
	FUZZ_CODEGEN_UNITS=16 fuzz/run.sh -t $(FUZZ_CI_SECS)

fuzz: deps
	fuzz/run.sh -t $(FUZZ_SECS) $(if $(FUZZ_MERGE),--merge)

test: lint fuzz-ci test-root test-install test-vm

# The flaky-test hunt (not part of `make test`): the root tests and the VM lines STRESS_ROUNDS
# times each while stress-ng keeps every CPU busy, then how often each test failed
# (scripts/test-stress.sh; CONTRIBUTING.md, "Tests that hold on a loaded machine").
STRESS_ROUNDS ?= 3
STRESS_PARTS ?= root vm
test-stress: deps
	$(call install_missing,stress-ng)
	$(CARGO) build --workspace --tests
	scripts/test-stress.sh --rounds $(STRESS_ROUNDS) --parts "$(STRESS_PARTS)"

# Longer run, both CPU placements, with the sockperf/iperf3 cross-check and each row's BPF
# cost (the kernel's BPF statistics).
bench: deps build
	$(RELEASE_BIN) bench --placement same-cpu,cross-cpu --cross-check --bpf-stats --json bench-results/bench.json

clean:
	$(CARGO) clean
	rm -rf build
