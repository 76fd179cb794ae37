"""Shared fixtures."""

import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """One CPU thread for a module: the shared 2-core machines are oversubscribed, where OpenMP barriers collapse."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture
def fda_dry_run(tmp_path, capsys):
    """``fda run ... --dry-run`` in this process, its output folder under ``tmp_path``: call it with the words after
    ``fda`` (``["run", "04", "-p", ...]``); it returns the exit code and what was written to stderr. It checks the
    notebooks' declared parameters and their ranges, as every run does, without executing anything."""
    from fda_core.workbook.cli import main

    def dry_run(argv: list[str]) -> tuple[int, str]:
        argv = list(argv)
        if "--out" in argv:
            argv[argv.index("--out") + 1] = str(tmp_path / "executed")
        else:
            argv += ["--out", str(tmp_path / "executed")]
        code = main([*argv, "--dry-run"])
        return code, capsys.readouterr().err

    return dry_run
