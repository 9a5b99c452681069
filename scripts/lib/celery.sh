# Shared by the benchmarks that compare with Celery (source it; it needs $root and a `log`
# function). `celery_venv` makes target/bench-venv with celery[redis] 5.x and sets $py,
# $bench_py and $celery_version; `celery_start C` starts a prefork worker of C processes on the
# bench queue and waits until it answers (its log in $celery_log); `celery_stop` stops it.

celery_venv() {
  local venv="$root/target/bench-venv"
  py="$venv/bin/python"
  bench_py="$root/bench/celery/chord_bench.py"
  if [ ! -x "$py" ]; then
    log "creating venv $venv"
    python3 -m venv "$venv"
  fi
  if ! "$py" -c 'import celery, redis, sys; sys.exit(0 if celery.VERSION.major == 5 else 1)' 2>/dev/null; then
    log "installing celery[redis]==5.* into $venv"
    "$py" -m pip install -q --disable-pip-version-check 'celery[redis]==5.*'
  fi
  celery_version="$("$py" -c 'import celery; print(celery.__version__)')"
}

celery_worker_pid=""
celery_log=""

celery_start() {
  celery_log="$(mktemp)"
  log "starting the celery $celery_version worker (prefork, concurrency $1)"
  "$py" "$bench_py" worker --concurrency "$1" >"$celery_log" 2>&1 &
  celery_worker_pid=$!
  if ! "$py" "$bench_py" ready --timeout 90 2>>"$celery_log"; then
    log "the celery worker did not become ready; its log:"
    cat "$celery_log" >&2
    return 1
  fi
}

celery_stop() {
  local pid="$celery_worker_pid"
  celery_worker_pid=""
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  [ -z "$celery_log" ] || rm -f "$celery_log"
  celery_log=""
}
