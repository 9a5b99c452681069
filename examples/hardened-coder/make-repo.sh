#!/usr/bin/env bash
# Turns examples/hardened-coder/repo into a git repository at DEST.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
exec "$here/../make-repo.sh" "$here" "${1:?usage: make-repo.sh DEST}" "todo: empty product repo"
