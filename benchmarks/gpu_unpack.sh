#!/usr/bin/env bash
# Unpack what one device call of benchmarks/gpu_session.sh brought back (its gpu-session.tgz, in the folder the device
# tool names as files_at): the logs and JSON files into results/gpu-runs/NAME (git-ignored), and the notebooks' result
# store (store.tgz inside it, when a notebook step ran) into .gpustore, which the next call carries (carry
# [".gpustore", ...]) to resume the paper-scale notebooks where this one stopped.
# Usage: bash benchmarks/gpu_unpack.sh FILES_AT [NAME]   (NAME: default the current UTC time, YYYYmmdd-HHMMSS)
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: bash benchmarks/gpu_unpack.sh FILES_AT [NAME]" >&2; exit 2; }
archive="$1/gpu-session.tgz"
[ -f "$archive" ] || { echo "no gpu-session.tgz in $1" >&2; exit 2; }
dest="results/gpu-runs/${2:-$(date -u +%Y%m%d-%H%M%S)}"
[ -e "$dest" ] && { echo "$dest exists: give another NAME" >&2; exit 2; }
mkdir -p "$dest" && tar xzf "$archive" -C "$dest"
echo "logs: $dest ($(ls "$dest" | wc -l) files)"
if [ -f "$dest/store.tgz" ]; then
  mkdir -p .gpustore && tar xzf "$dest/store.tgz" -C .gpustore
  echo "store: .gpustore ($(find .gpustore -type f | wc -l) files, $(du -sh .gpustore | cut -f1)); carry it next call"
fi
