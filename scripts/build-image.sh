#!/usr/bin/env bash
# Builds an agent image locally (no registry here): a Debian minbase root file system made by
# debootstrap with the image's packages, imported into Docker, then the command agents of
# images/agents/ copied into /usr/local/bin as a layer of their own. Cached by tag; the agents'
# layer is made again whenever images/agents/ changes (the image's `fleet.agents` label), the whole
# image when its package list changes (`fleet.packages`).
#
# The tag names the toolchain (its name before the `:`):
#   fleet-agent-py  python3, pip, pytest, git
#   fleet-agent-hs  ghc with QuickCheck (Debian's libghc-quickcheck2-dev), git; python3 for the
#                   command agents of images/agents/. QuickCheck's own dependencies random and
#                   splitmix are named too: Debian's Haskell packages depend on virtual names
#                   (`libghc-random-dev-1.2.1.1-f840d`) that debootstrap's resolver cannot follow.
#   fleet-agent-web python3, pip, headless chromium (driven by images/agents/fleet-browser over the
#                   DevTools pipe), git; fonts-dejavu-core so screenshots show text; dbus-x11 names
#                   a provider of the virtual dbus-session-bus that GTK's dconf needs (the same
#                   resolver limit as above).
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE="${1:-fleet-agent-py:1}"
case "${IMAGE%%:*}" in
  fleet-agent-py) PACKAGES="python3,python3-pytest,python3-pip,git,ca-certificates" ;;
  fleet-agent-hs) PACKAGES="ghc,libghc-quickcheck2-dev,libghc-random-dev,libghc-splitmix-dev,python3,git,ca-certificates" ;;
  fleet-agent-web) PACKAGES="python3,python3-pip,chromium,dbus-x11,fonts-dejavu-core,git,ca-certificates" ;;
  *) echo "[image] no package list for $IMAGE (known: fleet-agent-py, fleet-agent-hs, fleet-agent-web)" >&2; exit 2 ;;
esac
AGENTS_HASH="$(cd images/agents && find . -type f | sort | xargs sha256sum | sha256sum | cut -c1-16)"

# The command agents, as a layer over the image (docker create, cp, commit: no registry).
add_agents() {
  local cid
  cid="$(docker create "$IMAGE" true)"
  docker cp images/agents/. "$cid:/usr/local/bin/" >/dev/null
  docker commit --change "LABEL fleet.agents=$AGENTS_HASH" "$cid" "$IMAGE" >/dev/null
  docker rm "$cid" >/dev/null
  echo "[image] command agents $AGENTS_HASH added to $IMAGE"
}

PACKAGES_HASH="$(echo "$PACKAGES" | sha256sum | cut -c1-16)"
if docker image inspect "$IMAGE" >/dev/null 2>&1; then
  built="$(docker image inspect -f '{{index .Config.Labels "fleet.packages"}}' "$IMAGE" 2>/dev/null || true)"
  if [ "$built" != "$PACKAGES_HASH" ]; then
    echo "[image] $IMAGE was built from other packages; building it again"
    docker rmi -f "$IMAGE" >/dev/null
  fi
fi
if docker image inspect "$IMAGE" >/dev/null 2>&1; then
  have="$(docker image inspect -f '{{index .Config.Labels "fleet.agents"}}' "$IMAGE" 2>/dev/null || true)"
  if [ "$have" = "$AGENTS_HASH" ]; then
    echo "[image] $IMAGE already present"; exit 0
  fi
  add_agents; exit 0
fi
if ! command -v debootstrap >/dev/null; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  echo "[image] installing debootstrap"
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq debootstrap >/dev/null
fi
ROOTFS="$(mktemp -d /tmp/fleet-rootfs.XXXXXX)"
trap 'rm -rf "$ROOTFS"' EXIT
echo "[image] debootstrap into $ROOTFS"
if ! debootstrap --variant=minbase --include="$PACKAGES" \
  bookworm "$ROOTFS" http://deb.debian.org/debian >/dev/null; then
  echo "[image] debootstrap failed for $IMAGE; its log ends:" >&2
  tail -20 "$ROOTFS/debootstrap/debootstrap.log" >&2 || true
  exit 1
fi
[ -e "$ROOTFS/usr/bin/python3" ] && ln -sf python3 "$ROOTFS/usr/bin/python"
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb
tar -C "$ROOTFS" -c . | docker import -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  -c "LABEL fleet.packages=$PACKAGES_HASH" - "$IMAGE" >/dev/null
echo "[image] built $IMAGE"
add_agents
