#!/bin/sh
# RootlessKit >= 2.0 (for --detach-netns; Debian 12 ships 1.1) from Debian unstable, unpacked
# into build/rootlesskit-sid without touching the system's apt sources. Prints the binary.
set -eu
dir=$("$(dirname "$0")/fetch-debs.sh" sid rootlesskit-sid rootlesskit)
"$dir/usr/bin/rootlesskit" --version >&2
echo "$dir/usr/bin/rootlesskit"
