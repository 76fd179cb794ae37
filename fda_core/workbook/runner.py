"""Execute one notebook with papermill, writing the executed copy atomically (the ``fda run`` engine).

Executions use the papermill engine ``fda`` (:mod:`.watchdog`): a stalled cell (no reply, kernel idle or
silent for ``stall_timeout`` seconds) never hangs the run; the notebook is re-executed once with a fresh
kernel, and a second stall fails naming the cell. A notebook's ``figures_dir`` outputs are staged
(:mod:`.staging`) and replace the real ones only when the whole notebook succeeded.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .discovery import repo_root
from .staging import Staging, failed_outputs_path, plan_staging
from .stalls import DEFAULT_STALL_TIMEOUT, ENGINE_NAME, KernelStallError

__all__ = ["DEFAULT_KERNEL", "DEFAULT_STALL_TIMEOUT", "ExecutionResult", "failed_path", "failed_outputs_path", "execute"]

#: Default kernel: ``python3`` resolves to the running interpreter's ipykernel.
DEFAULT_KERNEL = "python3"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

# --------------------------------------------------------------------------------------------------
# execution


@dataclass
class ExecutionResult:
    """The outcome of one notebook execution.

    ``status`` is ``"done"``, ``"failed"`` or ``"skipped"``; ``output`` is the executed copy (the
    ``*.failed.ipynb`` copy on failure, when one was written). For failures, ``ename``/``evalue`` are
    the exception name and value, ``cell_index`` the index of the failing cell in the executed copy
    (which has an extra ``injected-parameters`` cell when parameters were given), ``exec_count`` its
    ``In [n]`` number, ``source`` its code and ``traceback`` the kernel's traceback lines. ``stalled``
    is True when the failure is a stalled cell (twice: the run and its one retry); ``retried`` describes
    the stall that made a run (successful or not) start over with a fresh kernel. ``figures_dir`` is the
    destination of the notebook's staged outputs (None when nothing was staged), ``installed`` the files
    moved there on success, and ``failed_outputs`` the folder keeping a failed run's partial outputs.
    """

    notebook: Path
    output: Path | None
    parameters: dict[str, Any] = field(default_factory=dict)
    status: str = "done"
    ename: str | None = None
    evalue: str | None = None
    cell_index: int | None = None
    exec_count: int | None = None
    source: str | None = None
    traceback: list[str] = field(default_factory=list)
    seconds: float = 0.0
    stalled: bool = False
    retried: str | None = None
    figures_dir: Path | None = None
    installed: list[Path] = field(default_factory=list)
    failed_outputs: Path | None = None

    @property
    def ok(self) -> bool:
        """True unless the execution failed."""
        return self.status != "failed"

    def failing_line(self) -> tuple[int, str] | None:
        """``(line number, code)`` of the line of the failing cell that raised, from the traceback."""
        if self.source is None:
            return None
        for entry in self.traceback:
            text = _ANSI.sub("", entry)
            m = re.match(r"\s*Cell\s+In\s*\[\d*\],\s*line\s+(\d+)", text)
            if m:
                lines = self.source.splitlines()
                n = int(m[1])
                return (n, lines[n - 1].strip()) if 0 < n <= len(lines) else None
        return None

    def error_summary(self) -> str:
        """``"cell 3 (In [2]): ValueError: boom"``, or ``""`` when nothing failed."""
        if self.status != "failed":
            return ""
        where = ""
        if self.cell_index is not None:
            where = f"cell {self.cell_index}"
            if self.exec_count is not None:
                where += f" (In [{self.exec_count}])"
            where += ": "
        return f"{where}{self.ename}: {self.evalue}"


def failed_path(output: str | os.PathLike) -> Path:
    """Where the executed copy of a failed run is kept: ``NAME.ipynb`` → ``NAME.failed.ipynb``."""
    out = Path(output)
    return out.with_name(f"{out.stem}.failed.ipynb")


def _escape_braces(path: Path) -> str:
    # papermill formats input/output paths with the parameters (str.format): keep braces literal.
    return str(path).replace("{", "{{").replace("}", "}}")


def _stall_message(exc: KernelStallError) -> str:
    what = f"`{exc.first_line}`" if exc.first_line else ("the kernel_info request" if exc.cell_index is None else "the cell")
    limit = f"{exc.stall_timeout:g} s" if exc.stall_timeout else "the stall limit"
    return (f"{what} stalled twice (the run and one retry with a fresh kernel): {exc.reason}; stall limit {limit}. "
            "If the kernel really stays idle that long without answering, raise the limit with --stall-timeout "
            "SECONDS (fda run / fda sweep) or stall_timeout= (execute, run_sweep); 0 turns the watchdog off.")


def execute(
    notebook: str | os.PathLike,
    output: str | os.PathLike,
    parameters: Mapping[str, Any] | None = None,
    *,
    kernel_name: str | None = DEFAULT_KERNEL,
    cwd: str | os.PathLike | None = None,
    progress_bar: bool | dict[str, Any] = True,
    start_timeout: int = 60,
    execution_timeout: int | None = None,
    stall_timeout: float | None = DEFAULT_STALL_TIMEOUT,
    stage_outputs: bool = True,
    kernel_env: Mapping[str, str] | None = None,
) -> ExecutionResult:
    """Execute ``notebook`` with papermill and write the executed copy to ``output`` atomically.

    The notebook runs into a hidden temp file in ``output``'s folder; on success it is renamed
    (``os.replace``) to ``output`` — so an existing ``output`` always is a complete, successful run —
    and a stale ``*.failed.ipynb`` copy is removed. On failure the partial copy (papermill saves it
    cell by cell, with the traceback) is renamed to :func:`failed_path` and the result carries the
    error; execution errors never raise. ``parameters`` should already be validated
    (:func:`validate_parameters`). ``cwd`` is the kernel's working directory (default: the repository
    root). Unlike papermill's own ``cwd=`` (a process-wide ``os.chdir``), the directory is handed to
    the kernel launch, so several executions may run in threads at once.

    ``stall_timeout`` (seconds; None or 0: off) bounds a stalled cell — no ``execute_reply`` while the
    kernel has been idle, or silent since the request, for that long (:mod:`.watchdog`). A long silent
    computation is not a stall. After a stall the kernel is shut down and the notebook re-executed once
    with a fresh kernel; a second stall gives a failed result (``stalled=True``) naming the cell.
    ``execution_timeout`` (seconds per cell, default none) is papermill's hard limit on any cell.

    ``stage_outputs``: when the notebook declares ``figures_dir``, its outputs go to a staging folder
    next to ``output`` and are moved into the real folder (the given or default ``figures_dir``, resolved
    as the notebook resolves it) file by file with ``os.replace`` only when the whole notebook succeeded;
    after a failure the real folder is untouched and the partial outputs are kept in
    :func:`failed_outputs_path` (see :mod:`.staging`).

    ``progress_bar``: papermill's bar of the cells executed (True, False, or a dict of tqdm keyword arguments, e.g.
    ``desc`` and ``position`` for one bar per notebook run side by side; ``fda run --jobs``).

    ``kernel_env``: variables added to the kernel's environment (e.g. ``OMP_NUM_THREADS`` when several
    notebooks run at once, :func:`.schedule.kernel_threads_env`).
    """
    import papermill
    from papermill.exceptions import PapermillExecutionError

    from . import watchdog  # noqa: F401  (registers the "fda" engine; imported here, not at the top: .stalls)

    src = Path(notebook).resolve()
    dst = Path(output).resolve()
    dst.parent.mkdir(parents=True, exist_ok=True)
    work_dir = Path(cwd).resolve() if cwd is not None else repo_root()
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dst.stem}.", suffix=".tmp.ipynb", dir=dst.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    params = dict(parameters or {})
    result = ExecutionResult(notebook=src, output=None, parameters=params)
    plan = plan_staging(src, params, work_dir) if stage_outputs else None
    staging = Staging.create(plan, dst.parent, dst.stem) if plan is not None else None
    result.figures_dir = plan.destination if plan is not None else None
    start = time.perf_counter()
    try:
        for attempt in (1, 2):
            if staging is not None:
                staging.reset()
            try:
                papermill.execute_notebook(
                    _escape_braces(src),
                    _escape_braces(tmp),
                    parameters=(staging.parameters(params) if staging is not None else params) or None,
                    engine_name=ENGINE_NAME,
                    kernel_name=kernel_name,
                    progress_bar=progress_bar,
                    start_timeout=start_timeout,
                    execution_timeout=execution_timeout,
                    stall_timeout=stall_timeout,
                    kernel_env={**(kernel_env or {}), **(staging.kernel_env() if staging is not None else {})} or None,
                    resources={"metadata": {"path": str(work_dir)}},
                )
            except KernelStallError as exc:
                if attempt == 1:
                    result.retried = exc.describe()
                    print(f"fda: {src.stem}: {exc.describe()}; re-executing the notebook once with a fresh kernel",
                          file=sys.stderr)
                    continue
                result.status, result.stalled = "failed", True
                result.ename, result.evalue = "KernelStallError", _stall_message(exc)
                result.cell_index, result.exec_count, result.source = exc.cell_index, exc.exec_count, exc.source
            except PapermillExecutionError as exc:
                result.status = "failed"
                result.ename, result.evalue = exc.ename, exc.evalue
                result.cell_index, result.exec_count, result.source = exc.cell_index, exc.exec_count, exc.source
                result.traceback = list(exc.traceback or [])
            except Exception as exc:  # kernel died, timed out, missing kernel, unreadable notebook...
                result.status = "failed"
                result.ename = type(exc).__name__
                result.evalue = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            break
    except BaseException:  # KeyboardInterrupt: leave nothing half-written behind
        tmp.unlink(missing_ok=True)
        if staging is not None:
            staging.discard()
        raise
    result.seconds = time.perf_counter() - start
    if result.status == "done" and staging is not None:
        _record_float_kernels(staging, work_dir)
        try:
            result.installed = staging.install()
        except OSError as exc:
            result.installed = list(staging.installed)
            result.status, result.ename = "failed", type(exc).__name__
            result.evalue = (f"the notebook ran, but moving its outputs into {staging.destination} failed: {exc} "
                             f"({len(result.installed)} file(s) already moved)")
    if result.status == "done":
        os.replace(tmp, dst)
        failed_path(dst).unlink(missing_ok=True)
        _remove_tree(failed_outputs_path(dst))
        result.output = dst
    else:
        if tmp.exists() and tmp.stat().st_size > 0:
            os.replace(tmp, failed_path(dst))
            result.output = failed_path(dst)
        else:
            tmp.unlink(missing_ok=True)
        if staging is not None:
            result.failed_outputs = staging.keep(failed_outputs_path(dst))
    return result


def _record_float_kernels(staging: Staging, work_dir: Path) -> None:
    """Stage the float-kernel fingerprint (:mod:`.float_kernels`) with a run's outputs when they go to the
    workbook's committed ``figures/`` folder, so the committed files say which kernels made them. A probe that
    fails stages a fingerprint no machine gives (the guard of the committed figures then skips them)."""
    from ..common.files import project_root
    from .float_kernels import FINGERPRINT_FILE, fingerprint

    figures = (project_root(work_dir) / "figures").resolve()
    if not staging.destination.resolve().is_relative_to(figures):
        return
    try:
        value = fingerprint()
    except Exception as exc:  # noqa: BLE001 - the run's outputs matter more than their fingerprint
        value = f"unknown (the probe failed: {type(exc).__name__})"
        print(f"fda: the float-kernel fingerprint could not be computed ({exc}); recorded as unknown", file=sys.stderr)
    (staging.folder / FINGERPRINT_FILE).write_text(value + "\n")


def _remove_tree(path: Path) -> None:
    import shutil

    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
