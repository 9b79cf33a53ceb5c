#!/bin/sh
# System packages the console's test rigs need (harness/rig/): a real sshd, tmux, debootstrap for the
# systemd rig's root filesystem, procps and util-linux (unshare, mount), iproute2 (network namespaces
# for the link-failure tests). Idempotent: installs only
# what is missing, and refreshes the package index only when something is.
set -eu

PACKAGES="openssh-server openssh-client tmux debootstrap procps util-linux iproute2"

if [ "$(id -u)" -ne 0 ]; then
    echo "install-system-deps.sh: must run as root (apt-get install); try: sudo $0" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-system-deps.sh: apt-get not found; install by hand: $PACKAGES" >&2
    exit 1
fi

missing=""
for pkg in $PACKAGES; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $pkg"
    fi
done

if [ -z "$missing" ]; then
    echo "install-system-deps.sh: all present ($PACKAGES)"
    exit 0
fi

echo "install-system-deps.sh: installing$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update
# shellcheck disable=SC2086  # word splitting of the package list is intended
apt-get install -y --no-install-recommends $missing
