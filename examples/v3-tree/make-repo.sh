#!/usr/bin/env bash
# Turns examples/v3-tree/repo into a git repository at DEST.
set -euo pipefail
dest="${1:?usage: make-repo.sh DEST}"
src="$(cd "$(dirname "$0")" && pwd)/repo"
rm -rf "$dest"
mkdir -p "$dest"
cp -r "$src/." "$dest/"
git -C "$dest" init -q -b main
git -C "$dest" add -A
git -C "$dest" -c user.name=fleet -c user.email=fleet@localhost commit -q -m "calc: empty product repo"
echo "$dest"
