#!/usr/bin/env bash
# Builds fleet-agent-sdk:1: fleet-agent-py:1 (scripts/build-image.sh) with the providers'
# official Python SDKs, unmodified, from PyPI (pinned below; installed on the host by pip for the
# image's CPython 3.11 on x86_64, binary wheels only, into /opt/fleet-sdk) and the command agents
# of images/sdk-agents/ in /usr/local/bin. A layer over the base image (docker create, cp,
# commit: no registry); made again when the pins or images/sdk-agents/ change (`fleet.sdk`).
# Needs PyPI (pip download); the jobs that use the image never reach the network.
set -euo pipefail
cd "$(dirname "$0")/.."
BASE="fleet-agent-py:1"
IMAGE="${1:-fleet-agent-sdk:1}"
PINS="anthropic==2.14.0 openai==3.57.0"
HASH="$( (echo "$PINS"; cd images/sdk-agents && find . -type f | sort | xargs sha256sum) | sha256sum | cut -c1-16)"
have="$(docker image inspect -f '{{index .Config.Labels "fleet.sdk"}}' "$IMAGE" 2>/dev/null || true)"
if [ "$have" = "$HASH" ]; then
  echo "[sdk-image] $IMAGE already present"; exit 0
fi
docker image inspect "$BASE" >/dev/null 2>&1 || scripts/build-image.sh "$BASE"
SITE="$(mktemp -d /tmp/fleet-sdk.XXXXXX)"
trap 'rm -rf "$SITE"' EXIT
# shellcheck disable=SC2086
pip install --quiet --disable-pip-version-check --target "$SITE/site" --implementation cp \
  --python-version 3.11 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --only-binary=:all: $PINS
cid="$(docker create "$BASE" true)"
docker cp "$SITE/site/." "$cid:/opt/fleet-sdk/" >/dev/null
docker cp images/sdk-agents/. "$cid:/usr/local/bin/" >/dev/null
docker commit --change "ENV PYTHONPATH=/opt/fleet-sdk" --change "LABEL fleet.sdk=$HASH" "$cid" "$IMAGE" >/dev/null
docker rm "$cid" >/dev/null
echo "[sdk-image] built $IMAGE ($PINS)"
