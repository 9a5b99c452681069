#!/usr/bin/env bash
# The tree benchmark (release build): 1 + 3 + 9 child runs, one agent call each against the fake
# LLM server with a fixed delay; the wall time against the tree's critical path and against the
# thirteen agent jobs one after another.
# Usage: scripts/bench-tree.sh [--delay-ms D] [--concurrency C]   (2000, 6)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/provision.sh >/dev/null
cargo build --release -q -p coordinator -p fleet-tests --bins
FLEET_BIN="$PWD/target/release/fleet" target/release/fleet-bench tree "$@"
