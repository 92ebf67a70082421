#!/bin/bash
# `make test-install`: installability checks (run as root after `make build`).
#
#  1. The package sets are split: as a throwaway non-root user, `make deps-build` passes without
#     apt-get even when a test package is missing, and `make deps` names it and stops.
#  2. `make install DESTDIR=<tmp>` as that non-root user, from the binaries `make build` built
#     (the user gets a copy of the files `install` reads, so the repo may be unreadable for it;
#     CARGO=false makes any rebuild attempt fail): binaries, man pages (`man -l --warnings`
#     renders each without a warning), completions (bash/zsh/fish -n where the shell exists),
#     units, docs (README.md, docs/*.md).
#  3. `make deb`: lintian reports no error (skipped if lintian is absent); the package has its
#     maintainer scripts, copyright and changelog. `dpkg -i` (postinst runs): `man -w nsfast`,
#     every /usr/share/doc/nsfast path a man page names exists,
#     `nsfast --version`, `nsfast probe`, nsfast-cni VERSION, `systemd-analyze verify` of the
#     units and `systemd-analyze security --offline=yes` exposure <= 5.0 for the root units
#     (each skipped with the reason if unavailable); then `dpkg --purge` (prerm, postrm run)
#     leaves none of the package's files behind, nor an enablement link of its units.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
pass=0
fail() { echo "test-install: FAIL: $*" >&2; exit 1; }
ok() { echo "test-install: ok: $*"; pass=$((pass + 1)); }
skip() { echo "test-install: skipped: $*"; }

[ "$(id -u)" = 0 ] || fail "run as root (creates a throwaway user, installs a .deb)"
for b in nsfast vpnrelay nsfast-cni; do [ -x target/release/$b ] || fail "target/release/$b missing: run make build"; done
[[ "$(dpkg-query -W -f='${Status}' nsfast 2>/dev/null || true)" == *'install ok installed'* ]] &&
	fail "a package nsfast is already installed on this machine: remove it first (dpkg --purge nsfast)"

user=nsft-inst$$
work=$(mktemp -d /tmp/nsfast-install-test.XXXXXX)
deb_installed=0
cleanup() {
	[ "$deb_installed" = 1 ] && dpkg --purge nsfast >/dev/null 2>&1 || true
	userdel "$user" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT
trap 'echo "test-install: FAIL: line $LINENO: $BASH_COMMAND" >&2' ERR
useradd -M -d /nonexistent -s /usr/sbin/nologin "$user"
chmod 755 "$work"
as_user() { runuser -u "$user" -- env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/nonexistent "$@"; }

# What `make install` reads, readable by the user (the binaries as built by `make build`).
src=$work/src
mkdir -p "$src/target/release"
cp -r Makefile Cargo.toml README.md docs dist examples scripts "$src/"
cp target/release/nsfast target/release/vpnrelay target/release/nsfast-cni "$src/target/release/"
chmod -R a+rX "$src"

# 1. Package sets.
out=$(as_user make -s -C "$src" deps-build CARGO=true DEB_TEST=nsfast-no-such-package 2>&1) ||
	fail "non-root make deps-build: $out"
grep -q "installing" <<<"$out" && fail "non-root make deps-build tried to install: $out"
ok "non-root make deps-build passes with the build packages present (a test package missing)"
if out=$(as_user make -s -C "$src" deps CARGO=true DEB_TEST=nsfast-no-such-package 2>&1); then
	fail "non-root make deps passed with a package missing: $out"
fi
grep -q "need root.*nsfast-no-such-package" <<<"$out" || fail "make deps without root: $out"
ok "non-root make deps names the missing package and stops"

# 2. make install as the user.
dest=$work/dest
install -d -o "$user" "$dest"
out=$(as_user make -s -C "$src" install DESTDIR="$dest" PREFIX=/usr/local CARGO=false 2>&1) ||
	fail "non-root make install: $out"
grep -q "installed the CNI plugin into /usr/local/lib/cni/nsfast-cni" <<<"$out" || fail "install does not name the CNI path: $out"
ok "non-root make install DESTDIR=$dest"
p=$dest/usr/local
for f in bin/nsfast bin/vpnrelay lib/cni/nsfast-cni; do [ -x "$p/$f" ] || fail "$f missing or not executable"; done
cmp -s "$p/bin/nsfast" target/release/nsfast || fail "installed nsfast differs from target/release/nsfast"
for f in share/man/man8/nsfast.8 share/man/man8/nsfast-pod.8 share/man/man8/nsfast-sockmap.8 \
	share/man/man8/nsfast-sockmap-run.8 share/man/man8/nsfast-vsock.8 share/man/man8/nsfast-bench.8 \
	share/man/man8/nsfast-probe.8 share/man/man8/nsfast-cni.8 share/man/man1/vpnrelay.1 \
	share/bash-completion/completions/nsfast share/bash-completion/completions/vpnrelay \
	share/zsh/vendor-completions/_nsfast share/zsh/vendor-completions/_vpnrelay \
	share/fish/vendor_completions.d/nsfast.fish share/fish/vendor_completions.d/vpnrelay.fish \
	lib/systemd/system/nsfast-sockmap@.service lib/systemd/system/nsfast-vsock-bridge.service \
	lib/systemd/user/vpnrelay@.service share/doc/nsfast/10-nsfast.conflist \
	share/doc/nsfast/nsfast-vsock-bridge.default share/doc/nsfast/bird.conf share/doc/nsfast/README.md \
	share/doc/nsfast/docs/json.md share/doc/nsfast/docs/metrics.md; do
	[ -s "$p/$f" ] || fail "$f missing or empty in the install tree"
done
[ -z "$(find "$dest" ! -user "$user")" ] || fail "files not owned by the installing user: $(find "$dest" ! -user "$user")"
ok "install tree holds binaries, man pages, completions, units, docs"
grep -rq '@BINDIR@' "$p/lib/systemd" && fail "unit with an unsubstituted @BINDIR@"
grep -q '^ExecStart=/usr/local/bin/nsfast sockmap run --slice %i$' "$p/lib/systemd/system/nsfast-sockmap@.service" ||
	fail "nsfast-sockmap@.service ExecStart not pointing at /usr/local/bin"
ok "units point at $(echo /usr/local/bin)"
n=0
for m in "$p"/share/man/man*/*; do
	w=$(MANWIDTH=80 man -l --warnings "$m" 2>&1 >/dev/null) || fail "man -l $m failed: $w"
	[ -z "$w" ] || fail "man -l $m warns: $w"
	# grep -c reads everything: grep -q would SIGPIPE man, and pipefail would call that a failure.
	[ "$(MANWIDTH=80 man -l "$m" 2>/dev/null | grep -c '^NAME')" -ge 1 ] || fail "$m renders without a NAME section"
	for sec in 'EXIT STATUS' ENVIRONMENT; do
		[ "$(MANWIDTH=80 man -l "$m" 2>/dev/null | grep -c "^$sec")" -ge 1 ] || fail "$m has no $sec section"
	done
	n=$((n + 1))
done
ok "$n man pages render without warnings, each with EXIT STATUS and ENVIRONMENT"
for m in man8/nsfast-pod.8 man8/nsfast-pod-add.8 man8/nsfast-cni.8 man1/vpnrelay.1; do
	[ "$(MANWIDTH=80 man -l "$p/share/man/$m" 2>/dev/null | grep -c '^FILES')" -ge 1 ] || fail "$m has no FILES section"
done
ok "the pod, CNI and vpnrelay pages name their FILES"
bash -n "$p/share/bash-completion/completions/nsfast" || fail "bash completion does not parse"
# The completion really completes: subcommands of nsfast.
words=$(bash -c 'source "$1"; COMP_WORDS=(nsfast so); COMP_CWORD=1; COMP_LINE="nsfast so"; COMP_POINT=9; _nsfast nsfast so nsfast; printf "%s\n" "${COMPREPLY[@]}"' _ "$p/share/bash-completion/completions/nsfast")
grep -qx sockmap <<<"$words" || fail "bash completion of 'nsfast so' gave: $words"
ok "bash completion parses and completes 'nsfast so' to sockmap"
# Hidden commands are never offered.
words=$(bash -c 'source "$1"; COMP_WORDS=(nsfast ""); COMP_CWORD=1; COMP_LINE="nsfast "; COMP_POINT=7; _nsfast nsfast "" nsfast; printf "%s\n" "${COMPREPLY[@]}"' _ "$p/share/bash-completion/completions/nsfast")
grep -qx pod <<<"$words" || fail "bash completion of 'nsfast ' gave: $words"
if grep -qx -e bench-worker -e __gen-docs <<<"$words"; then fail "bash completion offers hidden commands: $words"; fi
for f in "$p/share/bash-completion/completions/nsfast" "$p/share/zsh/vendor-completions/_nsfast" "$p/share/fish/vendor_completions.d/nsfast.fish"; do
	if grep -q -e bench-worker -e __gen-docs "$f"; then fail "$f names a hidden command"; fi
done
ok "completions offer no hidden command"
if command -v zsh >/dev/null; then
	zsh -n "$p/share/zsh/vendor-completions/_nsfast" && zsh -n "$p/share/zsh/vendor-completions/_vpnrelay" || fail "zsh completion"
	ok "zsh completions parse"
else
	skip "zsh completion syntax (zsh not installed)"
fi
if command -v fish >/dev/null; then
	fish -n "$p/share/fish/vendor_completions.d/nsfast.fish" || fail "fish completion"
	words=$(fish --no-config -c "source $p/share/fish/vendor_completions.d/nsfast.fish; complete -C 'nsfast so'")
	grep -q '^sockmap' <<<"$words" || fail "fish completion of 'nsfast so' gave: $words"
	ok "fish completion parses and completes 'nsfast so' to sockmap"
else
	skip "fish completion (fish not installed)"
fi

# 3. The Debian package.
out=$(make -s deb 2>&1) || fail "make deb: $out"
deb=$(ls build/nsfast_*.deb | tail -1)
[[ "$(dpkg-deb -f "$deb" Depends)" == *'libc6 (>= '* ]] || fail "Depends lacks libc6: $(dpkg-deb -f "$deb" Depends)"
for f in postinst prerm postrm; do
	dpkg-deb --ctrl-tarfile "$deb" | tar -tvf - "./$f" | grep -q '^-rwxr-xr-x' || fail "$deb: no executable DEBIAN/$f"
done
for f in ./usr/share/doc/nsfast/copyright ./usr/share/doc/nsfast/changelog.gz ./usr/share/man/man8/nsfast.8.gz; do
	dpkg-deb --fsys-tarfile "$deb" | tar -tf - "$f" >/dev/null 2>&1 || fail "$deb: $f missing"
done
ok "the .deb has postinst, prerm, postrm, copyright, changelog.gz, compressed man pages"
if command -v lintian >/dev/null; then
	# lintian warns about running as root on stderr; only its tag lines matter.
	l=$(lintian "$deb" 2>/dev/null) || true
	grep -q '^E: ' <<<"$l" && fail "lintian $deb: $(grep '^E: ' <<<"$l")"
	ok "lintian: no error${l:+ ($(grep -c '^[WI]: ' <<<"$l") warnings/infos: $(grep '^W: ' <<<"$l" | cut -d' ' -f3 | sort -u | paste -sd' '))}"
else
	skip "lintian (not installed: make deps installs it)"
fi
dpkg -i "$deb" >/dev/null || fail "dpkg -i $deb"
deb_installed=1
ok "dpkg -i $deb"
[ "$(man -w nsfast)" = /usr/share/man/man8/nsfast.8.gz ] || fail "man -w nsfast: $(man -w nsfast 2>&1)"
man -w nsfast-pod >/dev/null && man -w nsfast-cni >/dev/null && man -w 1 vpnrelay >/dev/null || fail "man -w nsfast-pod/nsfast-cni/vpnrelay"
ok "man -w finds nsfast, nsfast-pod, nsfast-cni, vpnrelay"
# Every documentation path a man page names is in the package.
n=0
for m in /usr/share/man/man1/vpnrelay*.1.gz /usr/share/man/man8/nsfast*.8.gz; do
	for f in $(zcat "$m" | sed 's/\\-/-/g' | grep -o '/usr/share/doc/nsfast/[A-Za-z0-9_./-]*' | sed 's/[.,]$//' | sort -u); do
		[ -f "$f" ] || fail "$m names $f, which the package lacks"
		n=$((n + 1))
	done
	[ "$(zcat "$m" | sed 's|/usr/share/doc/nsfast/docs/||g' | grep -c 'docs/')" = 0 ] ||
		fail "$m names a docs/ path outside /usr/share/doc/nsfast"
done
[ "$n" -gt 0 ] || fail "no man page names the documentation under /usr/share/doc/nsfast"
ok "the $n documentation paths the man pages name are installed"
v=$(/usr/bin/nsfast --version)
grep -Eq '^nsfast [0-9.]+ \(git [^,]+, bpf sha256 [0-9a-f]{64}\)$' <<<"$v" || fail "nsfast --version: $v"
ok "$v"
/usr/bin/nsfast probe >/dev/null || fail "nsfast probe"
ok "nsfast probe runs"
v=$(CNI_COMMAND=VERSION /usr/lib/cni/nsfast-cni </dev/null)
grep -q '"supportedVersions"' <<<"$v" || fail "nsfast-cni VERSION: $v"
ok "nsfast-cni VERSION: $v"
if command -v systemd-analyze >/dev/null; then
	u=$work/units
	mkdir -p "$u" "$work/xdg"
	cp /usr/lib/systemd/system/nsfast-sockmap@.service "$u/nsfast-sockmap@nsft.slice.service"
	cp /usr/lib/systemd/user/vpnrelay@.service "$u/vpnrelay@br-0123456789ab.service"
	for unit in "$u/nsfast-sockmap@nsft.slice.service" /usr/lib/systemd/system/nsfast-vsock-bridge.service; do
		w=$(timeout 60 systemd-analyze verify "$unit" 2>&1) || fail "systemd-analyze verify $unit: $w"
		[ -z "$w" ] || fail "systemd-analyze verify $unit: $w"
	done
	w=$(XDG_RUNTIME_DIR=$work/xdg timeout 60 systemd-analyze --user verify "$u/vpnrelay@br-0123456789ab.service" 2>&1) ||
		fail "systemd-analyze --user verify vpnrelay@: $w"
	[ -z "$w" ] || fail "systemd-analyze --user verify vpnrelay@: $w"
	ok "systemd-analyze verify: the three units"
	if systemd-analyze --help 2>&1 | grep -q -- '--offline'; then
		for unit in "$u/nsfast-sockmap@nsft.slice.service" /usr/lib/systemd/system/nsfast-vsock-bridge.service; do
			w=$(timeout 60 systemd-analyze security --offline=yes "$unit" 2>&1) || fail "systemd-analyze security $unit: $w"
			e=$(sed -n 's/.*Overall exposure level for [^:]*: \([0-9][0-9.]*\).*/\1/p' <<<"$w")
			[ -n "$e" ] || fail "systemd-analyze security $unit: no exposure level in: $w"
			awk -v e="$e" 'BEGIN { exit !(e <= 5.0) }' || fail "$(basename "$unit"): exposure $e > 5.0: $(grep '✗' <<<"$w")"
			ok "systemd-analyze security: $(basename "$unit") exposure $e <= 5.0"
		done
	else
		skip "systemd-analyze security (this systemd-analyze has no --offline: systemd < 250)"
	fi
else
	skip "systemd-analyze verify and security (systemd-analyze not installed)"
fi
files=$(dpkg -L nsfast | while read -r f; do if [ ! -d "$f" ]; then echo "$f"; fi; done)
nfiles=$(wc -l <<<"$files")
[ "$nfiles" -ge 30 ] || fail "dpkg -L lists only $nfiles files"
# An enablement link as `systemctl enable nsfast-sockmap@nsft.slice` makes: postrm purge removes it.
# (Only where that directory exists already: the test leaves nothing behind.)
link=/etc/systemd/system/multi-user.target.wants/nsfast-sockmap@nsft-inst$$.slice.service
if [ -d "$(dirname "$link")" ]; then ln -s /usr/lib/systemd/system/nsfast-sockmap@.service "$link"; else link=; fi
dpkg --purge nsfast >/dev/null || { [ -z "$link" ] || rm -f "$link"; fail "dpkg --purge nsfast"; }
deb_installed=0
if [ -n "$link" ]; then
	[ ! -L "$link" ] || { rm -f "$link"; fail "enablement link $link left after purge"; }
	ok "dpkg --purge removed the enablement link of nsfast-sockmap@nsft-inst$$.slice"
fi
left=$(while read -r f; do if [ -e "$f" ]; then echo "$f"; fi; done <<<"$files")
[ -z "$left" ] || fail "left after purge: $left"
[ ! -e /usr/share/doc/nsfast ] || fail "/usr/share/doc/nsfast left after purge"
ok "dpkg --purge removed all $nfiles files"

echo "test-install: $pass passed, 0 failed"
