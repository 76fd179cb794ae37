"""Batch re-execution of one notebook over parameter sets (``fda sweep``): sweep files, executed-copy
names, planning (validation before anything runs) and execution, several at a time."""

from __future__ import annotations

import concurrent.futures
import hashlib
import itertools
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .discovery import NotebookError, ParameterError, read_yaml
from .parameters import _short, notebook_parameters, validate_parameters
from .runner import DEFAULT_KERNEL, DEFAULT_STALL_TIMEOUT, ExecutionResult, execute

__all__ = ["load_parameter_sets", "sweep_output_name", "SweepItem", "plan_sweep", "run_sweep"]

_MAX_NAME = 150

# --------------------------------------------------------------------------------------------------
# sweeps


def load_parameter_sets(spec: Any) -> list[dict[str, Any]]:
    """Parameter sets from a sweep specification (a YAML file path, or the loaded object).

    Accepted shapes:

    * a list of mappings — each one parameter set;
    * a mapping ``name -> value``: list values are grid axes, scalar values are fixed for every set;
      the sets are the cartesian product in the given key order (to fix a list-valued parameter,
      wrap it: ``xs: [[1, 2]]``);
    * ``{grid: {...}}`` (the mapping above) or ``{sets: [...]}`` (the list above).

    Raises :class:`NotebookError` for any other shape, an empty axis or a non-string name.
    """
    if isinstance(spec, (str, os.PathLike)):
        spec = read_yaml(spec, "sweep file")
    if isinstance(spec, dict) and len(spec) == 1:
        (key, inner), = spec.items()
        if key == "grid" and isinstance(inner, dict):
            spec = inner
        elif key == "sets" and isinstance(inner, list):
            spec = inner
    if isinstance(spec, list):
        sets = []
        for i, item in enumerate(spec):
            if not isinstance(item, dict):
                raise NotebookError(f"sweep set #{i + 1} is {type(item).__name__} {_short(item)}, not a mapping name: value")
            sets.append(dict(item))
    elif isinstance(spec, dict):
        axes: list[list[Any]] = []
        for name, values in spec.items():
            if isinstance(values, list):
                if not values:
                    raise NotebookError(f"sweep axis {name!r} has no values")
                axes.append(values)
            else:
                axes.append([values])
        sets = [dict(zip(spec.keys(), combo)) for combo in itertools.product(*axes)]
    else:
        raise NotebookError(
            "a sweep file holds a list of parameter sets, a mapping name -> list of values (grid), "
            f"{{grid: {{...}}}} or {{sets: [...]}}; got {type(spec).__name__}"
        )
    for s in sets:
        bad = [k for k in s if not isinstance(k, str)]
        if bad:
            raise NotebookError(f"parameter names must be strings, got {bad[0]!r}")
    if not sets:
        raise NotebookError("the sweep holds no parameter sets")
    return sets


def _safe_value(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        text = ",".join(_safe_value(v) for v in value)
    elif isinstance(value, dict):
        text = ",".join(f"{_safe_value(k)}-{_safe_value(v)}" for k, v in value.items())
    else:
        text = str(value)
    text = re.sub(r"[^A-Za-z0-9._,+\-]+", "_", text)
    return text or "_"


def sweep_output_name(stem: str, params: Mapping[str, Any], order: Sequence[str] | None = None) -> str:
    """File name of one sweep execution: ``<stem>__<name>=<value>__...ipynb``.

    Names follow ``order`` (the notebook's declaration order), then the remaining keys sorted; values
    are made filename-safe (lists joined by commas, other characters replaced by ``_``). A name longer
    than ~150 characters is cut and ends with an 8-character hash of the full parameter set. An empty
    set gives ``<stem>__defaults.ipynb``.
    """
    known = [k for k in (order or []) if k in params]
    keys = known + sorted(k for k in params if k not in known)
    if not keys:
        return f"{stem}__defaults.ipynb"
    base = stem + "".join(f"__{_safe_value(k)}={_safe_value(params[k])}" for k in keys)
    if len(base) + len(".ipynb") > _MAX_NAME:
        digest = hashlib.sha1(json.dumps({k: params[k] for k in keys}, sort_keys=True, default=str).encode()).hexdigest()[:8]
        base = base[: _MAX_NAME - len(".ipynb") - 10] + "__" + digest
    return base + ".ipynb"


@dataclass
class SweepItem:
    """One planned execution of a sweep: its (validated) parameters and executed-copy path."""

    parameters: dict[str, Any]
    output: Path

    @property
    def done(self) -> bool:
        """True when the executed copy exists (it is only renamed into place on success)."""
        return self.output.exists()


def plan_sweep(
    notebook: str | os.PathLike,
    sets: Sequence[Mapping[str, Any]],
    out_dir: str | os.PathLike,
    *,
    fixed: Mapping[str, Any] | None = None,
) -> list[SweepItem]:
    """Validate every set (typed values, plus ``fixed`` values already validated, e.g. from ``-p``)
    and name its executed copy. Raises :class:`ParameterError` listing every problem, including a
    parameter both swept and fixed and two different sets that map to the same file name; identical
    sets are merged."""
    path = Path(notebook)
    order = list(notebook_parameters(path))
    fixed = dict(fixed or {})
    errors: list[str] = []
    items: list[SweepItem] = []
    by_name: dict[str, dict[str, Any]] = {}
    for i, raw_set in enumerate(sets, start=1):
        clash = sorted(set(raw_set) & set(fixed))
        if clash:
            errors.append(f"set #{i}: parameter {clash[0]!r} is both swept and fixed with -p; drop one")
            continue
        try:
            values = validate_parameters(path, raw_set, raw=False)
        except ParameterError as exc:
            errors.extend(f"set #{i}: {e}" for e in exc.errors)
            continue
        merged = {**values, **fixed}
        values = {k: merged[k] for k in order if k in merged}  # declaration order, as in the file name
        name = sweep_output_name(path.stem, values, order)
        if name in by_name:
            if by_name[name] != values:
                errors.append(f"set #{i} {_short(values)} and set {_short(by_name[name])} give the same file name {name}")
            continue
        by_name[name] = values
        items.append(SweepItem(parameters=values, output=Path(out_dir).resolve() / name))
    if errors:
        raise ParameterError(errors)
    return items


def run_sweep(
    notebook: str | os.PathLike,
    items: Sequence[SweepItem],
    *,
    jobs: int = 1,
    force: bool = False,
    kernel_name: str | None = DEFAULT_KERNEL,
    cwd: str | os.PathLike | None = None,
    progress: Callable[[ExecutionResult], None] | None = None,
    progress_bar: bool = False,
    stall_timeout: float | None = DEFAULT_STALL_TIMEOUT,
) -> list[ExecutionResult]:
    """Execute the planned sweep (see :func:`plan_sweep`), ``jobs`` at a time (threads: each execution
    starts its own kernel). Items whose executed copy exists are skipped unless ``force``. ``progress``
    is called with each result as it completes (skipped ones first). Returns results in plan order.
    ``stall_timeout``: see :func:`.runner.execute` (a stalled set is retried once, then fails)."""
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    results: dict[int, ExecutionResult] = {}
    todo: list[int] = []
    for i, item in enumerate(items):
        if item.done and not force:
            results[i] = ExecutionResult(notebook=Path(notebook), output=item.output, parameters=item.parameters, status="skipped")
            if progress:
                progress(results[i])
        else:
            todo.append(i)

    def one(i: int) -> ExecutionResult:
        item = items[i]
        return execute(notebook, item.output, item.parameters, kernel_name=kernel_name, cwd=cwd, progress_bar=progress_bar,
                       stall_timeout=stall_timeout)

    if jobs == 1:
        for i in todo:
            results[i] = one(i)
            if progress:
                progress(results[i])
    else:
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="fda-sweep")
        try:
            futures = {pool.submit(one, i): i for i in todo}
            for fut in concurrent.futures.as_completed(futures):
                results[futures[fut]] = fut.result()
                if progress:
                    progress(results[futures[fut]])
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
    return [results[i] for i in range(len(items))]
