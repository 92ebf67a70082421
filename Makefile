# nsfast — every target installs what it needs (Debian packages via apt-get) and works as root
# on a fresh Debian 12 machine.
#
#   make demo   install, build, run the main job (nsfast bench --quick) in throwaway namespaces
#   make test   install, then every test: format, lints, fuzzers (short), unit + root
#               integration tests, VM matrix
#   make fuzz   every fuzz target for longer (FUZZ_SECS each, default 600; docs/fuzzing.md)
#   make bench  the full benchmark

SHELL := /bin/bash
CARGO ?= cargo
RELEASE_BIN := target/release/nsfast

# Debian packages the build and the tests need.
DEB_BUILD := clang-19 llvm-19 libbpf-dev linux-libc-dev pkg-config make gcc
DEB_TEST  := iproute2 bpftool sockperf iperf3 procps python3 containernetworking-plugins rootlesskit slirp4netns uidmap nftables iptables util-linux passwd busybox-static wireguard-go wireguard-tools conntrack
DEB_VM    := qemu-system-x86 kmod xz-utils debian-archive-keyring binutils libc-bin socat nftables
DEB_ALL   := $(DEB_BUILD) $(DEB_TEST) $(DEB_VM)

.PHONY: all deps build demo test test-unit test-root test-vm lint fuzz fuzz-ci bench clean

all: build

# Installs only what is missing; runs `apt-get update` only when something must be installed.
deps:
	@command -v $(CARGO) >/dev/null || { echo "nsfast: cargo not found: install Rust (rustup, stable >= 1.95) first" >&2; exit 1; }
	@missing=$$(for p in $(DEB_ALL); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "nsfast: installing Debian packages:" $$missing; \
		if [ "$$(id -u)" != 0 ]; then echo "nsfast: need root to install packages" >&2; exit 1; fi; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

build: deps
	$(CARGO) build --release --workspace --bins

# host / veth / routed / sockmap, every workload, 3 interleaved rounds: table + JSON + SVGs.
demo: build
	$(RELEASE_BIN) bench --quick --json bench-results/bench.json

lint: deps
	$(CARGO) fmt --all -- --check
	rustfmt --edition 2021 --check fuzz/fuzz_targets/*.rs
	$(CARGO) clippy --workspace --all-targets -- -D warnings

test-unit: deps
	$(CARGO) test --workspace --lib --bins

# Root integration tests: throwaway namespaces, cgroups, BPF (all removed afterwards).
test-root: deps
	$(CARGO) test --workspace --tests

test-vm: deps
	tests/vm/run.sh

# Coverage-guided fuzzers (cargo-fuzz on the nightly toolchain; cargo-fuzz is installed into
# build/tools once). New inputs go to build/fuzz/, never into the tree; any crash fails.
FUZZ_SECS ?= 600
FUZZ_CI_SECS ?= 20
fuzz-ci: deps
	fuzz/run.sh -t $(FUZZ_CI_SECS)

fuzz: deps
	fuzz/run.sh -t $(FUZZ_SECS) $(if $(FUZZ_MERGE),--merge)

test: lint fuzz-ci test-root test-vm

# Longer run, both CPU placements, with the sockperf/iperf3 cross-check.
bench: build
	$(RELEASE_BIN) bench --placement same-cpu,cross-cpu --cross-check --json bench-results/bench.json

clean:
	$(CARGO) clean
	rm -rf build
