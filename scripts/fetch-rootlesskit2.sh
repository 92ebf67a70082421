#!/bin/sh
# Fetches RootlessKit >= 2.0 (needed for --detach-netns; Debian 12 ships 1.1) from Debian
# unstable with a private apt configuration, and unpacks it with `dpkg -x` into build/.
# The system's apt sources are not touched: the mirror URI is read from them, the lists and
# cache live under build/apt. Prints the path of the rootlesskit binary.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
out="$root/build/rootlesskit-sid"
bin="$out/usr/bin/rootlesskit"
if [ -x "$bin" ]; then echo "$bin"; exit 0; fi
apt="$root/build/apt"
mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/deb"
# The Debian mirror the system already uses (first deb822 URIs line with /debian).
uri=$(grep -h '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' | grep '/debian$' | head -n1)
[ -n "$uri" ] || uri=$(grep -h '^deb ' /etc/apt/sources.list 2>/dev/null | awk '{print $2}' | grep '/debian/\?$' | head -n1)
[ -n "$uri" ] || { echo "fetch-rootlesskit2: no Debian mirror in the system's apt sources" >&2; exit 1; }
cat > "$apt/sources.list" <<SRC
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $uri sid main
SRC
opts="-o Dir::Etc::SourceList=$apt/sources.list -o Dir::Etc::SourceParts=/dev/null \
 -o Dir::State::Lists=$apt/lists -o Dir::Cache=$apt/cache -o Dir::State::Status=/var/lib/dpkg/status \
 -o APT::Get::List-Cleanup=0 -o APT::Sandbox::User=root -o Debug::NoLocking=1"
# shellcheck disable=SC2086
apt-get $opts -qq update >&2
cd "$apt/deb"
# shellcheck disable=SC2086
apt-get $opts -qq download rootlesskit >&2
deb=$(ls -t "$apt"/deb/rootlesskit_*.deb | head -n1)
mkdir -p "$out"
dpkg -x "$deb" "$out"
"$bin" --version >&2
echo "$bin"
