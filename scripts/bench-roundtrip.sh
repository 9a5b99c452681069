#!/usr/bin/env bash
# One job's round trip, sequential, on the same RabbitMQ and Redis, in one run: the broker's own
# (a persistent job and its result through quorum queues with confirms), a Celery task
# (`noop.delay(i).get()`), and the fleet (`POST /v1/runs` of one no-op job, then
# `GET /v1/runs/{id}/result?wait_seconds=30`, answered when the run ends), the fleet once on
# moto (the S3 server the tests use) and once on s3s-fs (scripts/lib/s3s.sh).
# Usage: scripts/bench-roundtrip.sh [--n N]   (200)
# Prints each side's JSON line, then a Markdown table.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"

n=200
while [ $# -gt 0 ]; do
  case "$1" in
    --n) n="$2"; shift 2 ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done

log() { printf '[bench-roundtrip] %s\n' "$*" >&2; }

log "provisioning services"
scripts/provision.sh >/dev/null

. scripts/lib/celery.sh
celery_venv
. scripts/lib/s3s.sh
trap 'celery_stop; s3s_stop' EXIT
trap 'exit 130' INT TERM
celery_start 1 || exit 1
log "celery single tasks: n=$n"
celery_line="$("$py" "$bench_py" roundtrip --n "$n" | tail -n 1)"
echo "$celery_line"
# Stopped before the fleet side so that each side has the machine to itself.
celery_stop

log "building the fleet (release)"
cargo build --release -q -p coordinator --bin fleet -p fleet-tests --bin fleet-bench
bench() {
  FLEET_BIN="$root/target/release/fleet" target/release/fleet-bench roundtrip --n "$n" \
    | grep '"bench"' | tail -n 1
}
log "broker and fleet round trips on moto: n=$n"
moto_line="$(bench)"
echo "$moto_line"
s3s_start
log "broker and fleet round trips on s3s-fs: n=$n"
s3s_line="$(FLEET_TEST_S3_ENDPOINT="$s3s_endpoint" bench)"
echo "$s3s_line"
s3s_stop

echo
CELERY_LINE="$celery_line" MOTO_LINE="$moto_line" S3S_LINE="$s3s_line" CORES="$(nproc)" \
CELERY_VERSION="$celery_version" python3 - <<'PY'
import json, os

celery = json.loads(os.environ["CELERY_LINE"])
fleets = {"moto": json.loads(os.environ["MOTO_LINE"]), "s3s-fs": json.loads(os.environ["S3S_LINE"])}
first = fleets["moto"]
print(f"## One job's round trip, sequential, n={first['n']} "
      f"({os.environ['CORES']} cores; celery {os.environ['CELERY_VERSION']}, prefork 1)\n")
print("| path | p50 ms | p95 ms | min ms |")
print("|---|---|---|---|")
def row(name, r):
    print(f"| {name} | {r['p50_ms']:.2f} | {r['p95_ms']:.2f} | {r['min_ms']:.2f} |")
row("RabbitMQ alone: job and result through quorum queues, confirms and acks", first["broker_round_trip"])
row("Celery task: `delay` to `get` (classic queue, Redis backend)", celery)
for s3, f in fleets.items():
    row(f"fleet on {s3}: `POST /v1/runs` to the result (`wait_seconds`)", f["fleet_round_trip"])
    row(f"fleet on {s3}: of which `POST /v1/runs` answered", f["fleet_submit"])
print("\nThe coordinator's commit time per run, by phase (ms):\n")
for s3, f in fleets.items():
    phases = f["coordinator_commit_ms_per_run"]
    print(f"- {s3}: " + ", ".join(f"{k} {v:.2f}" for k, v in phases.items()))
PY
