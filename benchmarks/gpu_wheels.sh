#!/usr/bin/env bash
# Build .whl/ (git-ignored): the wheels the GPU machine lacks, for its Python (3.12), to carry with `run`
# (carry: [".whl"]; benchmarks/gpu_session.sh installs them into /tmp/site). The device has torch, numpy, pandas,
# scipy, matplotlib, scikit-learn; it has no papermill/Jupyter kernel stack, mlxtend (MNIST-5k), POT or SurvSet.
# Carry limit: 64 MiB in all. POT (33 MB) is only needed by notebook 06 (and benchmarks/inb.py's WD), SurvSet by
# notebook 07: its wheel (47 MB) is cut down here to the one table the workbook reads (support2).
# --pot-only: POT alone (33 MB), for benchmarks/inb.py on full MNIST (step inb-full), whose .gpudata/MNIST (12 MB) does
# not fit beside the whole set.
# --slim: without jedi and debugpy (10 MB), which IPython and ipykernel import only where present: a papermill kernel
# runs without them (checked on the 2-core VM with both hidden). `--slim --no-survset` (39 MB) leaves room for
# .gpudata/MNIST (12 MB) beside the notebook stack and POT, so one call can run the benchmarks, inb-full and notebooks.
# Usage: bash benchmarks/gpu_wheels.sh [--no-pot] [--no-survset] [--pot-only] [--slim]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
pot=1; survset=1; stack=1; slim=0
for a in "$@"; do case $a in --no-pot) pot=0 ;; --no-survset) survset=0 ;; --pot-only) stack=0; survset=0 ;; --slim) slim=1 ;;
  *) echo "unknown option $a"; exit 2 ;; esac; done
rm -rf .whl && mkdir -p .whl
dl() { "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
         --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 \
         --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "$@"; }
[ "$stack" = 1 ] && dl papermill==2.7.0 nbclient==0.11.0 nbformat==5.11.1 ipykernel==7.4.0 ipython==9.18.1 jupyter_client==8.10.0 \
   jupyter_core==5.9.1 ipywidgets==8.1.9 jupyterlab_widgets==3.0.17 comm==0.2.3 traitlets==5.16.1 tornado==6.6.1 \
   pyzmq==27.3.0 debugpy==1.8.22 matplotlib_inline==0.2.2 nest_asyncio2==1.7.4 jedi==0.20.1 parso==0.8.7 \
   prompt_toolkit==3.0.53 wcwidth==0.9.4 pexpect==4.9.0 ptyprocess==0.7.0 stack_data==0.6.3 asttokens==3.0.2 \
   executing==2.3.0 pure_eval==0.2.4 ipython_pygments_lexers==1.1.1 jsonschema==4.26.0 \
   jsonschema_specifications==2025.9.1 referencing==0.37.0 rpds_py==2026.9.1 fastjsonschema==2.22.3 \
   platformdirs==4.14.8 entrypoints==0.4.2 tenacity==9.2.1 mlxtend==0.25.0
# POT at the version the set-up pins (constraints.txt), so the device computes WD with the CPU runs' POT
[ "$pot" = 1 ] && dl "POT==$(sed -n 's/^POT==//p' constraints.txt)"
if [ "$survset" = 1 ]; then
  dl SurvSet==0.2.11
  wheel=$(ls .whl/survset-0.2.11-*.whl)
  work=$(mktemp -d)
  (cd "$work" && unzip -q "$OLDPWD/$wheel" \
     && find SurvSet/resources/pickles -type f -name '*.pickle' ! -name support2.pickle -delete \
     && grep -v '^SurvSet/resources/pickles/.*\.pickle,' survset-0.2.11.dist-info/RECORD > RECORD.new \
     && grep '^SurvSet/resources/pickles/support2.pickle,' survset-0.2.11.dist-info/RECORD >> RECORD.new \
     && mv RECORD.new survset-0.2.11.dist-info/RECORD && rm "$OLDPWD/$wheel" && zip -qr "$OLDPWD/$wheel" .)
  rm -rf "$work"
fi
[ "$slim" = 1 ] && rm -f .whl/jedi-*.whl .whl/debugpy-*.whl
du -sh .whl
