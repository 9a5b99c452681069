#!/usr/bin/env bash
# Builds a small SWE-bench-style dataset from a real package's published source:
#   scripts/build-swe-dataset.sh OUT_DIR [--cache DIR]
#
# Downloads toolz 1.2.0's sdist from PyPI (name, version and sha256 pinned in
# scripts/swe_dataset.py; cached in --cache, default $FLEET_SWE_CACHE or ~/.cache/fleet-swe),
# makes a git mirror of it (OUT_DIR/mirrors/pypi__toolz, bare), injects one real bug per
# instance as its own base commit, and writes:
#   OUT_DIR/dataset.jsonl   SWE-bench instances (instance_id, repo, base_commit, patch,
#                           test_patch, problem_statement, FAIL_TO_PASS, PASS_TO_PASS, ...)
#   OUT_DIR/scripted.jsonl  each instance once per scripted agent (gold, wrong, scope,
#                           testfile), the agent inline as `script`
#   OUT_DIR/expected.json   the verdict and ended stage each scripted item must get
#   OUT_DIR/scripts/<instance>/<agent>.json  the scripted agents, for `--script`
# Only python3 (standard library) and git are used. The package itself is never shipped here.
#
#   fleet batch submit OUT_DIR/scripted.jsonl --mirror-dir OUT_DIR/mirrors --max-attempts 1
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
command -v python3 >/dev/null || { echo "build-swe-dataset: python3 is required" >&2; exit 2; }
command -v git >/dev/null || { echo "build-swe-dataset: git is required" >&2; exit 2; }
exec python3 "$here/swe_dataset.py" "$@"
