#!/usr/bin/env bash
# `make test-stress`: the root integration tests and the VM lines, ROUNDS times each, while
# stress-ng keeps every CPU busy, then how often each test failed. A test that fails here even
# once depends on timing or on the order of events between processes (CONTRIBUTING.md, "Tests
# that hold on a loaded machine").
#
#   scripts/test-stress.sh [--rounds N] [--parts "root vm"] [--load N] [-- VMTEST ARGS...]
#
# --load N: stress-ng CPU workers (default: one per CPU; 0: no load). Arguments after `--` go
# to tests/vm/run.sh (e.g. --kernel 7.2). Logs: build/stress/<part>-<round>.log; the summary
# also as build/stress/summary.json. Exit 0 when nothing failed, 1 when a test failed, 2 on bad
# usage.
set -uo pipefail
cd "$(dirname "$0")/.."

rounds=3
parts="root vm"
load=$(nproc)
vm_args=()
usage() { echo "usage: scripts/test-stress.sh [--rounds N] [--parts \"root vm\"] [--load N] [-- VMTEST ARGS...]" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case "$1" in
    --rounds) rounds=${2:-}; shift 2 || usage ;;
    --parts) parts=${2:-}; shift 2 || usage ;;
    --load) load=${2:-}; shift 2 || usage ;;
    --) shift; vm_args=("$@"); break ;;
    -h | --help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "test-stress: unknown argument '$1'" >&2; usage ;;
    esac
done
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "test-stress: --rounds '$rounds': a whole number from 1" >&2; exit 2; }
[[ "$load" =~ ^[0-9]+$ ]] || { echo "test-stress: --load '$load': a whole number of CPU workers (0: none)" >&2; exit 2; }
for p in $parts; do
    case "$p" in root | vm) ;; *) echo "test-stress: --parts '$p': each part is root or vm" >&2; exit 2 ;; esac
done
[ "$(id -u)" = 0 ] || { echo "test-stress: the root tests and the VMs need root" >&2; exit 2; }

out=build/stress
mkdir -p "$out"
rm -f "$out"/*.log "$out"/failures.txt "$out"/summary.json

load_pid=
stop_load() { [ -n "$load_pid" ] && kill "$load_pid" 2>/dev/null && wait "$load_pid" 2>/dev/null; load_pid=; }
trap stop_load EXIT
trap 'stop_load; exit 130' INT TERM
if [ "$load" -gt 0 ]; then
    command -v stress-ng >/dev/null || { echo "test-stress: stress-ng missing: apt-get install stress-ng (make test-stress installs it)" >&2; exit 2; }
    stress-ng --cpu "$load" --quiet &
    load_pid=$!
    echo "test-stress: stress-ng with $load CPU workers (pid $load_pid)"
fi

bin=$PWD/target/debug
root_env=(NSFAST_SHIPPED_BIN_DIR="$bin" NSFAST_TESTPEER_BIN="$bin/nsfast-testpeer"
    VPNRELAY_TEST_BIN="$bin/vpnrelay" NSFAST_VPNRELAY_BIN="$bin/vpnrelay")

# Failing tests of a root log, one "file::test" a line: cargo names each test binary in a
# "Running tests/x.rs" line before its results.
root_failures() {
    awk '/^ *Running /{f=$2; sub(/^.*\//, "", f); sub(/\.rs$/, "", f)}
         /^test .* \.\.\. FAILED$/{print f "::" $2}' "$1"
}
# Failing VM lines: "FAIL <kernel> <line>: ..." (or "FAIL <kernel>: ..." for a whole guest).
vm_failures() {
    awk '/^FAIL /{k=$2; sub(/:$/, "", k); t=$3; sub(/:$/, "", t); if ($2 ~ /:$/) t="(guest)"; print "vm/" k "::" t}' "$1"
}

declare -A runs
start=$(date +%s)
for r in $(seq 1 "$rounds"); do
    for p in $parts; do
        log=$out/$p-$r.log
        t0=$(date +%s)
        echo "test-stress: round $r/$rounds: $p (log $log)"
        if [ "$p" = root ]; then
            env "${root_env[@]}" cargo test --workspace --tests --no-fail-fast >"$log" 2>&1
            rc=$?
            root_failures "$log" >>"$out/failures.txt"
            n=$(grep -c '^test .* \.\.\. ok$' "$log")
        else
            tests/vm/run.sh "${vm_args[@]}" >"$log" 2>&1
            rc=$?
            vm_failures "$log" >>"$out/failures.txt"
            n=$(grep -c ': PASS (' "$log")
        fi
        runs[$p]=$((${runs[$p]:-0} + 1))
        echo "test-stress: round $r/$rounds: $p exit $rc, $n passed, $(($(date +%s) - t0)) s"
    done
done
stop_load

echo
echo "test-stress: $rounds round(s) of: $parts; load: $load CPU workers; $(($(date +%s) - start)) s"
if [ ! -s "$out/failures.txt" ]; then
    echo "test-stress: no test failed"
    printf '{"rounds":%d,"parts":"%s","load":%d,"failures":{}}\n' "$rounds" "$parts" "$load" >"$out/summary.json"
    exit 0
fi
echo "failed  test"
sort "$out/failures.txt" | uniq -c | sort -rn | awk -v n="$rounds" '{printf "%d/%d     %s\n", $1, n, $2}'
sort "$out/failures.txt" | uniq -c | awk -v n="$rounds" -v parts="$parts" -v load="$load" '
    BEGIN {printf "{\"rounds\":%d,\"parts\":\"%s\",\"load\":%d,\"failures\":{", n, parts, load}
    {printf "%s\"%s\":%d", (NR > 1 ? "," : ""), $2, $1}
    END {print "}}"}' >"$out/summary.json"
exit 1
