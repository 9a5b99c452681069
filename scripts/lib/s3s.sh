# A second S3 server for the benchmarks, beside moto (source it; it needs $root and a `log`
# function): s3s-fs from crates.io (a Rust S3 server over a folder), built once into
# target/bench-tools. `s3s_start` serves a fresh folder with the bucket `fleet` on
# 127.0.0.1:$S3S_PORT (9100) and sets $s3s_endpoint; `s3s_stop` stops it and removes the folder.
# 0.14.1 is the last release that builds with this machine's rustc (1.95).

S3S_PORT="${S3S_PORT:-9100}"
s3s_pid=""
s3s_dir=""
s3s_endpoint=""

s3s_start() {
  local bin="$root/target/bench-tools/bin/s3s-fs"
  if [ ! -x "$bin" ]; then
    log "building s3s-fs 0.14.1 into target/bench-tools (once)"
    cargo install -q s3s-fs --version 0.14.1 --features binary --root "$root/target/bench-tools"
  fi
  s3s_dir="$(mktemp -d)"
  mkdir -p "$s3s_dir/fleet"
  "$bin" --host 127.0.0.1 --port "$S3S_PORT" --access-key test --secret-key test "$s3s_dir" \
    >"$s3s_dir.log" 2>&1 &
  s3s_pid=$!
  for _ in $(seq 1 50); do
    if curl -s -o /dev/null "http://127.0.0.1:$S3S_PORT/"; then
      s3s_endpoint="http://127.0.0.1:$S3S_PORT"
      return 0
    fi
    sleep 0.1
  done
  log "s3s-fs did not start; its log:"
  cat "$s3s_dir.log" >&2
  return 1
}

s3s_stop() {
  if [ -n "$s3s_pid" ]; then
    kill "$s3s_pid" 2>/dev/null || true
    wait "$s3s_pid" 2>/dev/null || true
  fi
  [ -z "$s3s_dir" ] || rm -rf "$s3s_dir" "$s3s_dir.log"
  s3s_pid="" s3s_dir="" s3s_endpoint=""
}
