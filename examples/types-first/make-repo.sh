#!/usr/bin/env bash
# Turns examples/types-first/repo into a git repository at DEST.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
exec "$here/../make-repo.sh" "$here" "${1:?usage: make-repo.sh DEST}" "stack: empty product repo"
