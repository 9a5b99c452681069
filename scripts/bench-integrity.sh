#!/usr/bin/env bash
# What the verdict-integrity checks (runner guard, must-fail twins, the spec's own checks in and
# outside the runner) add to a factory item's and a hybrid run's wall time: the same honest
# runs, embedded (`fleet run`, Docker sandbox), with a binary from before the checks and the
# current one, alternating, side by side in one run. Prints a table (median and mean seconds)
# for BENCHMARKS.md.
#
#   FLEET_BEFORE=/path/to/fleet-before scripts/bench-integrity.sh [ROUNDS]
#
# FLEET_BEFORE: a `fleet` binary built from a commit before the checks (e.g. cb4f93f:
# `git worktree add /tmp/before cb4f93f && cargo build -p coordinator --manifest-path
# /tmp/before/Cargo.toml`). The before runs get the inputs without `checks` (that binary
# refuses the field); the after runs get them, so the figure covers everything the checks add.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-5}"
before="${FLEET_BEFORE:?set FLEET_BEFORE to a fleet binary from before the checks}"
cargo build -q -p coordinator
after="$PWD/target/debug/fleet"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

examples/factory-calc/make-repo.sh "$work/calc" >/dev/null
examples/hybrid-stack/make-repo.sh "$work/stack" >/dev/null
python3 - "$work" <<'EOF'
import json, sys
w = sys.argv[1]
wo = json.load(open("examples/factory-calc/work_order.json"))
json.dump(wo, open(f"{w}/wo-before.json", "w"))
wo["checks"] = {
    "setup": "import calc",
    "examples": [{"name": "two_by_five", "check": "assert calc.multiply(2, 5) == 10"}],
    "properties": [
        {"name": "one_more_adds_once",
         "check": "def prop(a: int, b: int):\n    assert calc.multiply(a, b + 1) == calc.multiply(a, b) + a"},
        {"name": "commutes",
         "check": "def prop(a: int, b: int):\n    assert calc.multiply(a, b) == calc.multiply(b, a)"}]}
json.dump(wo, open(f"{w}/wo-after.json", "w"))
inp = json.load(open("examples/hybrid-stack/input.json"))
json.dump(inp, open(f"{w}/in-before.json", "w"))
inp["spec"]["checks"] = {
    "setup": "from stack import Stack",
    "examples": [{"name": "pop_last", "check": "s = Stack()\ns.push(1)\ns.push(2)\nassert s.pop() == 2"}],
    "properties": [{"name": "lifo", "check": "def prop(a: int, b: int):\n    s = Stack()\n    s.push(a)\n    s.push(b)\n    assert s.pop() == b\n    assert s.pop() == a"}]}
json.dump(inp, open(f"{w}/in-after.json", "w"))
EOF

# One timed run: prints its wall seconds; fails the script if the run did not succeed.
timed() {
  local bin="$1" side="$2" kind="$3" out="$work/out-$RANDOM$RANDOM"
  local start end
  start=$(date +%s.%N)
  if [ "$kind" = factory ]; then
    "$bin" run --graph graphs/factory/graph.yaml --repo "$work/calc" \
      --work-order "$work/wo-$side.json" --script examples/factory-calc/script-pass.json \
      --out "$out" >/dev/null 2>"$out.log"
  else
    "$bin" run --graph graphs/hybrid-tdd/graph.yaml --repo "$work/stack" \
      --input "$work/in-$side.json" --script examples/hybrid-stack/script-happy.json \
      --out "$out" >/dev/null 2>"$out.log"
  fi
  end=$(date +%s.%N)
  python3 -c "print(f'{$end - $start:.2f}')"
}

declare -A times
for kind in factory hybrid; do
  for ((i = 0; i < rounds; i++)); do
    times[$kind-before]+="$(timed "$before" before "$kind") "
    times[$kind-after]+="$(timed "$after" after "$kind") "
  done
done

echo "command: FLEET_BEFORE=$before scripts/bench-integrity.sh $rounds ($(date -u +%F), $(nproc) cores)"
echo
echo "| run | before: median (mean) s | after: median (mean) s | added |"
echo "|---|---|---|---|"
for kind in factory hybrid; do
  python3 - "$kind" "${times[$kind-before]}" "${times[$kind-after]}" <<'EOF'
import statistics, sys
kind, b, a = sys.argv[1], [float(x) for x in sys.argv[2].split()], [float(x) for x in sys.argv[3].split()]
mb, ma = statistics.median(b), statistics.median(a)
print(f"| {kind} (honest, {len(b)} rounds) | {mb:.2f} ({statistics.mean(b):.2f}) | {ma:.2f} ({statistics.mean(a):.2f}) | {100 * (ma - mb) / mb:+.1f}% |")
EOF
done
