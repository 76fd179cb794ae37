"""Which floating-point kernels made a folder of results: a fingerprint recorded beside committed figures.

Byte-identical results need the same float kernels: MKL and oneDNN pick their code path by the CPU's instruction
set, so a CPU of another family gives other last digits, and every trained number then drifts further (seen on
2026-11-25: an AVX-512-FP16 machine gave notebook 01's σ² = 0.21272190459362486 where the committed
0.21272190437962185 came from). The fingerprint is one such number, computed the same way on every machine:
the target variance σ² of notebook 01's MLP on MNIST-5k digits at its default real-data settings (per-sample
gradients, one torch thread, five seconds). ``fda run`` writes it as :data:`FINGERPRINT_FILE` into every folder
of committed figures it fills (:func:`fda_core.workbook.runner.execute`), so the guard of the committed figures
(``tests/test_committed_figures.py``) compares a notebook byte for byte exactly where this machine's kernels are
those that made its files, and skips, naming both, elsewhere.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

__all__ = ["FINGERPRINT_FILE", "PROBE_SETTINGS", "LEGACY_FINGERPRINT", "fingerprint", "recorded", "probe_value"]

#: the file, in a folder of results, that names the float kernels that made them
FINGERPRINT_FILE = "float_kernels.txt"

#: notebook 01's real-data defaults the probe uses (fixed here, so the fingerprint does not move with them)
PROBE_SETTINGS = {"real_pool": 2500, "real_rotation": 45.0, "real_n_target": 32, "seed": 0}

#: the fingerprint of the machine that made the committed figures before fingerprints were recorded (notebook
#: 01's σ² of the real digits as committed until 2026-11-29, when notebook 01 was regenerated on the AMD EPYC kind
#: with its file): a folder without :data:`FINGERPRINT_FILE` is taken to come from it
LEGACY_FINGERPRINT = "0.21272190437962185"


def probe_value() -> str:
    """The probe, in this process (``repr`` of σ²): call it with one torch thread (:func:`fingerprint` does)."""
    from ..data.gradient_pools import mnist_gradient_models, mnist_pools

    s = PROBE_SETTINGS
    pools = mnist_pools(n_target_pool=s["real_pool"], shift="rotate", shift_amount=s["real_rotation"], seed=s["seed"])
    (real,) = mnist_gradient_models(pools, n_target=s["real_n_target"], seed=s["seed"])
    return repr(float(real.sigma2))


@functools.lru_cache(maxsize=1)
def fingerprint(timeout: float = 300.0) -> str:
    """This machine's fingerprint (module docstring): :func:`probe_value` in a fresh interpreter with one thread
    (thread counts move last digits too), computed once per process."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", __name__], capture_output=True, text=True, env=env,
                         timeout=timeout, check=True)
    return out.stdout.strip().splitlines()[-1]


def recorded(folder: str | os.PathLike) -> str:
    """The fingerprint recorded in ``folder`` (:data:`LEGACY_FINGERPRINT` where none was recorded)."""
    path = Path(folder) / FINGERPRINT_FILE
    return path.read_text().strip() if path.is_file() else LEGACY_FINGERPRINT


if __name__ == "__main__":
    import torch

    torch.set_num_threads(1)
    print(probe_value())
