#!/usr/bin/env bash
# Fuzz smoke test on the stable toolchain (part of `make check`; docs/fuzzing.md).
#
#   fuzz/smoke.sh [TARGET...]   (default: every target)
#
# Builds the fuzz targets as plain binaries (debug profile: debug assertions and overflow
# checks on, no sanitizer, no coverage instrumentation) and runs each target once over every
# input of its seed corpus fuzz/corpus/<target>/ (libFuzzer's mode for file arguments: each
# file is executed once, nothing is mutated, nothing is written). A panic or failed invariant
# on any seed, or a target that does not build, exits 1. It needs neither nightly nor
# cargo-fuzz; coverage-guided fuzzing is fuzz/run.sh (`make fuzz-ci`, `make fuzz`).
set -euo pipefail
cd "$(dirname "$0")/.."
CARGO="${CARGO:-cargo}"

all=$(sed -n 's/^name = "\(.*\)"/\1/p' fuzz/Cargo.toml | grep -vx nsfast-fuzz)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || read -r -a targets <<<"$(echo $all)"
for t in "${targets[@]}"; do
    grep -qx "$t" <<<"$all" || { echo "fuzz/smoke.sh: no target $t (targets: $(echo $all))" >&2; exit 2; }
done

# The targets build against the main workspace's locked versions (as in fuzz/run.sh).
if [ ! -e fuzz/Cargo.lock ] || [ Cargo.lock -nt fuzz/Cargo.lock ]; then
    cp Cargo.lock fuzz/Cargo.lock
fi
# fuzz/target/debug: cargo-fuzz builds into fuzz/target/<triple>/, so the two do not collide.
if ! "$CARGO" build --quiet --manifest-path fuzz/Cargo.toml --bins; then
    echo "fuzz smoke: FAILED: the fuzz targets do not build" >&2
    exit 1
fi

mkdir -p build/fuzz/smoke
failed=()
for t in "${targets[@]}"; do
    mapfile -t seeds < <(find "fuzz/corpus/$t" -type f | sort)
    log=build/fuzz/smoke/$t.log
    if [ ${#seeds[@]} -eq 0 ]; then
        echo "fuzz smoke: $t: FAILED: no seeds in fuzz/corpus/$t" >&2
        failed+=("$t")
        continue
    fi
    if "fuzz/target/debug/$t" -timeout=10 "${seeds[@]}" >"$log" 2>&1; then
        printf 'fuzz smoke: %-18s ok  %3d seeds\n' "$t" "${#seeds[@]}"
    else
        printf 'fuzz smoke: %-18s FAILED over its %d seeds; log %s\n' "$t" "${#seeds[@]}" "$log" >&2
        grep -E "^Running: |panicked at|ERROR: " "$log" | tail -n 4 | sed 's/^/    /' >&2 || true
        failed+=("$t")
    fi
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz smoke: FAILED: ${failed[*]}" >&2
    exit 1
fi
