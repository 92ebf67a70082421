#!/usr/bin/env bash
# Entry point for `make test-vm`: the kernel-matrix VM tests (crates/vmtest, tests/vm/README.md).
# Extra arguments go to `vmtest run` (e.g. --kernel 7.2 --test vsock-loopback, --offline).
set -euo pipefail
cd "$(dirname "$0")/../.."
CARGO="${CARGO:-cargo}"
# The host side of the vsock-host boot profile: rust-vmm's vhost-device-vsock, installed once
# into build/tools (cached; a cold install takes ~4-7 min on 2 cores). It is only ever started
# with --uds-path (UNIX sockets); its AF_VSOCK backend (forward-cid) is never used on the host.
# (0.3.0 does not compile with --no-default-features, so the default features stay on.)
# A debug build: it only relays the guests' small test exchanges, and it compiles in half the
# CPU time of a release build (62 s against 125 s user time on this machine, 2026-12-01).
VHD_VERSION=0.3.0
if [ ! -x build/tools/bin/vhost-device-vsock ] ||
    ! grep -q "vhost-device-vsock $VHD_VERSION" build/tools/.crates.toml 2>/dev/null; then
    echo "run.sh: installing vhost-device-vsock $VHD_VERSION into build/tools" >&2
    "$CARGO" install --locked --quiet --debug --root build/tools --version "$VHD_VERSION" vhost-device-vsock
fi
exec "$CARGO" run -q -p nsfast-vmtest --release -- run "$@"
