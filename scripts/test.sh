#!/usr/bin/env bash
# The test command: provisions RabbitMQ, Redis, S3 (moto) and the agent images (Python and
# Haskell) if needed, builds the `fleet` binary the integration tests start as processes, then
# runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/provision.sh
cargo build --workspace --all-targets
cargo test --workspace -- --test-threads 4
