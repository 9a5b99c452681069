#!/usr/bin/env bash
# Builds the agent image locally (no registry here): a Debian minbase root file system made by
# debootstrap with Python, pytest and git, imported into Docker. Cached by tag.
set -euo pipefail
IMAGE="${1:-fleet-agent-py:1}"
if docker image inspect "$IMAGE" >/dev/null 2>&1; then
  echo "[image] $IMAGE already present"; exit 0
fi
if ! command -v debootstrap >/dev/null; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  echo "[image] installing debootstrap"
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq debootstrap >/dev/null
fi
ROOTFS="$(mktemp -d /tmp/fleet-rootfs.XXXXXX)"
trap 'rm -rf "$ROOTFS"' EXIT
echo "[image] debootstrap into $ROOTFS"
debootstrap --variant=minbase --include=python3,python3-pytest,git,ca-certificates \
  bookworm "$ROOTFS" http://deb.debian.org/debian >/dev/null
ln -sf python3 "$ROOTFS/usr/bin/python"
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb
tar -C "$ROOTFS" -c . | docker import -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' - "$IMAGE" >/dev/null
echo "[image] built $IMAGE"
