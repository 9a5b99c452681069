"""The table of scripts/bench-all.sh: every figure of issue 13 beside its anchor and its goal,
and, where a goal is missed, what bounds it, computed from the same run's measurements.

    table.py RESULTS.jsonl --command CMD --cores N --celery VERSION   > table.md
    table.py --splice BENCHMARKS.md table.md     (replaces the text between the markers)
"""

import argparse
import datetime
import json
import sys

BEGIN = "<!-- bench-all:begin -->"
END = "<!-- bench-all:end -->"
PROCESSES = ["coordinator", "worker", "rabbitmq", "redis", "s3"]


def worker_phases(line):
    """The worker's largest phases beside the container, from `worker_phases_ms`."""
    phases = {k: v for k, v in line.get("worker_phases_ms", {}).items() if k != "container"}
    if not phases:
        return ""
    top = sorted(phases.items(), key=lambda kv: -kv[1])[:3]
    return " (" + ", ".join(f"{k} {v:.1f}" for k, v in top) + ")"


def spread(r):
    """How many runs a median stands for, and their range."""
    runs = r.get("runs") or []
    if len(runs) < 2:
        return ""
    return f" (median of {len(runs)} runs, {min(runs):.2f}–{max(runs):.2f} s)"

def load(path):
    by_tag = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                by_tag.setdefault(row["tag"], []).append(row["result"])
    return by_tag


def one(by_tag, tag, **match):
    for r in by_tag.get(tag, []):
        if all(r.get(k) == v for k, v in match.items()):
            return r
    return None


def cpu_per_job(r):
    cpu = r["cpu_ms_per_job"]
    return sum(cpu.get(k, 0.0) for k in PROCESSES), cpu


def cpu_text(r):
    total, cpu = cpu_per_job(r)
    parts = ", ".join(f"{k} {cpu.get(k, 0.0):.2f}" for k in PROCESSES)
    return total, f"{total:.2f} ms CPU per job ({parts})"


def verdict(met):
    return "**met**" if met else "missed"


def render(by_tag, command, cores, celery, s3):
    rows = []  # (figure, goal, measured, anchor, met, bound)
    scale = {w: one(by_tag, f"scale-{w}", bench="limit") for w in (1, 2, 4)}
    busiest = scale.get(2) or scale.get(1)

    for tag, label in (("1000", "1,000"), ("large", None)):
        celery_r = one(by_tag, f"celery-{tag}", system="celery-chord")
        fleet_r = one(by_tag, f"fleet-{tag}", system="fleet-fanout-join (run)")
        submit_r = one(by_tag, f"fleet-{tag}", system="fleet-fanout-join (with fleet submit)")
        if not (celery_r and fleet_r):
            continue
        n = fleet_r["n"]
        ratio = celery_r["median"] / fleet_r["median"]
        measured = (f"{fleet_r['median']:.2f} s ({n / fleet_r['median']:.0f} jobs/s, "
                    f"{fleet_r['workers']} workers × {fleet_r['concurrency']} jobs at once): "
                    f"{ratio:.1f}× Celery")
        if submit_r:
            measured += f"; {submit_r['median']:.2f} s with the `fleet submit` process"
        default_r = one(by_tag, f"fleet-{tag}-default", system="fleet-fanout-join (run)")
        if default_r:
            measured += (f"; the default {default_r['workers']} × {default_r['concurrency']}: "
                         f"{default_r['median']:.2f} s, {celery_r['median'] / default_r['median']:.1f}×")
        bound = ""
        if ratio < 10 and busiest:
            total, text = cpu_text(busiest)
            need = 10 * n / celery_r["median"]
            bound = (f"CPU: the fleet's processes spend {text}; 10× Celery is {need:.0f} jobs/s, "
                     f"{need * total / 1e3:.1f} cores of {cores}")
        rows.append((f"fan-out of {label or f'{n:,}'} no-op jobs into one join",
                     "≥ 10× Celery", measured,
                     f"Celery chord {celery_r['median']:.2f} s{spread(celery_r)}", ratio >= 10, bound))

    if busiest:
        best = max((r for r in scale.values() if r), key=lambda r: r["fleet_share_of_broker_limit"])
        share = best["fleet_share_of_broker_limit"]
        total, text = cpu_text(best)
        bound = ""
        if share < 0.5:
            ceiling = cores * 1e3 / total
            bound = (f"CPU: {text}; {cores} cores carry at most {ceiling:.0f} jobs/s, "
                     f"{ceiling / best['broker_jobs_per_second']:.0%} of the limit")
        rows.append(("no-container throughput, share of the bare broker limit", "≥ 50%",
                     f"{best['fleet_jobs_per_second']:.0f} jobs/s with {best['workers']} workers × "
                     f"{best['concurrency']} jobs at once: {share:.1%}",
                     f"broker alone {best['broker_jobs_per_second']:.0f} jobs/s (quorum queues, confirms)",
                     share >= 0.5, bound))

    rt = one(by_tag, "roundtrip", bench="roundtrip")
    task = one(by_tag, "celery-task", system="celery-task")
    if rt:
        p50 = rt["fleet_round_trip"]["p50_ms"]
        broker = rt["broker_round_trip"]["p50_ms"]
        anchor = f"RabbitMQ alone {broker:.2f} ms"
        if task:
            anchor += f"; Celery task {task['p50_ms']:.2f} ms"
        phases = rt.get("coordinator_commit_ms_per_run", {})
        commit = sum(phases.values())
        bound = ""
        if p50 > 1:
            by_phase = ", ".join(f"{k} {v:.2f}" for k, v in phases.items())
            bound = (f"the broker's own round trip (a job and its result through fsynced quorum "
                     f"queues) is {broker:.2f} ms p50; the coordinator's commits take "
                     f"{commit:.2f} ms per run ({by_phase}: `outbox` holds the end's result "
                     f"files, `mirror` the object store's copy, both written before a client is "
                     f"told)")
        measured = f"{p50:.2f} ms"
        rt2 = one(by_tag, "roundtrip-s3s", bench="roundtrip")
        if rt2:
            p50_2 = rt2["fleet_round_trip"]["p50_ms"]
            measured += f"; {p50_2:.2f} ms on s3s-fs"
            if p50 > 1:
                phases2 = rt2.get("coordinator_commit_ms_per_run", {})
                bound += (f"; on s3s-fs, a Rust S3 server, the same code takes {p50_2:.2f} ms "
                          f"(commits {sum(phases2.values()):.2f} ms per run): "
                          f"{p50 - p50_2:.1f} ms of the {p50:.1f} are moto's")
        rows.append(("one job's round trip, `POST /v1/runs` to its result (p50)", "≤ 1 ms",
                     measured, anchor, p50 <= 1, bound))

    cyc = one(by_tag, "cycle", bench="cycle")
    if cyc:
        met = cyc["warm_ratio"] <= 0.6
        bound = ""
        if not met:
            bound = f"the exec in the container alone {cyc['warm_phases_ms']['exec']:.1f} ms"
        rows.append(("container cycle through bollard (warm pool; cold)", "≤ 0.6× `docker run --rm`",
                     f"{cyc['warm_ms']:.0f} ms: {cyc['warm_ratio']:.2f}×; cold {cyc['cold_ms']:.0f} ms: "
                     f"{cyc['cold_ratio']:.2f}×",
                     f"`docker run --rm` {cyc['cli_ms']:.0f} ms", met, bound))
    warm = one(by_tag, "cycle", bench="per_job", warm=2)
    cold = one(by_tag, "cycle", bench="per_job", warm=0)
    if warm:
        over = warm["overhead_ms"]
        bound = ""
        if over > 10:
            parts = warm.get("parts_ms")
            if parts:
                bound = (f"submit → the job's start {parts['to_job_start']:.1f} ms (the `fleet submit` "
                         f"process, its API calls, the run's creation), the worker outside the "
                         f"container {parts['worker_outside_container']:.1f} ms{worker_phases(warm)}, "
                         f"the job's end → its "
                         f"result seen {parts['end_to_seen']:.1f} ms (result files, Redis commit, "
                         f"final snapshot), all on 2 cores beside the pool's Docker work")
            else:
                bound = ("the `fleet submit` process (graph load, repo pack, upload) and the "
                         "mirror's writes")
        anchor = f"the container's own life {warm['container_ms']:.0f} ms"
        measured = f"{over:.1f} ms with the warm pool (wall {warm['wall_ms']:.0f} ms)"
        if cold:
            measured += (f"; {cold['overhead_ms']:.1f} ms without (wall {cold['wall_ms']:.0f} ms, "
                         f"container {cold['container_ms']:.0f} ms)")
        cpu = cold.get("cpu_ms_per_job") if cold else None
        if over > 10 and cpu:
            fleet = sum(cpu.get(k, 0.0) for k in ("coordinator", "worker", "submit"))
            bound += (f"; the machine's CPU per job without the pool ({sum(cpu.values()):.0f} ms): "
                      f"the fleet's processes {fleet:.1f} (coordinator {cpu.get('coordinator', 0):.1f}, "
                      f"worker {cpu.get('worker', 0):.1f}, `fleet submit` {cpu.get('submit', 0):.1f}), "
                      f"the S3 server {cpu.get('s3', 0):.1f}, RabbitMQ {cpu.get('rabbitmq', 0):.1f}, "
                      f"Redis {cpu.get('redis', 0):.1f}, Docker's daemons {cpu.get('docker', 0):.1f}, "
                      f"the rest (shims, runc, the container, the kernel) {cpu.get('rest', 0):.0f}")
        warm2 = one(by_tag, "cycle-s3s", bench="per_job", warm=2)
        cold2 = one(by_tag, "cycle-s3s", bench="per_job", warm=0)
        if warm2 and cold2:
            measured += (f"; on s3s-fs {warm2['overhead_ms']:.1f} ms with the pool, "
                         f"{cold2['overhead_ms']:.1f} ms without")
            if over > 10:
                parts2 = cold2.get("parts_ms", {})
                bound += (f"; on s3s-fs, a Rust S3 server, without the pool: submit → the job's "
                          f"start {parts2.get('to_job_start', 0):.1f} ms, the job's end → its "
                          f"result seen {parts2.get('end_to_seen', 0):.1f} ms")
        rows.append(("fleet overhead on a trivial command job (wall − container)", "≤ 10 ms",
                     measured, anchor, over <= 10, bound))

    wt = one(by_tag, "worktree", bench="worktree")
    if wt:
        anchor = f"`git clone --local` {wt['clone_ms']:.0f} ms"
        if "shared_ratio" in wt:
            rows.append((f"a read-only job's worktree of a {wt['files']:,}-file repository "
                         f"(the commit's shared checkout)", "≤ 0.2× `git clone --local`",
                         f"{wt['shared_ms']:.1f} ms: {wt['shared_ratio']:.3f}× (made once per "
                         f"commit: {wt['shared_first_ms']:.0f} ms)",
                         anchor, wt["shared_ratio"] <= 0.2, ""))
        commit = ""
        if "commit_private_ms" in wt:
            commit = f"; its commit after one change {wt['commit_private_ms']:.0f} ms"
        if wt.get("layered"):
            # A writing job's worktree is an overlay on the commit's shared checkout.
            met = wt["layered_ratio"] <= 0.2
            measured = (f"{wt['layered_ms']:.1f} ms: {wt['layered_ratio']:.3f}× (an overlay on "
                        f"the commit's shared checkout; its commit after one change "
                        f"{wt['commit_layered_ms']:.0f} ms); without overlays (a checkout of "
                        f"its own) {wt['worker_ms']:.0f} ms: {wt['ratio']:.2f}×{commit}")
        else:
            met = wt["ratio"] <= 0.2
            measured = f"{wt['worker_ms']:.0f} ms: {wt['ratio']:.2f}×{commit} (no overlays here)"
        bound = ""
        if not met:
            bound = (f"the checkout writes every one of the {wt['files']:,} files and the index "
                     f"(git's own clone of them: {wt['clone_ms']:.0f} ms)")
        rows.append((f"a writing job's worktree of a {wt['files']:,}-file repository",
                     "≤ 0.2× `git clone --local`", measured, anchor, met, bound))

    if scale.get(1):
        base = scale[1]["fleet_jobs_per_second"]
        for w in (2, 4):
            r = scale.get(w)
            if not r:
                continue
            eff = r["fleet_jobs_per_second"] / (w * base)
            total, text = cpu_text(r)
            busy = r["fleet_jobs_per_second"] * total / 1e3
            bound = "" if eff >= 0.9 else f"CPU: {text}, {busy:.1f} of {cores} cores busy"
            rows.append((f"scaling efficiency, {w} workers against 1", "≥ 0.9",
                         f"{eff:.2f} ({r['fleet_jobs_per_second']:.0f} against {base:.0f} jobs/s)",
                         f"broker limit {r['broker_jobs_per_second']:.0f} jobs/s; "
                         f"{r['fleet_share_of_broker_limit']:.1%} of it", eff >= 0.9, bound))

    big = one(by_tag, "limit-100k", bench="limit")
    if big:
        rss = big.get("coordinator_peak_rss_mib")
        rows.append(("a 100,000-branch fan-out", "completes, the join fired once",
                     f"{big['fleet_seconds']:.0f} s, {big['fleet_jobs_per_second']:.0f} jobs/s; "
                     f"coordinator peak RSS {rss:.0f} MiB" if rss else f"{big['fleet_seconds']:.0f} s",
                     "the join fired once (checked by the bench)", True, ""))

    today = datetime.date.today().isoformat()
    out = [f"Measured {today} on {cores} cores (Celery {celery}, prefork 4 for the chord, 1 for "
           f"the single task; the fleet's S3 server: {s3}), all in one run of `{command}`. The "
           f"JSON lines behind every figure are in `target/bench-all/results.jsonl`.", "",
           "| figure | goal | fleet | anchor (same run) | met? | what bounds it (measured) |",
           "|---|---|---|---|---|---|"]
    for figure, goal, measured, anchor, met, bound in rows:
        out.append(f"| {figure} | {goal} | {measured} | {anchor} | {verdict(met)} | {bound or '-'} |")
    return "\n".join(out) + "\n"


def splice(doc_path, table_path):
    with open(table_path) as f:
        table = f.read().strip()
    with open(doc_path) as f:
        doc = f.read()
    block = f"{BEGIN}\n{table}\n{END}"
    if BEGIN in doc and END in doc:
        head, rest = doc.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        doc = head + block + tail
    else:
        doc = (doc.rstrip("\n") + "\n\n## Issue 13's figures in one run (`scripts/bench-all.sh`)\n\n"
               + block + "\n")
    with open(doc_path, "w") as f:
        f.write(doc)


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", nargs="?")
    p.add_argument("--command", default="scripts/bench-all.sh")
    p.add_argument("--cores", type=int, default=2)
    p.add_argument("--celery", default="?")
    p.add_argument("--s3", default="moto on 127.0.0.1:9000 (the tests' server)")
    p.add_argument("--splice", nargs=2, metavar=("DOC", "TABLE"))
    a = p.parse_args(argv)
    if a.splice:
        splice(*a.splice)
        return 0
    if not a.results:
        p.error("give the results file")
    sys.stdout.write(render(load(a.results), a.command, a.cores, a.celery, a.s3))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
