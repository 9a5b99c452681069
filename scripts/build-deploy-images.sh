#!/usr/bin/env bash
# Builds the images docker-compose.yml runs, locally (no registry here):
#   fleet-base:local      a Debian minbase of the host's suite (debootstrap, `docker import`),
#                         upgraded from the suite's updates and security archives; the one
#                         root file system the others are made on
#   fleet-rabbitmq:local  rabbitmq-server with deploy/rabbitmq.conf (listening on every
#                         interface, logging to the console)
#   fleet-redis:local     redis-server with its append-only file fsynced on every write
#   fleet-s3:local        moto_server (PyPI, in a venv): the S3 server the tests use
#   fleet-runtime:local   git (and ca-certificates from the base): what the fleet binary needs
#   fleet:local           the host-built `fleet` binary (FLEET_BIN, else target/debug/fleet,
#                         else target/release/fleet; built on this same Debian, so glibc
#                         matches) and graphs/, over fleet-runtime
# Each image is made by running a setup script in a container of the image below it, then
# `docker commit`. Each carries a label `fleet.inputs`, a hash of everything it is made from
# (its recipe's text, the files it copies, the image below it): an image whose label matches is
# kept, so a second run takes seconds. The four images over the base are built side by side.
#
#   scripts/build-deploy-images.sh                  every image
#   scripts/build-deploy-images.sh --without-fleet  all but fleet:local (provisioning: the
#                                                   binary is built later)
# FLEET_DEPLOY_REBUILD=1 builds every image again (e.g. to take Debian's security updates).
set -euo pipefail
cd "$(dirname "$0")/.."
WITH_FLEET=1
case "${1:-}" in
  "") ;;
  --without-fleet) WITH_FLEET=0 ;;
  *) echo "usage: $0 [--without-fleet]" >&2; exit 2 ;;
esac
SUITE="$(. /etc/os-release && echo "${VERSION_CODENAME:?no VERSION_CODENAME in /etc/os-release}")"
MIRROR="${FLEET_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SECURITY_MIRROR="${FLEET_DEBIAN_SECURITY_MIRROR:-${MIRROR%/debian}/debian-security}"
# moto's S3 backend and what moto_server needs to serve it (not moto[server]: that pulls in
# every service's dependencies, cfn-lint among them).
S3_REQUIREMENTS="moto[s3]==5.2.1 flask==3.1.3 flask-cors==6.0.2"
LOGS="$(mktemp -d /tmp/fleet-deploy-images.XXXXXX)"
trap 'rm -rf "$LOGS"' EXIT

STARTED=$SECONDS
log() { printf '[deploy-images +%ss] %s\n' "$((SECONDS - STARTED))" "$*"; }
short_hash() { sha256sum | cut -c1-16; }
label_of() { docker image inspect -f '{{index .Config.Labels "fleet.inputs"}}' "$1" 2>/dev/null || true; }
image_id() { docker image inspect -f '{{.Id}}' "$1"; }
is_fresh() { [ -z "${FLEET_DEPLOY_REBUILD:-}" ] && [ "$(label_of "$1")" = "$2" ]; }

# One run at a time on a machine (provisioning and a test may both call this).
exec 9>/tmp/fleet-deploy-images.lock
flock 9

# The files of a folder, hashed by path and content.
tree_hash() { (cd "$1" && find . -type f | LC_ALL=C sort | xargs -d '\n' sha256sum | short_hash); }

# derive IMAGE INPUTS FROM CONTEXT SCRIPT CHANGE...: copies the folder CONTEXT (may be empty) to
# /tmp/ctx of a new container of FROM, runs SCRIPT there with `sh -eu`, and commits the
# container as IMAGE, labelled with INPUTS, with the Dockerfile instructions CHANGE. The image
# IMAGE named before is removed when nothing uses it.
derive() {
  local image="$1" inputs="$2" from="$3" ctx="$4" script="$5" cid old
  shift 5
  local changes=(--change "LABEL fleet.inputs=$inputs")
  for c in "$@"; do changes+=(--change "$c"); done
  cid="$(docker create "$from" sh -euc "$script")"
  if [ -n "$ctx" ]; then docker cp "$ctx/." "$cid:/tmp/ctx" >/dev/null; fi
  if ! docker start -a "$cid"; then
    docker rm -f "$cid" >/dev/null
    return 1
  fi
  old="$(image_id "$image" 2>/dev/null || true)"
  docker commit "${changes[@]}" "$cid" "$image" >/dev/null
  docker rm "$cid" >/dev/null
  if [ -n "$old" ] && [ "$old" != "$(image_id "$image")" ]; then
    docker rmi "$old" >/dev/null 2>&1 || true
  fi
}

APT_INSTALL='apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends'
APT_CLEAN='apt-get clean; rm -rf /var/lib/apt/lists/* /tmp/ctx'

# --- the base: one debootstrap for every image ---
build_base() {
  local inputs="$1" rootfs staged
  if ! command -v debootstrap >/dev/null; then
    local sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
    log "installing debootstrap"
    $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq debootstrap >/dev/null
  fi
  rootfs="$(mktemp -d /tmp/fleet-deploy-rootfs.XXXXXX)"
  log "debootstrap $SUITE into $rootfs"
  if ! debootstrap --variant=minbase --include=ca-certificates "$SUITE" "$rootfs" "$MIRROR" >/dev/null; then
    echo "[deploy-images] debootstrap failed; its log ends:" >&2
    tail -20 "$rootfs/debootstrap/debootstrap.log" >&2 || true
    rm -rf "$rootfs"
    return 1
  fi
  cat >"$rootfs/etc/apt/sources.list" <<EOF
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb $SECURITY_MIRROR $SUITE-security main
EOF
  # No service starts while a package installs (there is no init in a container), no
  # recommended packages, no package files kept.
  printf '#!/bin/sh\nexit 101\n' >"$rootfs/usr/sbin/policy-rc.d"
  chmod +x "$rootfs/usr/sbin/policy-rc.d"
  printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' \
    >"$rootfs/etc/apt/apt.conf.d/90fleet"
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  staged="$(tar -C "$rootfs" -c . | docker import \
    -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    -c 'ENV LANG=C.UTF-8' - )"
  rm -rf "$rootfs"
  derive fleet-base:local "$inputs" "$staged" "" \
    "apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get upgrade -y -qq >/dev/null; $APT_CLEAN" \
    'CMD ["bash"]'
  docker rmi "$staged" >/dev/null 2>&1 || true
}

build_rabbitmq() {
  local inputs="$1" ctx="$LOGS/rabbitmq-ctx"
  mkdir -p "$ctx"
  # The broker settings of deploy/rabbitmq.conf, but on every interface of the container (the
  # file binds 127.0.0.1 for a broker on the host), and the log on the console.
  { grep -v '^listeners\.' deploy/rabbitmq.conf
    printf '%s\n' 'listeners.tcp.default = 5672' 'log.console = true' \
      'log.console.use_colors = off' 'log.file = false'
  } >"$ctx/rabbitmq.conf"
  derive fleet-rabbitmq:local "$inputs" fleet-base:local "$ctx" \
    "$APT_INSTALL rabbitmq-server >/dev/null
     install -o root -g rabbitmq -m 0644 /tmp/ctx/rabbitmq.conf /etc/rabbitmq/rabbitmq.conf
     $APT_CLEAN" \
    'USER rabbitmq' 'WORKDIR /var/lib/rabbitmq' 'ENV HOME=/var/lib/rabbitmq' 'EXPOSE 5672' \
    'CMD ["/usr/lib/rabbitmq/bin/rabbitmq-server"]'
}

build_redis() {
  local inputs="$1" ctx="$LOGS/redis-ctx"
  mkdir -p "$ctx"
  # The append-only file fsynced on every write: a crash loses no acknowledged transition
  # (ARCHITECTURE.md, "Durability"). No password: Redis is reached on the compose network only.
  printf '%s\n' 'bind 0.0.0.0' 'protected-mode no' 'port 6379' 'dir /data' 'save ""' \
    'appendonly yes' 'appendfsync always' >"$ctx/redis.conf"
  derive fleet-redis:local "$inputs" fleet-base:local "$ctx" \
    "$APT_INSTALL redis-server >/dev/null
     install -m 0644 /tmp/ctx/redis.conf /etc/redis/fleet.conf
     install -d -o redis -g redis /data
     $APT_CLEAN" \
    'USER redis' 'WORKDIR /data' 'EXPOSE 6379' 'CMD ["redis-server", "/etc/redis/fleet.conf"]'
}

build_s3() {
  local inputs="$1" ctx="$LOGS/s3-ctx" pip_env=""
  mkdir -p "$ctx"
  # pip in the container trusts what the host trusts (a proxy's authority, say) and uses the
  # host's index, for this build only: the bundle is removed with /tmp/ctx before the commit.
  if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
    cp /etc/ssl/certs/ca-certificates.crt "$ctx/host-ca.crt"
    pip_env="PIP_CERT=/tmp/ctx/host-ca.crt"
  fi
  [ -n "${PIP_INDEX_URL:-}" ] && pip_env="$pip_env PIP_INDEX_URL='$PIP_INDEX_URL'"
  derive fleet-s3:local "$inputs" fleet-base:local "$ctx" \
    "$APT_INSTALL python3 python3-venv >/dev/null
     python3 -m venv /opt/moto
     $pip_env PIP_DISABLE_PIP_VERSION_CHECK=1 /opt/moto/bin/pip install -q --no-cache-dir $S3_REQUIREMENTS
     $APT_CLEAN" \
    'USER nobody' 'ENV PATH=/opt/moto/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    'EXPOSE 9000' 'CMD ["moto_server", "-H", "0.0.0.0", "-p", "9000"]'
}

build_runtime() {
  derive fleet-runtime:local "$1" fleet-base:local "" \
    "$APT_INSTALL git >/dev/null; $APT_CLEAN" 'CMD ["bash"]'
}

build_fleet() {
  local inputs="$1" bin="$2" ctx="$LOGS/fleet-ctx"
  mkdir -p "$ctx"
  # Without its debug information the binary is a fraction of the size.
  strip -o "$ctx/fleet" "$bin" 2>/dev/null || cp "$bin" "$ctx/fleet"
  cp -r graphs "$ctx/graphs"
  derive fleet:local "$inputs" fleet-runtime:local "$ctx" \
    'install -m 0755 /tmp/ctx/fleet /usr/local/bin/fleet
     mkdir -p /opt/fleet && cp -r /tmp/ctx/graphs /opt/fleet/graphs
     rm -rf /tmp/ctx' \
    'WORKDIR /opt/fleet' 'ENTRYPOINT ["fleet"]' 'CMD ["--help"]'
  # Every library the binary links is in the image.
  if docker run --rm --entrypoint ldd fleet:local /usr/local/bin/fleet | grep 'not found'; then
    echo "[deploy-images] fleet:local lacks libraries the binary needs" >&2
    return 1
  fi
}

# recipe NAME: the text of its build function, so a changed recipe builds the image again.
recipe() { declare -f "build_$1" | short_hash; }

base_inputs="$(printf '%s\n' "$SUITE" "$MIRROR" "$SECURITY_MIRROR" "$(recipe base)" "$(declare -f derive)" | short_hash)"
if is_fresh fleet-base:local "$base_inputs"; then
  log "fleet-base:local already present"
else
  build_base "$base_inputs"
  log "built fleet-base:local"
fi
base_id="$(image_id fleet-base:local)"

# The images over the base, side by side; each one's output goes to its log.
names=(rabbitmq redis s3 runtime)
declare -A pids=()
for name in "${names[@]}"; do
  case "$name" in
    rabbitmq) image=fleet-rabbitmq:local; extra="$(sha256sum deploy/rabbitmq.conf)" ;;
    redis) image=fleet-redis:local; extra="" ;;
    s3) image=fleet-s3:local; extra="$S3_REQUIREMENTS" ;;
    runtime) image=fleet-runtime:local; extra="" ;;
  esac
  inputs="$(printf '%s\n' "$base_id" "$(recipe "$name")" "$extra" | short_hash)"
  if is_fresh "$image" "$inputs"; then
    log "$image already present"
    continue
  fi
  log "building $image"
  "build_$name" "$inputs" >"$LOGS/$name.log" 2>&1 &
  pids[$name]=$!
done
failed=0
for name in "${!pids[@]}"; do
  if wait "${pids[$name]}"; then
    log "built $name"
  else
    echo "[deploy-images] building $name failed; its log ends:" >&2
    tail -30 "$LOGS/$name.log" >&2
    failed=1
  fi
done
[ "$failed" = 0 ] || exit 1

if [ "$WITH_FLEET" = 1 ]; then
  bin="${FLEET_BIN:-}"
  if [ -z "$bin" ]; then
    for b in target/debug/fleet target/release/fleet; do
      if [ -x "$b" ]; then bin="$b"; break; fi
    done
  fi
  if [ -z "$bin" ] || [ ! -x "$bin" ]; then
    echo "[deploy-images] no fleet binary (FLEET_BIN, target/debug/fleet, target/release/fleet):" \
      "build it first with cargo build -p coordinator" >&2
    exit 1
  fi
  inputs="$(printf '%s\n' "$(image_id fleet-runtime:local)" "$(recipe fleet)" \
    "$(sha256sum <"$bin")" "$(tree_hash graphs)" | short_hash)"
  if is_fresh fleet:local "$inputs"; then
    log "fleet:local already present ($bin)"
  else
    build_fleet "$inputs" "$bin"
    log "built fleet:local from $bin"
  fi
fi
log "ready"
