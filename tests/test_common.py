"""The one copy of each shared helper: seed streams, device selection, argument checks."""

import numpy as np
import pytest
import torch

from fda_core.common.checks import check_int, check_number
from fda_core.common.devices import resolve_device
from fda_core.common.seeding import derive_seed, generator


def test_seed_streams_are_distinct_and_stable():
    # the tuple hash the loop used before mapped (r, -1) and (r, -2) to one stream: hash(-1) == hash(-2)
    assert hash((0, 3, -1)) == hash((0, 3, -2))
    keys = [(1, r, role, i) for r in range(1, 6) for role in range(3) for i in range(4)]
    seeds = {derive_seed(0, *k) for k in keys}
    assert len(seeds) == len(keys)  # every (round, role, client) has its own stream
    assert derive_seed(0, 1, 2) == derive_seed(0, 1, 2) != derive_seed(1, 1, 2)
    # it is numpy's SeedSequence (the estimator checks' streams keep their values)
    state = np.random.SeedSequence([7, 2, 3]).generate_state(2, dtype=np.uint32)
    assert derive_seed(7, 2, 3) == (int(state[0]) << 31) ^ int(state[1])
    assert torch.equal(torch.rand(3, generator=generator(5, 1)), torch.rand(3, generator=generator(5, 1)))
    with pytest.raises(ValueError, match="seed key #2 must be an integer >= 0"):
        derive_seed(0, 1, -1)
    with pytest.raises(ValueError, match="seed must be an integer >= 0"):
        derive_seed(True)


def test_resolve_device_checks_cuda():
    assert resolve_device("auto").type in ("cpu", "cuda")
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="device"):
        resolve_device("tpu")
    with pytest.raises(ValueError, match="device"):
        resolve_device(3)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA"):
            resolve_device("cuda")


def test_checks_name_the_parameter_and_range():
    assert check_int(np.int64(3), "n", 1) == 3
    with pytest.raises(ValueError, match=r"n must be an integer >= 1, got 0"):
        check_int(0, "n", 1)
    with pytest.raises(ValueError, match="flag must be an integer"):
        check_int(True, "flag")
    assert check_number(0.5, "beta", 0.0, 1.0) == 0.5
    with pytest.raises(ValueError, match=r"beta must be a finite number in \[0, 1\], got 2"):
        check_number(2, "beta", 0.0, 1.0)
    with pytest.raises(ValueError, match=r"in \(0, 1\]"):
        check_number(0.0, "fraction", 0.0, 1.0, lo_open=True)
    with pytest.raises(ValueError, match="finite"):
        check_number(float("nan"), "x")


def test_timings_of_a_quick_run_never_replace_the_default_runs(tmp_path, monkeypatch):
    """Timings go under executed/timings/<stem>/, a quick run's under executed/quick/timings/<stem>/."""
    import pandas as pd

    from fda_core.common import files

    monkeypatch.setattr(files, "project_root", lambda: tmp_path)
    default = files.write_timings("nb", "runs", pd.DataFrame({"seconds": [1.0]}))
    quick = files.write_timings("nb", "runs", pd.DataFrame({"seconds": [2.0]}), quick=True)
    assert default == tmp_path / "executed" / "timings" / "nb" / "runs.csv"
    assert quick == tmp_path / "executed" / "quick" / "timings" / "nb" / "runs.csv"
    assert "1.0" in default.read_text() and "2.0" in quick.read_text()
    with pytest.raises(ValueError, match="plain names"):
        files.timings_path("a/b", "runs")
