"""The Celery side of the fan-out benchmark: a chord of N no-op tasks joined by one callback.

Run by scripts/bench-fanout.sh with the python of its venv (celery[redis] 5.x); it provisions
nothing itself. Broker: the local RabbitMQ (default vhost, queue ``celery-bench``); result
backend: the local Redis, database 5 (flushed at the start of ``run``).

    python chord_bench.py worker --concurrency 2      # a prefork worker on the bench queue
    python chord_bench.py ready --timeout 60          # waits until a worker answers
    python chord_bench.py run --n 1000 --repeat 3     # prints one JSON line
    python chord_bench.py roundtrip --n 200           # one task at a time: one JSON line
"""

import argparse
import json
import statistics
import sys
import time

import redis
from celery import Celery, chord

BROKER_URL = "amqp://guest:guest@127.0.0.1:5672//"
BACKEND_URL = "redis://127.0.0.1:6379/5"
QUEUE = "celery-bench"

app = Celery("chord_bench", broker=BROKER_URL, backend=BACKEND_URL)
app.conf.update(
    task_default_queue=QUEUE,
    task_default_exchange=QUEUE,
    task_default_routing_key=QUEUE,
    task_acks_late=True,
    worker_prefetch_multiplier=4,
    result_expires=600,
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


@app.task(name="bench.noop")
def noop(i):
    return i


@app.task(name="bench.collect")
def collect(results):
    return len(results)


def worker(concurrency):
    app.worker_main(
        [
            "worker",
            "--pool",
            "prefork",
            "--concurrency",
            str(concurrency),
            "--loglevel",
            "warning",
            "--queues",
            QUEUE,
            "--hostname",
            "chord-bench@%h",
            "--without-gossip",
            "--without-mingle",
        ]
    )


def ready(timeout):
    """Waits until a worker answers a ping and runs one task end to end."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if app.control.ping(timeout=1.0):
                if noop.delay(-1).get(timeout=max(1.0, deadline - time.monotonic())) == -1:
                    return 0
        except Exception as err:  # not up yet: broker, backend or worker
            print(f"chord_bench: waiting for the worker ({err!r})", file=sys.stderr)
        time.sleep(0.5)
    print(f"chord_bench: no worker answered within {timeout} s", file=sys.stderr)
    return 1


def run(n, repeat):
    redis.Redis.from_url(BACKEND_URL).flushdb()
    app.control.purge()
    runs = []
    for _ in range(repeat):
        started = time.perf_counter()
        result = chord(noop.s(i) for i in range(n))(collect.s())
        # The callback's value is the chord's end. `follow_parents=False`: without it the
        # client rescans the whole header group for an error at every event it drains, which
        # costs Celery's client minutes at 10,000 tasks and is no part of the chord's work.
        count = result.get(timeout=600, follow_parents=False)
        runs.append(time.perf_counter() - started)
        assert count == n, f"chord callback counted {count} results, expected {n}"
        result.forget()
    line = {
        "system": "celery-chord",
        "n": n,
        "runs": [round(s, 4) for s in runs],
        "median": round(statistics.median(runs), 4),
    }
    print(json.dumps(line), flush=True)
    return 0


def roundtrip(n):
    """N single tasks one after another, each from ``delay`` to its result (the backend's
    pub/sub tells ``get``); the first ten warm up and are not counted."""
    times = []
    for i in range(n + 10):
        started = time.perf_counter()
        got = noop.delay(i).get(timeout=60)
        took = time.perf_counter() - started
        assert got == i, f"task {i} answered {got}"
        if i >= 10:
            times.append(took)
    times.sort()
    at = lambda q: round(times[round((len(times) - 1) * q)] * 1e3, 3)
    line = {"system": "celery-task", "n": n, "p50_ms": at(0.5), "p95_ms": at(0.95), "min_ms": at(0.0)}
    print(json.dumps(line), flush=True)
    return 0


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    modes = parser.add_subparsers(dest="mode", required=True)
    w = modes.add_parser("worker", help="start a prefork worker on the bench queue")
    w.add_argument("--concurrency", type=int, default=2)
    r = modes.add_parser("ready", help="wait until a worker answers")
    r.add_argument("--timeout", type=float, default=60.0)
    b = modes.add_parser("run", help="run the chord benchmark, print one JSON line")
    b.add_argument("--n", type=int, default=1000)
    b.add_argument("--repeat", type=int, default=3)
    t = modes.add_parser("roundtrip", help="single tasks one at a time, print one JSON line")
    t.add_argument("--n", type=int, default=200)
    args = parser.parse_args(argv)
    if args.mode == "worker":
        worker(args.concurrency)
        return 0
    if args.mode == "ready":
        return ready(args.timeout)
    if args.mode == "roundtrip":
        return roundtrip(args.n)
    return run(args.n, args.repeat)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
