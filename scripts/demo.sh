#!/usr/bin/env bash
# The main job: nsfast bench --quick in throwaway namespaces (falls back to the sockmap
# demonstration while the bench command is not built in).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=target/release/nsfast
if "$bin" bench --help >/dev/null 2>&1; then
    exec "$bin" bench --quick --json build/demo/bench.json
fi
echo "== nsfast sockmap: 1 GiB each way across two namespaces, through the shortcut =="
cargo test --release -p nsfast --test sockmap bulk_both_directions -- --nocapture
