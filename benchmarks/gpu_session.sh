#!/usr/bin/env bash
# One lease of a GPU machine: install the carried wheels, then time benchmarks there (issue 17).
# Usage (on the device, repository root): bash benchmarks/gpu_session.sh STEP... ; results go to $OUT (or ./gpu-out).
# Each step has its own time limit so that one slow step cannot eat the whole call; logs are written as they go.
# The wheels the device lacks: build .whl/ first with `bash benchmarks/gpu_wheels.sh` and carry it (carry: [".whl"]);
# the full data sets for nb04full / nb05full: `bash benchmarks/gpu_data.sh` and carry .gpudata.
# Paper-scale notebooks (nb*p) take longer than one call: their finished runs are kept in .gpustore (below), so the
# same step in the next call resumes; NB_LIMIT (seconds) sets their limit, the sum of the walls is the time.
# DEADLINE_S (seconds from the start, default 540) caps every step's limit at what is left of it, so that the logs are
# always packed before the call's own limit (run's timeout_s) kills the script: set timeout_s some 30 s above it.
#
# One call can carry the notebook stack, POT and full MNIST: bash benchmarks/gpu_wheels.sh --slim --no-survset (39 MB),
# bash benchmarks/gpu_data.sh mnist, carry [".whl", ".gpudata/MNIST"] (2026-11-26: 60 MiB with the tree). A lease is
# 900 s of device time, the start (~100 s) included, and a warm machine goes back after 30 s idle: plan one long call.
# Next lease, first call (carry [".whl"]: the wheels from `gpu_wheels.sh --slim`; timeout_s 600, DEADLINE_S=565,
# NB_LIMIT=330). The eighth GPU session's store is gone (2026-11-28: ignored files do not survive a new checkout, and
# 1ac3c50 changed the engine's import closure anyway), so notebooks 05 and 07 start from nothing:
#   gputest-cuda nb05p nb07p   (at the eighth session's pace, 8 workers: notebook 05 about 6 min, notebook 07 about
#   11 min, both extrapolated; 8 workers kept 5-6 runs in flight in those notebooks, docs/performance.md § GPU; the
#   `parallel` step's short sweep under-states it; NB_LIMIT stops a notebook, and a second call with .gpustore resumes it),
#   then the paper-scale notebooks one per call with NB_LIMIT, carrying .gpustore (nb08p: 17 min extrapolated before
#   the ninth session's changes, now batched clients, 2.75x the loop per iteration on an H200, and `workers`; nb06p:
#   notebook 06 at the paper's sizes, never timed on a device: carry .gpudata/MNIST and .gpustore, perhaps two calls).
# The notebook steps 04, 05, 07 and 08 compute WORKERS runs side by side (-p workers; default 8).
# The engine's notebook steps (04, 05, 07) pass BATCHING as -p client_batching (default auto: eager vmap-ed clients);
# BATCHING=compile compiles them (CUDA graphs), which pays for a run of R rounds when R exceeds the break-even
# rounds that this call's fedcomp / fedcompgn step prints (compiling costs its first rounds once per worker process).
# The notebook steps keep their finished runs in .gpustore (STORE), which comes back as store.tgz inside the session's
# archive: `bash benchmarks/gpu_unpack.sh FILES_AT` unpacks both here (logs to results/gpu-runs/, the store into
# .gpustore), and carrying .gpustore lets the next call, or the next lease, resume where this one stopped (runs are
# tied to the code that made them: change the code in a notebook's import closure and its stored runs are recomputed).
set -u
START_S=$(date +%s); DEADLINE_S=${DEADLINE_S:-540}
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
STORE=${STORE:-.gpustore}; mkdir -p "$STORE"
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  # pip's own compilation is one process; compileall -j 0 compiles the bytecode on every core instead (a fresh
  # machine each lease: without .pyc files every kernel and worker process would compile pandas, SciPy, POT... at
  # import where PYTHONDONTWRITEBYTECODE is set, as on the 2-core VMs: docs/performance.md § Compiled bytecode)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 1; }
  t0=$(date +%s); python3 -m compileall -q -j 0 /tmp/site > /dev/null 2>&1; rc=$?
  echo "bytecode of /tmp/site compiled in $(( $(date +%s) - t0 )) s (compileall rc=$rc)"
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
step() {  # step NAME LIMIT_S COMMAND...
  local name=$1 limit=$2; shift 2
  local left=$(( DEADLINE_S - ($(date +%s) - START_S) ))
  if [ "$left" -lt 20 ]; then echo "=== $name skipped: ${left}s left of DEADLINE_S" | tee -a "$OUT/steps.txt"; return; fi
  [ "$left" -lt "$limit" ] && limit=$left
  echo "=== $name (limit ${limit}s): $*"
  local t0=$(date +%s%N)
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; local rc=$?
  local t1=$(date +%s%N)
  printf '=== %s rc=%s wall=%ss\n' "$name" "$rc" "$(( (t1 - t0) / 1000000000 ))" | tee -a "$OUT/steps.txt"
  tail -n 25 "$OUT/$name.log"
}
workers() {  # the notebooks' `workers`: $WORKERS, else 8 (eighth GPU session, H200: 8 workers kept 5-6 runs in flight in
  # notebooks 05 and 07; the `parallel` step's short sweep, dominated by the workers' start-up, is not a guide to it)
  echo "${WORKERS:-8}"
}
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name(0))" | tee -a "$OUT/gpu.txt"
python3 -c "import triton; print('triton', triton.__version__)" 2>&1 | tail -n 1 | tee -a "$OUT/gpu.txt"
for s in "$@"; do
  case $s in
    agg) step agg 120 python3 benchmarks/aggregation.py --device cuda --json "$OUT/agg.json" ;;
    # the layer-wise kernels' forms and block sizes, alone and in a whole fedgp call (benchmarks/segmented_kernels.py)
    kernels) step kernels 150 python3 benchmarks/segmented_kernels.py --device cuda --json "$OUT/kernels.json" ;;
    # the host work of one layer-wise call (torch operator calls, host time on tiny tensors), the library's own path
    hostwork) step hostwork 60 python3 benchmarks/aggregation_host_work.py --device cuda --sources 4 10 --json "$OUT/hostwork.json" ;;
    # aggregation.py again with the configuration whose whole fedgp call was fastest at N = 4 in the kernels step
    agg-best) best=$(python3 -c "import json, sys; r = [x for x in json.load(open(sys.argv[1]))['results'] if x['n_sources'] == 4 and x['row'].endswith(' fedgp')]; print(min(r, key=lambda x: x['median_ms'])['config'])" "$OUT/kernels.json") \
                && echo "agg-best: $best" | tee -a "$OUT/steps.txt" \
                && step agg-best 120 python3 benchmarks/aggregation.py --device cuda --kernel-config "$best" --json "$OUT/agg-best.json" ;;
    # aggregation.py with the coefficients formed by torch operators between the two kernels (the default until
    # 2026-11-26; the default now forms them in a third Triton kernel, LAYERWISE_COEFFICIENTS = "kernel")
    agg-tcoef) step agg-tcoef 120 python3 benchmarks/aggregation.py --device cuda --coefficients torch --json "$OUT/agg-tcoef.json" ;;
    # the tests parametrised over devices, their CUDA cases only (the segmented kernels and the batched clients)
    gputest-cuda) step gputest-cuda 120 python3 -m pytest -q -p no:cacheprovider -k "cuda or gpu" tests/test_segmented.py tests/test_batched_clients.py tests/test_prepared.py tests/test_dirt.py tests/test_translation.py tests/test_stargan.py ;;
    gputest) step gputest 240 python3 -m pytest -q -p no:cacheprovider tests/test_segmented.py tests/test_aggregation.py tests/test_federated.py tests/test_batched_clients.py ;;
    variants) step variants 120 python3 benchmarks/aggregation_variants.py --device cuda --chunks 1024 ;;
    pd) step pd 150 python3 benchmarks/phase_diagram.py --device cuda --json "$OUT/pd.json" ;;
    fed) step fed 120 python3 benchmarks/federated.py --device cuda --json "$OUT/fed.json" ;;
    fedcomp) step fedcomp 240 python3 benchmarks/federated.py --device cuda --compiled --json "$OUT/fedcomp.json" ;;
    # whether compiling the batched objective pays for notebook 04's paper-scale model too (eager: 3.0x on 2026-11-26)
    fedcompgn) step fedcompgn 300 python3 benchmarks/federated.py --device cuda --compiled --model mnist_cnn --norm group --json "$OUT/fedcompgn.json" ;;
    fedbn) step fedbn 150 python3 benchmarks/federated.py --device cuda --model mnist_cnn --json "$OUT/fedbn.json" ;;
    fedgn) step fedgn 150 python3 benchmarks/federated.py --device cuda --model mnist_cnn --norm group --json "$OUT/fedgn.json" ;;
    # runs side by side in worker processes against one at a time (notebook 05's paper-settings runs, 20 rounds)
    parallel) step parallel 240 python3 benchmarks/parallel_runs.py --device cuda --runs 16 --rounds 20 --workers 2 4 8 --json "$OUT/parallel.json" ;;
    fedcpu) step fedcpu 300 python3 benchmarks/federated.py --device cpu --json "$OUT/fedcpu.json" ;;
    nb02) step nb02 150 python3 -m fda_core run 02 -p results_dir "$STORE" -p paper_scale true --out /tmp/executed --no-progress ;;
    # notebooks 04 and 05 with the checks the CPU's main job leaves out (reference_check, the "faithful" section), as before
    nb04p) step nb04p "${NB_LIMIT:-130}" python3 -m fda_core run 04 -p results_dir "$STORE" -p reference_check true -p model mnist_cnn -p rounds 50 -p trials 5 -p workers "$(workers)" -p client_batching "${BATCHING:-auto}" --out /tmp/executed --no-progress ;;
    nb05p) step nb05p "${NB_LIMIT:-150}" python3 -m fda_core run 05 -p results_dir "$STORE" -p sections '["faithful", "label_shift", "ablations"]' -p paper_scale true -p workers "$(workers)" -p client_batching "${BATCHING:-auto}" --out /tmp/executed --no-progress ;;
    # the full data sets, carried as .gpudata (benchmarks/gpu_data.sh): notebook 04 at the paper's scale on full MNIST,
    # notebook 05's paper-settings test on full Fashion-MNIST (as committed under figures/05_semi_synthetic/fashion_mnist)
    nb04full) step nb04full "${NB_LIMIT:-300}" python3 -m fda_core run 04 -p results_dir "$STORE" -p reference_check true -p paper_scale true -p data_root .gpudata -p workers "$(workers)" -p client_batching "${BATCHING:-auto}" --out /tmp/executed --no-progress ;;
    nb05full) step nb05full "${NB_LIMIT:-300}" python3 -m fda_core run 05 -p results_dir "$STORE" -p base fashion_mnist -p data_root .gpudata -p sections '["faithful"]' -p faithful_settings '["paper", "reference"]' -p faithful_trials 3 -p figures_dir /tmp/nb05full -p workers "$(workers)" -p client_batching "${BATCHING:-auto}" --out /tmp/executed --no-progress ;;
    nb06) step nb06 200 python3 -m fda_core run 06 -p results_dir "$STORE" --out /tmp/executed --no-progress ;;
    # notebook 06 at the paper's sizes (full MNIST: carry .gpudata/MNIST) with the paper's metric, Sinkhorn, batched
    # on the device (exact EMD runs on the host: about 0.6 s per pair of 1,000 digits, hours per notebook)
    nb06p) step nb06p "${NB_LIMIT:-300}" python3 -m fda_core run 06 -p results_dir "$STORE" -p paper_scale true -p data_root .gpudata -p wd_method sinkhorn -p workers "$(workers)" --out /tmp/executed --no-progress ;;
    nb07p) step nb07p "${NB_LIMIT:-110}" python3 -m fda_core run 07 -p results_dir "$STORE" -p paper_scale true -p workers "$(workers)" -p client_batching "${BATCHING:-auto}" --out /tmp/executed --no-progress ;;
    # notebook 06's FedStarGAN at the paper's networks: per-step reads (earlier code), the loop and the vmap-ed clients
    stargan) step stargan 120 python3 benchmarks/fedstargan.py --device cuda --json "$OUT/stargan.json" ;;
    dirt) step dirt 150 python3 benchmarks/feddirt.py --device cuda --width 1 --iterations 100 --repeats 3 --json "$OUT/dirt.json" ;;
    nb08p) step nb08p "${NB_LIMIT:-200}" python3 -m fda_core run 08 -p results_dir "$STORE" -p paper_scale true -p workers "$(workers)" --out /tmp/executed --no-progress ;;
    # notebook 06's held-out WD: exact EMD on the host, Sinkhorn on the host (as before `device`) and on the GPU; at
    # notebook 06's default sizes, then at the paper's (the whole MNIST test file: carry .gpudata/MNIST)
    wd) step wd 120 python3 benchmarks/wasserstein.py --device cuda --json "$OUT/wd.json" ;;
    wd-full) step wd-full 300 python3 benchmarks/wasserstein.py --device cuda --data-root .gpudata --n-per-class 0 --forms emd device --json "$OUT/wd-full.json" ;;
    inb) step inb 170 python3 benchmarks/inb.py --device cuda --threads 0 --json "$OUT/inb.json" ;;
    # the paper's size: 1,000 digits per class of full MNIST (carry .gpudata/MNIST and POT: gpu_wheels.sh --pot-only)
    inb-full) step inb-full 240 python3 benchmarks/inb.py --device cuda --threads 0 --n-per-class 1000 --data-root .gpudata --no-reference --json "$OUT/inb-full.json" ;;
    inb-paper) step inb-paper 170 python3 benchmarks/inb.py --device cuda --threads 0 --n-per-class 499 --no-reference --json "$OUT/inb-paper.json" ;;
    *) echo "unknown step $s"; exit 2 ;;
  esac
done
# what the result store holds, with modification times (seconds): how far a paper-scale notebook got, run by run
ls -lR --time-style=+%s results "$STORE" > "$OUT/results-ls.txt" 2>/dev/null
# the store itself, for the next call to carry (one returned file holds at most 16 MiB)
if [ -n "$(ls -A "$STORE")" ]; then
  tar czf /tmp/store.tgz -C "$STORE" .
  if [ "$(stat -c %s /tmp/store.tgz)" -lt 15000000 ]; then mv /tmp/store.tgz "$OUT/store.tgz"
  else echo "=== store.tgz left behind: $(stat -c %s /tmp/store.tgz) bytes" | tee -a "$OUT/steps.txt"; fi
fi
# the device returns at most 8 files: pack everything into one archive
(cd "$OUT" && tar czf /tmp/gpu-session.tgz . && find . -mindepth 1 -delete && mv /tmp/gpu-session.tgz .)

