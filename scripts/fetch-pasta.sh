#!/bin/sh
# pasta (Debian unstable's passt package) unpacked into build/passt-sid without touching the
# system's apt sources, with a wrapper build/passt-sid/pasta that runs it. Unstable's passt is
# built against a newer C library than Debian 12's (it needs GLIBC_2.38), so unstable's libc6
# is unpacked next to it and the wrapper starts pasta through that library's own dynamic
# loader; nothing else on the system uses that copy. RootlessKit's `--net=pasta` (RootlessKit
# >= 2, scripts/fetch-rootlesskit2.sh) takes the wrapper as --pasta-binary. Prints the wrapper.
set -eu
dir=$("$(dirname "$0")/fetch-debs.sh" sid passt-sid passt libc6)
lib="$dir/usr/lib/x86_64-linux-gnu"
bin="$dir/usr/bin/pasta"
# The AVX2 build where the CPU has AVX2 (what the package's own pasta would exec itself).
if grep -qw avx2 /proc/cpuinfo && [ -x "$bin.avx2" ]; then bin="$bin.avx2"; fi
cat > "$dir/pasta.tmp" <<WRAP
#!/bin/sh
exec "$lib/ld-linux-x86-64.so.2" --library-path "$lib" "$bin" "\$@"
WRAP
chmod 0755 "$dir/pasta.tmp"
mv "$dir/pasta.tmp" "$dir/pasta"
ver=$("$dir/pasta" --version 2>/dev/null | head -n1 || true)
[ -n "$ver" ] || { echo "fetch-pasta: $dir/pasta does not run on this system" >&2; exit 1; }
echo "$ver" >&2
echo "$dir/pasta"
