#!/usr/bin/env bash
# Runs the fuzz targets (docs/fuzzing.md). Entry point of `make fuzz-ci` and `make fuzz`.
#
#   fuzz/run.sh [-t SECS] [--merge] [TARGET...]   (default: every target, 20 s each)
#
# FUZZ_JOBS targets run at once (default: one per CPU).
#
# Each target starts from its seed corpus fuzz/corpus/<target>/ (read only) and writes what
# it finds to build/fuzz/corpus/<target>/, so a run leaves the git tree clean; `--merge` then
# adds the new inputs that reach new code to fuzz/corpus/ (libFuzzer -merge=1), to commit.
# A crash, a timeout, a leak or a target that does not build makes the script exit 1; the
# crashing input is kept in build/fuzz/artifacts/<target>/.
set -euo pipefail
cd "$(dirname "$0")/.."
CARGO="${CARGO:-cargo}"
TOOLCHAIN="${FUZZ_TOOLCHAIN:-nightly}"
secs=20
merge=0
targets=()
while [ $# -gt 0 ]; do
    case "$1" in
    -t) secs="$2"; shift 2 ;;
    --merge) merge=1; shift ;;
    -*) echo "fuzz/run.sh: unknown option $1 (use -t SECS, --merge)" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
    esac
done
case "$secs" in
'' | *[!0-9]* | 0) echo "fuzz/run.sh: -t needs a number of seconds >= 1, not \"$secs\"" >&2; exit 2 ;;
esac

if ! "$CARGO" "+$TOOLCHAIN" --version >/dev/null 2>&1; then
    echo "fuzz/run.sh: no Rust toolchain \"$TOOLCHAIN\": rustup toolchain install nightly" \
        "(or set FUZZ_TOOLCHAIN)" >&2
    exit 1
fi
# cargo-fuzz, installed once into build/tools (cached like tests/vm/run.sh's tools). A debug
# build: it only starts cargo and the fuzzers, and a release install takes 117 s on 2 cores.
CARGO_FUZZ_VERSION=0.13.2
if [ ! -x build/tools/bin/cargo-fuzz ] ||
    ! grep -q "cargo-fuzz $CARGO_FUZZ_VERSION" build/tools/.crates.toml 2>/dev/null; then
    echo "fuzz/run.sh: installing cargo-fuzz $CARGO_FUZZ_VERSION into build/tools" >&2
    "$CARGO" install --locked --quiet --debug --root build/tools --version "$CARGO_FUZZ_VERSION" cargo-fuzz
fi
export PATH="$PWD/build/tools/bin:$PATH"
fuzz=("$CARGO" "+$TOOLCHAIN" fuzz)
# FUZZ_CODEGEN_UNITS=N: codegen units per crate (cargo-fuzz's default is 1). `make fuzz-ci` sets
# 16, as cargo-fuzz suggests for faster builds: its runs are 15 s, so build time dominates.
build_flags=(--debug-assertions)
[ -z "${FUZZ_CODEGEN_UNITS:-}" ] || build_flags+=(--codegen-units "$FUZZ_CODEGEN_UNITS")

all=$("${fuzz[@]}" list)
[ ${#targets[@]} -gt 0 ] || read -r -a targets <<<"$(echo $all)"
for t in "${targets[@]}"; do
    grep -qx "$t" <<<"$all" || { echo "fuzz/run.sh: no target $t (targets: $(echo $all))" >&2; exit 2; }
done

# The targets build against the main workspace's locked versions: fuzz/Cargo.lock (not in
# git) starts as a copy of ./Cargo.lock whenever that changes; cargo adds libfuzzer-sys.
if [ ! -e fuzz/Cargo.lock ] || [ Cargo.lock -nt fuzz/Cargo.lock ]; then
    cp Cargo.lock fuzz/Cargo.lock
fi
# One build for all targets: release, debug assertions and overflow checks on, AddressSanitizer.
if ! "${fuzz[@]}" build "${build_flags[@]}"; then
    echo "fuzz: FAILED: the fuzz targets do not build" >&2
    exit 1
fi

# One target: a summary line; build/fuzz/logs/<target>.failed when it crashed.
run_one() {
    local t=$1 work=build/fuzz/corpus/$1 art=build/fuzz/artifacts/$1 log=build/fuzz/logs/$1.log
    local rc=0 runs eps cov new unit
    mkdir -p "$work" "$art"
    rm -f "build/fuzz/logs/$t.failed"
    "${fuzz[@]}" run "${build_flags[@]}" "$t" "$work" "fuzz/corpus/$t" -- \
        -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$art/" >"$log" 2>&1 || rc=$?
    # (A crash on a seed comes before any stats: these may find nothing.)
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n1)
    eps=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n1 | cut -d' ' -f2 || true)
    new=$(find "$work" -type f | wc -l)
    if [ "$rc" -ne 0 ]; then
        touch "build/fuzz/logs/$t.failed"
        unit=$(sed -n 's/.*Test unit written to //p' "$log" | tail -n1)
        {
            printf 'fuzz: %-18s FAILED (exit %d) after %s runs: 1 crash, input %s; log %s\n' \
                "$t" "$rc" "${runs:-?}" "${unit:-(none written: the target did not start)}" "$log"
            grep -m1 -A3 -E "panicked at|ERROR: (libFuzzer|AddressSanitizer|LeakSanitizer)" "$log" |
                sed 's/^/    /' || true
        }
        return
    fi
    printf 'fuzz: %-18s ok  %9s runs %7s exec/s  cov %5s  %4s inputs found  0 crashes  (%s s)\n' \
        "$t" "${runs:-?}" "${eps:-?}" "${cov:-?}" "$new" "$secs"
    if [ "$merge" = 1 ] && [ "$new" -gt 0 ]; then
        "${fuzz[@]}" run "${build_flags[@]}" "$t" "fuzz/corpus/$t" "$work" -- -merge=1 >>"$log" 2>&1
        echo "fuzz: $t: merged into fuzz/corpus/$t ($(find "fuzz/corpus/$t" -type f | wc -l) inputs)"
    fi
}

# FUZZ_JOBS targets at a time (default: one per CPU), each on one core.
jobs="${FUZZ_JOBS:-$(nproc)}"
mkdir -p build/fuzz/logs
for t in "${targets[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
    run_one "$t" &
done
wait
failed=()
for t in "${targets[@]}"; do
    [ ! -e "build/fuzz/logs/$t.failed" ] || failed+=("$t")
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz: FAILED: ${failed[*]}" >&2
    exit 1
fi
