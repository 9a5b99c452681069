#!/usr/bin/env bash
# Fan-out benchmark, on the same RabbitMQ and Redis: N trivial no-op jobs fanned out into one
# join on our fleet, against a Celery chord of N no-op tasks whose callback counts the results.
# Usage: scripts/bench-fanout.sh [--n N] [--repeat R] [--concurrency C]   (1000, 3, 2)
#   --concurrency is the Celery worker's prefork pool size.
# Prints each side's JSON line, then a Markdown table. See bench/celery/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"

n=1000 repeat=3 concurrency=2
while [ $# -gt 0 ]; do
  case "$1" in
    --n) n="$2"; shift 2 ;;
    --repeat) repeat="$2"; shift 2 ;;
    --concurrency) concurrency="$2"; shift 2 ;;
    -h|--help) sed -n '2,6p' "$0"; exit 0 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done

log() { printf '[bench-fanout] %s\n' "$*" >&2; }

log "provisioning services"
scripts/provision.sh >/dev/null

# --- Celery in a venv of its own ---
. scripts/lib/celery.sh
celery_venv
tmp="$(mktemp -d)"
cleanup() {
  celery_stop
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
celery_start "$concurrency" || exit 1

log "celery chord: n=$n repeat=$repeat"
celery_line="$("$py" "$bench_py" run --n "$n" --repeat "$repeat" | tail -n 1)"
echo "$celery_line"

# The worker is stopped before the fleet side so that both sides have the machine to themselves.
cleanup
tmp="$(mktemp -d)"

# --- the fleet side ---
fleet_line=""
fleet_note=""
log "building the fleet (release)"
if ! cargo build --release -q -p fleet-tests --bins -p coordinator; then
  fleet_note="the release build failed; fleet side not run"
elif ! grep -qa 'fanout' target/release/fleet-bench; then
  # the bench before the fanout subcommand ignores unknown arguments and would run its other
  # benchmarks: look for the subcommand in the binary before calling it
  fleet_note="target/release/fleet-bench has no 'fanout' subcommand yet; fleet side not run"
else
  log "fleet fan-out/join: n=$n repeat=$repeat"
  if out="$(FLEET_BIN="$root/target/release/fleet" target/release/fleet-bench fanout \
              --n "$n" --repeat "$repeat" 2>"$tmp/fleet.err")"; then
    fleet_line="$(printf '%s\n' "$out" | grep '"system"' | grep 'fleet-fanout-join' || true)"
    [ -n "$fleet_line" ] || fleet_note="fleet-bench fanout printed no JSON result line"
  else
    fleet_note="fleet-bench fanout failed (exit $?); last lines of its stderr: $(tail -n 5 "$tmp/fleet.err" | tr '\n' ' ')"
  fi
  [ -z "$fleet_line" ] || echo "$fleet_line"
fi
[ -z "$fleet_note" ] || log "$fleet_note"

# --- the table ---
echo
CELERY_LINE="$celery_line" FLEET_LINE="$fleet_line" FLEET_NOTE="$fleet_note" \
CORES="$(nproc)" CONCURRENCY="$concurrency" CELERY_VERSION="$celery_version" python3 - <<'PY'
import json, os

celery = json.loads(os.environ["CELERY_LINE"])
fleets = [json.loads(l) for l in os.environ["FLEET_LINE"].splitlines() if l.strip()]
print(f"## Fan-out of {celery['n']} no-op jobs into one join "
      f"({os.environ['CORES']} cores; celery {os.environ['CELERY_VERSION']}, "
      f"prefork concurrency {os.environ['CONCURRENCY']})\n")
print("| system | n | median s | runs | ratio to celery |")
print("|---|---|---|---|---|")

def row(result, ratio):
    runs = ", ".join(f"{s:.3f}" for s in result["runs"])
    print(f"| {result['system']} | {result['n']} | {result['median']:.3f} | {runs} | {ratio} |")

row(celery, "1.00x")
for fleet in fleets:
    ratio = celery["median"] / fleet["median"] if fleet["median"] > 0 else float("inf")
    row(fleet, f"{ratio:.2f}x")
if fleets:
    f = fleets[0]
    print(f"\nfleet: {f.get('workers')} workers, {f.get('concurrency')} jobs in flight each (async tasks, not processes).")
else:
    print(f"| fleet-fanout-join | - | - | - | not run: {os.environ['FLEET_NOTE']} |")
print("\nratio = celery median / system median (above 1: faster than the Celery chord).")
PY
