#!/bin/sh
# fetch-debs.sh SUITE NAME PKG... — downloads Debian packages of SUITE with a private apt
# configuration (lists and cache under build/apt-SUITE; the system's apt sources and dpkg
# database are not touched), unpacks them with `dpkg -x` into build/NAME (nothing is
# installed, no maintainer script runs, no service starts) and prints that directory.
set -eu
suite=$1; name=$2; shift 2
root=$(cd "$(dirname "$0")/.." && pwd)
out="$root/build/$name"
if [ -f "$out/.complete" ]; then echo "$out"; exit 0; fi
apt="$root/build/apt-$suite"
mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/deb"
# The Debian mirror the system already uses.
uri=$(grep -h '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' | grep '/debian$' | head -n1 || true)
[ -n "$uri" ] || uri=$(grep -h '^deb ' /etc/apt/sources.list 2>/dev/null | awk '{print $2}' | grep '/debian/\?$' | head -n1 || true)
[ -n "$uri" ] || { echo "fetch-debs: no Debian mirror in the system's apt sources" >&2; exit 1; }
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $uri $suite main" > "$apt/sources.list"
opts="-o Dir::Etc::SourceList=$apt/sources.list -o Dir::Etc::SourceParts=/dev/null \
 -o Dir::State::Lists=$apt/lists -o Dir::Cache=$apt/cache -o Dir::State::Status=/var/lib/dpkg/status \
 -o APT::Get::List-Cleanup=0 -o APT::Sandbox::User=root -o Debug::NoLocking=1"
# shellcheck disable=SC2086
apt-get $opts -qq update >&2
cd "$apt/deb"
# shellcheck disable=SC2086
apt-get $opts -qq download "$@" >&2
mkdir -p "$out"
for p in "$@"; do
    deb=$(ls -t "$apt"/deb/"${p}"_*.deb | head -n1)
    dpkg -x "$deb" "$out"
done
touch "$out/.complete"
echo "$out"
