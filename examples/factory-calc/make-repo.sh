#!/usr/bin/env bash
# Turns examples/factory-calc/repo into a git repository at DEST (the product repo of the demo).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
exec "$here/../make-repo.sh" "$here" "${1:?usage: make-repo.sh DEST}" "calc: baseline"
