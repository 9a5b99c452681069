#!/usr/bin/env bash
# The time to recover from each server fault, from the fault tests' own figures: runs
# tests/server_faults.rs (the fast subset and the --ignored matrix: each server away, paused,
# behind 500 ms of latency each way; every connection dropped) and tests/recovery.rs's Redis
# restart ROUNDS times (default 5), and prints per fault the p50 and worst time from the fault's
# end to the run moving again (its next job published; for the latency rows, the whole run),
# the jobs published beyond the run's own (work redone) and what /healthz said meanwhile.
# A markdown table for docs/reliability.md and BENCHMARKS.md.
#
#   scripts/bench-faults.sh [ROUNDS]
#
# Needs the stack of scripts/provision.sh (RabbitMQ, Redis, moto on their usual ports); only the
# test's own fleet processes go through the fault proxy, so the shared servers are not disturbed.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-5}"
cargo build -q -p coordinator --bins
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
for i in $(seq 1 "$rounds"); do
  echo "round $i of $rounds" >&2
  cargo test -q -p fleet-tests --test server_faults -- --include-ignored --test-threads 1 \
    --nocapture 2>&1 | grep -o 'fault-figure.*' >>"$out" || { echo "server_faults failed" >&2; exit 1; }
  cargo test -q -p fleet-tests --test recovery -- --test-threads 1 --nocapture \
    a_coordinator_works_again 2>&1 | grep -o 'fault-figure.*' >>"$out" || { echo "recovery failed" >&2; exit 1; }
done
python3 - "$out" <<'PY'
import re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    m = re.search(r'fault-figure fault=(\S+) recovered_ms=(\d+) redone_jobs=(\S+) healthz="(.*)"', line)
    if m:
        r = rows.setdefault(m[1], {"ms": [], "redone": [], "seen": set()})
        r["ms"].append(int(m[2])); r["redone"].append(float(m[3])); r["seen"].add(m[4])
print("| fault | runs | p50 | worst | jobs redone (max) | /healthz meanwhile |")
print("|---|---|---|---|---|---|")
for fault, r in sorted(rows.items()):
    ms = sorted(r["ms"])
    print(f"| {fault} | {len(ms)} | {statistics.median(ms)/1000:.2f} s | {ms[-1]/1000:.2f} s "
          f"| {max(r['redone']):g} | {'; '.join(sorted(r['seen']))} |")
PY
