#!/usr/bin/env bash
# Turns examples/haskell-stack/VARIANT (skeleton or impl) into a git repository at DEST.
# Usage: make-repo.sh DEST [skeleton|impl]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dest="${1:?usage: make-repo.sh DEST [skeleton|impl]}"
variant="${2:-skeleton}"
rm -rf "$dest"
mkdir -p "$dest"
cp -r "$here/$variant/." "$dest/"
git -C "$dest" init -q -b main
git -C "$dest" add -A
git -C "$dest" -c user.name=fleet -c user.email=fleet@localhost commit -q -m "stack: $variant"
echo "$dest"
