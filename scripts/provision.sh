#!/usr/bin/env bash
# Provisions everything the integration tests need on a fresh Debian machine.
# Safe to run twice: every step checks before it acts.
#   RabbitMQ, Redis and headless Chromium from Debian's packages, an S3-compatible server (moto_server from PyPI),
#   and the agent images built locally with debootstrap (there is no registry): fleet-agent-py:1,
#   fleet-agent-hs:1 (ghc and QuickCheck, for Haskell projects; FLEET_HS_IMAGE= skips it),
#   fleet-agent-web:1 (headless Chromium for the `browser` tool; FLEET_WEB_IMAGE= skips it) and
#   fleet-agent-sdk:1 (the providers' official Python SDKs; FLEET_SDK_IMAGE= skips it).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
STATE_DIR="${FLEET_STATE_DIR:-/tmp/fleet-services}"
IMAGE="${FLEET_IMAGE:-fleet-agent-py:1}"
HS_IMAGE="${FLEET_HS_IMAGE-fleet-agent-hs:1}"
WEB_IMAGE="${FLEET_WEB_IMAGE-fleet-agent-web:1}"
S3_PORT="${FLEET_S3_PORT:-9000}"
mkdir -p "$STATE_DIR"
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"

log() { printf '[provision] %s\n' "$*"; }

need_pkgs=()
command -v rabbitmq-server >/dev/null || need_pkgs+=(rabbitmq-server)
command -v redis-server >/dev/null || need_pkgs+=(redis-server)
command -v debootstrap >/dev/null || need_pkgs+=(debootstrap)
command -v git >/dev/null || need_pkgs+=(git)
# headless Chromium opens the HTML batch report in the tests (and shoots a screenshot)
command -v chromium >/dev/null || need_pkgs+=(chromium)
# the deployment test brings docker-compose.yml up for real (tests/compose.rs)
command -v docker-compose >/dev/null || need_pkgs+=(docker-compose)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  log "installing ${need_pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  # the package's postinst tries to start the service; policy-rc.d keeps it from doing so
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
  $SUDO chmod +x /usr/sbin/policy-rc.d
  $SUDO apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
  $SUDO rm -f /usr/sbin/policy-rc.d
fi

# --- Redis ---
# Run state lives here: the append-only file is fsynced on every write, so a crash of Redis
# loses no acknowledged transition (ARCHITECTURE.md, "Durability").
if ! redis-cli -p 6379 ping >/dev/null 2>&1; then
  log "starting redis on 127.0.0.1:6379"
  mkdir -p "$STATE_DIR/redis"
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --dir "$STATE_DIR/redis" \
    --appendonly yes --appendfsync always --logfile "$STATE_DIR/redis.log"
elif [ "$(redis-cli -p 6379 config get appendonly | tail -1)" != "yes" ]; then
  log "redis on 6379 runs without its append-only file; restarting it with one"
  redis-cli -p 6379 shutdown nosave >/dev/null 2>&1 || true
  sleep 1
  mkdir -p "$STATE_DIR/redis"
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --dir "$STATE_DIR/redis" \
    --appendonly yes --appendfsync always --logfile "$STATE_DIR/redis.log"
fi

# --- RabbitMQ ---
# Agent jobs may run longer than RabbitMQ's default consumer_timeout (30 min); raise it.
$SUDO mkdir -p /etc/rabbitmq
if ! grep -q consumer_timeout /etc/rabbitmq/rabbitmq.conf 2>/dev/null; then
  $SUDO cp "$here/deploy/rabbitmq.conf" /etc/rabbitmq/rabbitmq.conf
fi
if ! rabbitmqctl -q status >/dev/null 2>&1; then
  log "starting rabbitmq on 127.0.0.1:5672"
  $SUDO rabbitmq-server -detached >/dev/null 2>&1 || true
  for _ in $(seq 1 60); do
    rabbitmqctl -q await_startup >/dev/null 2>&1 && break
    sleep 1
  done
  rabbitmqctl -q status >/dev/null
fi

# --- S3 (moto_server) ---
if ! command -v moto_server >/dev/null; then
  log "installing moto[server] from PyPI"
  python3 -m pip install -q 'moto[server]'
  command -v pyenv >/dev/null && pyenv rehash || true
fi
if ! curl -fs "http://127.0.0.1:$S3_PORT/" >/dev/null 2>&1; then
  log "starting moto_server on 127.0.0.1:$S3_PORT"
  nohup moto_server -H 127.0.0.1 -p "$S3_PORT" >"$STATE_DIR/moto.log" 2>&1 &
  for _ in $(seq 1 60); do curl -fs "http://127.0.0.1:$S3_PORT/" >/dev/null 2>&1 && break; sleep 0.5; done
fi
curl -fs -X PUT "http://127.0.0.1:$S3_PORT/fleet" >/dev/null || true

# --- the agent images ---
"$here/scripts/build-image.sh" "$IMAGE"
images="$IMAGE"
if [ -n "$HS_IMAGE" ]; then
  "$here/scripts/build-image.sh" "$HS_IMAGE"
  images="$images, $HS_IMAGE"
fi
if [ -n "$WEB_IMAGE" ]; then
  "$here/scripts/build-image.sh" "$WEB_IMAGE"
  images="$images, $WEB_IMAGE"
fi
# The providers' official Python SDKs over the agent image (tests/providers: a command agent
# on them through the LLM gateway); FLEET_SDK_IMAGE= skips it.
SDK_IMAGE="${FLEET_SDK_IMAGE-fleet-agent-sdk:1}"
if [ -n "$SDK_IMAGE" ]; then
  "$here/scripts/build-sdk-image.sh" "$SDK_IMAGE"
  images="$images, $SDK_IMAGE"
fi
log "ready: redis 6379, rabbitmq 5672, s3 $S3_PORT, images $images"

# --- the images of docker-compose.yml ---
# All but fleet:local, which holds the fleet binary built after provisioning (tests/compose.rs
# adds it over these in seconds).
"$here/scripts/build-deploy-images.sh" --without-fleet
