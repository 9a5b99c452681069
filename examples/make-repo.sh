#!/usr/bin/env bash
# Turns an example's `repo` folder (or the folder FOLDER of it) into a git repository at DEST,
# with one commit.
# Usage: examples/make-repo.sh EXAMPLE_DIR DEST MESSAGE [FOLDER]
set -euo pipefail
src="${1:?usage: make-repo.sh EXAMPLE_DIR DEST MESSAGE [FOLDER]}/${4:-repo}"
dest="${2:?usage: make-repo.sh EXAMPLE_DIR DEST MESSAGE}"
message="${3:?usage: make-repo.sh EXAMPLE_DIR DEST MESSAGE}"
rm -rf "$dest"
mkdir -p "$dest"
cp -r "$src/." "$dest/"
git -C "$dest" init -q -b main
git -C "$dest" add -A
git -C "$dest" -c user.name=fleet -c user.email=fleet@localhost commit -q -m "$message"
echo "$dest"
