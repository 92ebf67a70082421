#!/usr/bin/env bash
# Entry point for `make test-vm`: the kernel-matrix VM tests (crates/vmtest, tests/vm/README.md).
# Extra arguments go to `vmtest run` (e.g. --kernel 7.2 --test vsock-loopback, --offline).
set -euo pipefail
cd "$(dirname "$0")/../.."
exec "${CARGO:-cargo}" run -q -p nsfast-vmtest --release -- run "$@"
