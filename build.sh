#!/bin/sh
# Builds a static, reproducible `vpnrelay` binary and prints its SHA-256.
#
# Static glibc (`-C target-feature=+crt-static` on x86_64-unknown-linux-gnu): the musl target
# cannot be installed on the build machines. vpnrelay resolves no names and looks up no users,
# so none of glibc's NSS/dlopen paths are used at run time.
#
# Reproducible: the same bytes from any checkout directory and any $CARGO_HOME: paths are
# remapped, symbols stripped, no build id, dependencies pinned by Cargo.lock (--locked).
#
# Usage: ./build.sh            -> target/static/x86_64-unknown-linux-gnu/release/vpnrelay
set -eu
root=$(cd "$(dirname "$0")" && pwd)
cd "$root"
target=x86_64-unknown-linux-gnu
cargo_home=${CARGO_HOME:-$HOME/.cargo}
RUSTFLAGS="-C target-feature=+crt-static -C link-arg=-Wl,--build-id=none \
 --remap-path-prefix=$root=/nsfast --remap-path-prefix=$cargo_home=/cargo \
 --remap-path-prefix=$(rustc --print sysroot)=/rustc-sysroot"
export RUSTFLAGS
export CARGO_TARGET_DIR="$root/target/static"
export CARGO_PROFILE_RELEASE_DEBUG=0
export CARGO_PROFILE_RELEASE_STRIP=symbols
export CARGO_PROFILE_RELEASE_CODEGEN_UNITS=1
export CARGO_INCREMENTAL=0
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-0}
cargo build --release --locked --target "$target" -p nsfast --bin vpnrelay >&2
bin="$CARGO_TARGET_DIR/$target/release/vpnrelay"
if ldd "$bin" >/dev/null 2>&1 && ! ldd "$bin" 2>&1 | grep -q 'not a dynamic executable\|statically linked'; then
    echo "build.sh: $bin is not static:" >&2
    ldd "$bin" >&2
    exit 1
fi
sha256sum "$bin"
