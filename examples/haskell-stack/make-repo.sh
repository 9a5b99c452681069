#!/usr/bin/env bash
# Turns examples/haskell-stack/VARIANT (skeleton or impl) into a git repository at DEST.
# Usage: make-repo.sh DEST [skeleton|impl]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
variant="${2:-skeleton}"
exec "$here/../make-repo.sh" "$here" "${1:?usage: make-repo.sh DEST [skeleton|impl]}" "stack: $variant" "$variant"
