#!/usr/bin/env bash
# Every figure of issue 13 side by side with its anchor, in one run, and the table written into
# BENCHMARKS.md (between its bench-all markers) with this command and the date.
#
#   fan-out of 1,000 and of 10,000 no-op jobs into one join   against a Celery chord (prefork 4)
#   share of the bare broker limit                             against bench_limit's broker loop
#   one job's round trip, submit to result                     against RabbitMQ alone and Celery
#   the container cycle through bollard (cold, warm pool)      against `docker run --rm`
#   the fleet's overhead on a trivial command job              against the container's own life
#   a job's worktree of a 10,000-file repository               against `git clone --local`
#   no-container throughput with 1, 2 and 4 workers            against the broker's limit
#   (--with-100k) a 100,000-branch fan-out: the join, the coordinator's memory
# and then the round trip and the overhead again with s3s-fs (a Rust S3 server,
# scripts/lib/s3s.sh) in place of moto, the tests' Python one: what of those two figures is
# the S3 server's.
#
# Usage: scripts/bench-all.sh [--quick] [--with-100k] [--moto-only] [--no-write]
#   --quick      smaller samples (a check that the whole thing runs; figures are noisier)
#   --moto-only  skip the second S3 server (it is built from crates.io once, ~2.5 minutes)
#   --no-write   print the table only
# Each bench's JSON lines are kept in target/bench-all/results.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
command_line="scripts/bench-all.sh${*:+ $*}"

quick=0 with_100k=0 write=1 second_s3=1
# a run already pointed at another S3 server has no second one to compare
[ -z "${FLEET_TEST_S3_ENDPOINT:-}" ] || second_s3=0
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1; shift ;;
    --with-100k) with_100k=1; shift ;;
    --moto-only) second_s3=0; shift ;;
    --no-write) write=0; shift ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done

if [ "$quick" = 1 ]; then
  fan_small_repeat=1 fan_large=2000 fan_large_repeat=1 rt_n=50 cycles=5 jobs=5
  wt_files=2000 wt_rounds=3 scale_n=2000
else
  fan_small_repeat=5 fan_large=10000 fan_large_repeat=2 rt_n=200 cycles=20 jobs=30
  wt_files=10000 wt_rounds=10 scale_n=10000
fi

# The fleet's configuration for its no-container figures: its best here (BENCHMARKS.md §17's
# sweep of workers × jobs at once), as the chord runs in Celery's best (prefork 4). The bare
# broker loop it is held against keeps 64 jobs unacked, as a worker of 64 jobs at once does.
fan_workers=2 concurrency=64

log() { printf '[bench-all] %s\n' "$*" >&2; }

log "provisioning services"
scripts/provision.sh >/dev/null
log "building the fleet (release)"
cargo build --release -q -p coordinator --bin fleet -p fleet-tests --bin fleet-bench

out_dir="$root/target/bench-all"
mkdir -p "$out_dir"
results="$out_dir/results.jsonl"
: >"$results"
bench() { FLEET_BIN="$root/target/release/fleet" "$root/target/release/fleet-bench" "$@"; }
# keeps a bench's JSON lines (tagged with what ran) and lets its table through to stderr
keep() {
  local tag="$1"
  shift
  local raw="$out_dir/$tag.out"
  "$@" >"$raw"
  { grep -E '^\{.*"(bench|system)":' "$raw" || true; } | while IFS= read -r line; do
    printf '{"tag": "%s", "result": %s}\n' "$tag" "$line"
  done >>"$results"
  cat "$raw" >&2
}

# --- Celery: the chord (its best configuration here, prefork 4) and the single task ---
. scripts/lib/celery.sh
. scripts/lib/s3s.sh
celery_venv
trap 'celery_stop; s3s_stop' EXIT
trap 'exit 130' INT TERM
celery_start 4 || exit 1
log "celery chord: n=1000"
keep celery-1000 "$py" "$bench_py" run --n 1000 --repeat "$fan_small_repeat"
log "celery chord: n=$fan_large"
keep celery-large "$py" "$bench_py" run --n "$fan_large" --repeat "$fan_large_repeat"
celery_stop
celery_start 1 || exit 1
log "celery single tasks: n=$rt_n"
keep celery-task "$py" "$bench_py" roundtrip --n "$rt_n"
# stopped before the fleet side so that each side has the machine to itself
celery_stop

# --- the fleet ---
log "fleet fan-out/join: n=1000"
keep fleet-1000 bench fanout --n 1000 --repeat "$fan_small_repeat" \
  --workers "$fan_workers" --concurrency "$concurrency"
log "fleet fan-out/join: n=1000, the default configuration (2 workers, 8 jobs at once each)"
keep fleet-1000-default bench fanout --n 1000 --repeat "$fan_small_repeat" --workers 2 --concurrency 8
log "fleet fan-out/join: n=$fan_large"
keep fleet-large bench fanout --n "$fan_large" --repeat "$fan_large_repeat" \
  --workers "$fan_workers" --concurrency "$concurrency"
log "round trips (the broker alone, the fleet): n=$rt_n"
keep roundtrip bench roundtrip --n "$rt_n"
for w in 1 2 4; do
  log "no-container throughput against the broker's limit: n=$scale_n workers=$w"
  keep "scale-$w" bench limit --n "$scale_n" --workers "$w" --concurrency "$concurrency"
done
log "container cycle and per-job overhead: cycles=$cycles jobs=$jobs"
keep cycle bench --cycles "$cycles" --jobs "$jobs"
# both sides of the worktree figure on one file system; tmpfs where there is one (ext4 charges
# inode allocation among recently deleted inodes to whichever runs after a deletion)
wt_tmp="${TMPDIR:-/tmp}"
[ ! -d /dev/shm ] || wt_tmp=/dev/shm
log "worktree against git clone --local: files=$wt_files rounds=$wt_rounds (in $wt_tmp)"
keep worktree env TMPDIR="$wt_tmp" "$root/target/release/fleet-bench" worktree \
  --files "$wt_files" --rounds "$wt_rounds"
if [ "$second_s3" = 1 ]; then
  s3s_start
  log "on s3s-fs ($s3s_endpoint): round trips n=$rt_n, per-job overhead jobs=$jobs"
  FLEET_TEST_S3_ENDPOINT="$s3s_endpoint" keep roundtrip-s3s bench roundtrip --n "$rt_n"
  FLEET_TEST_S3_ENDPOINT="$s3s_endpoint" keep cycle-s3s bench --cycles 1 --jobs "$jobs"
  s3s_stop
fi
if [ "$with_100k" = 1 ]; then
  log "a 100,000-branch fan-out"
  keep limit-100k bench limit --n 100000 --workers 2 --concurrency "$concurrency"
fi

table="$out_dir/table.md"
s3="moto on 127.0.0.1:9000 (the tests' server)"
[ -z "${FLEET_TEST_S3_ENDPOINT:-}" ] || s3="$FLEET_TEST_S3_ENDPOINT"
python3 bench/all/table.py "$results" --command "$command_line" --cores "$(nproc)" \
  --celery "$celery_version" --s3 "$s3" >"$table"
cat "$table"
if [ "$write" = 1 ]; then
  python3 bench/all/table.py --splice BENCHMARKS.md "$table"
  log "table written into BENCHMARKS.md"
fi
