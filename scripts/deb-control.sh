#!/bin/bash
# Writes DEBIAN/control and DEBIAN/md5sums for the nsfast package staged in ROOT, and the
# Debian changelog of this native package (usr/share/doc/nsfast/changelog.gz, one entry for
# VERSION dated $SOURCE_DATE_EPOCH or the last commit; the project's history is CHANGELOG.md).
# Depends is computed from the ELF binaries: the package owning each NEEDED library, and for
# libc6 the newest GLIBC_x.y symbol version they use.
#
#   scripts/deb-control.sh ROOT VERSION ARCH
set -euo pipefail
root=$1 version=$2 arch=$3
bins=("$root"/usr/bin/nsfast "$root"/usr/bin/vpnrelay "$root"/usr/lib/cni/nsfast-cni)

declare -A pkgs=()
for b in "${bins[@]}"; do
	for lib in $(objdump -p "$b" | awk '/NEEDED/ {print $2}'); do
		# No early exit in awk: under pipefail a SIGPIPE'd ldconfig fails the script (it did in CI).
		path=$(ldconfig -p | awk -v l="$lib" '$1 == l && !seen {print $NF; seen = 1}')
		[ -n "$path" ] || { echo "deb-control: $lib (needed by $b) not found" >&2; exit 1; }
		pkg=$(dpkg -S "$(readlink -f "$path")" 2>/dev/null || dpkg -S "$path" 2>/dev/null) ||
			{ echo "deb-control: no package owns $path" >&2; exit 1; }
		pkg=${pkg%%:*}
		pkgs[$pkg]=1
	done
done
glibc=$(for b in "${bins[@]}"; do objdump -T "$b"; done | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1)
deps=()
for p in $(printf '%s\n' "${!pkgs[@]}" | sort); do
	if [ "$p" = libc6 ] && [ -n "$glibc" ]; then deps+=("libc6 (>= $glibc)"); else deps+=("$p"); fi
done
depends=$(IFS=,; echo "${deps[*]}" | sed 's/,/, /g')
when=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}
cat <<CHL | gzip -9n >"$root/usr/share/doc/nsfast/changelog.gz"
nsfast ($version) unstable; urgency=medium

  * Release $version (built from the nsfast sources, not from a Debian tree).

 -- nsfast developers <nsfast@example.invalid>  $(LC_ALL=C date -u -R -d "@$when")
CHL
chmod 644 "$root/usr/share/doc/nsfast/changelog.gz"
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)

mkdir -p "$root/DEBIAN"
cat >"$root/DEBIAN/control" <<CTL
Package: nsfast
Version: $version
Architecture: $arch
Maintainer: nsfast developers <nsfast@example.invalid>
Installed-Size: $size
Depends: $depends
Recommends: iproute2, bpftool
Suggests: containernetworking-plugins, rootlesskit, slirp4netns
Section: net
Priority: optional
Homepage: https://example.invalid/nsfast
Description: fast paths across Linux namespace and VM boundaries
 nsfast: a same-host TCP shortcut between network namespaces (sockmap), pods on
 veth/netkit pairs with BPF host routing and a CNI plugin (nsfast-cni), vsock
 relays and a vsock bridge between VMs, vpnrelay for VPN tunnels under rootless
 Docker, and a benchmark that measures every path side by side.
CTL
(cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) >"$root/DEBIAN/md5sums"
chmod 644 "$root/DEBIAN/control" "$root/DEBIAN/md5sums"
echo "deb-control: Depends: $depends"
