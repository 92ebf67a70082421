#!/bin/sh
# Debian 12's rootless Docker (docker.io 20.10 with dockerd-rootless.sh, containerd, runc)
# unpacked into build/docker-bookworm with `dpkg -x`: not installed, so no root dockerd or
# containerd service is ever started on the machine. Prints the directory.
set -eu
exec "$(dirname "$0")/fetch-debs.sh" bookworm docker-bookworm docker.io containerd runc
