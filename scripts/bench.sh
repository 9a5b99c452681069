#!/usr/bin/env bash
# Benchmarks, side by side in one run (release build): the container cycle through bollard
# against `docker run --rm`, and the fleet's per-job overhead for trivial command jobs.
# Usage: scripts/bench.sh [--cycles N] [--jobs N]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/provision.sh >/dev/null
cargo build --release -q -p coordinator -p fleet-tests --bins
FLEET_BIN="$PWD/target/release/fleet" target/release/fleet-bench "$@"
