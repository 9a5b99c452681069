#!/usr/bin/env bash
# Batch benchmarks, side by side in one run (release build): a batch of N trivial items on 1, 2
# and 4 worker processes (throughput, scaling efficiency), a 1,000-item batch against one of the
# largest size (100,000 items: submit time, coordinator memory, summary latency, rate, cancel),
# and a factory batch rerun with nothing changed against its first run
# (the step cache).
# Usage: scripts/bench-batch.sh [--n N] [--slots S]   (1000, 32)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/provision.sh >/dev/null
cargo build --release -q -p coordinator -p fleet-tests --bins
FLEET_BIN="$PWD/target/release/fleet" target/release/fleet-bench batch "$@"
