#!/usr/bin/env bash
# The main job on the embedded default: the factory loop (SE -> TR -> PO) in one process, with
# Docker as the sandbox, against the example product repo. No RabbitMQ, Redis or S3 needed.
# Builds the agent image on first use (debootstrap; needs root and Debian's package mirror).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build-image.sh fleet-agent-py:1
cargo build -q -p coordinator
repo="$(mktemp -d)/calc-repo"
examples/factory-calc/make-repo.sh "$repo" >/dev/null
out="${FLEET_OUT:-$PWD/fleet-out}"
target/debug/fleet run \
  --graph graphs/factory/graph.yaml \
  --repo "$repo" \
  --work-order examples/factory-calc/work_order.json \
  --script "${SCRIPT:-examples/factory-calc/script-scope-then-pass.json}" \
  --out "$out"
