#!/usr/bin/env bash
# Scale-out of no-container jobs, in one run: a fan-out of N no-op jobs into one join
# (`fleet-bench limit`) with 1, 2 and 4 worker processes and 1 and 2 coordinators, each
# against the broker's own limit measured just before it (persistent messages with confirms
# through quorum queues, `bench_limit.rs`). Efficiency is throughput over the workers' count
# times the one-worker throughput of the same coordinator count.
# Usage: scripts/bench-scale.sh [--n N] [--workers "1 2 4"] [--coordinators "1 2"]
#        (N 10000; the S3 server is s3s-fs, scripts/lib/s3s.sh, unless FLEET_TEST_S3_ENDPOINT
#        names one)
# Prints each configuration's JSON line, then a Markdown table.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"

n=10000
workers="1 2 4"
coordinators="1 2"
while [ $# -gt 0 ]; do
  case "$1" in
    --n) n="$2"; shift 2 ;;
    --workers) workers="$2"; shift 2 ;;
    --coordinators) coordinators="$2"; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done

log() { printf '[bench-scale] %s\n' "$*" >&2; }

log "provisioning services"
scripts/provision.sh >/dev/null
log "building the fleet (release)"
cargo build --release -q -p coordinator --bin fleet -p fleet-tests --bin fleet-bench

. scripts/lib/s3s.sh
trap 's3s_stop' EXIT
trap 'exit 130' INT TERM
if [ -z "${FLEET_TEST_S3_ENDPOINT:-}" ]; then
  s3s_start
  export FLEET_TEST_S3_ENDPOINT="$s3s_endpoint"
fi

lines=()
for c in $coordinators; do
  for w in $workers; do
    log "n=$n workers=$w coordinators=$c"
    line="$(FLEET_BIN="$root/target/release/fleet" target/release/fleet-bench limit \
      --n "$n" --workers "$w" --coordinators "$c" | grep '"bench"' | tail -n 1)"
    echo "$line"
    lines+=("$line")
  done
done

echo
LINES_JSON="$(printf '%s\n' "${lines[@]}")" CORES="$(nproc)" python3 - <<'PY'
import json, os

rows = [json.loads(l) for l in os.environ["LINES_JSON"].splitlines() if l.strip()]
one = {r["coordinators"]: r["fleet_jobs_per_second"] for r in rows if r["workers"] == 1}
print(f"{os.environ['CORES']} cores; n = {rows[0]['n']} no-op jobs into one join per run.\n")
print("| coordinators | workers | fleet jobs/s | broker limit jobs/s | share of the limit | efficiency | CPU ms/job (coordinator / workers / rabbitmq / redis / s3) |")
print("|---|---|---|---|---|---|---|")
for r in rows:
    base = one.get(r["coordinators"])
    eff = r["fleet_jobs_per_second"] / (r["workers"] * base) if base else float("nan")
    cpu = r["cpu_ms_per_job"]
    parts = " / ".join(f"{cpu.get(k, 0):.2f}" for k in ["coordinator", "worker", "rabbitmq", "redis", "s3"])
    print(f"| {r['coordinators']} | {r['workers']} | {r['fleet_jobs_per_second']:.0f} | "
          f"{r['broker_jobs_per_second']:.0f} | {r['fleet_share_of_broker_limit']:.1%} | {eff:.2f} | {parts} |")
PY
