"""Running several notebooks at once: ``fda run all --jobs 2`` (the main job on a 2-core machine).

A notebook may declare in its metadata that it must run after others of the same run::

    "metadata": {"fda": {"after": ["06"]}}        # numbers or stems, as on the command line

(notebook 08 reads the translators notebook 06 stores; started together, both would fit them), and how long it
takes at its defaults on the reference 2-core CPU, ``"minutes": 12`` (a scheduling hint, measured with
``fda run all --jobs 2`` and kept in the notebook; unknown: 1). A notebook starts as soon as a worker is free and
every notebook it comes after has finished (a failed one counts as finished: the later notebook computes what it
needs itself); among those ready, the one with the longest chain of work ahead (its minutes plus the longest
chain of notebooks waiting on it) goes first, so that long chains start early; ties keep the notebooks' order.
After a failure no new notebook starts unless ``keep_going``; those running finish.

With ``jobs`` kernels side by side each kernel gets ``cpu_count // jobs`` threads (``OMP_NUM_THREADS``, which
torch reads at start-up), unless the caller's environment already sets ``OMP_NUM_THREADS``: two kernels of
two threads each on two cores wait on each other's OpenMP barriers. Thread counts can change the last digits
of a CPU result (the order of a parallel sum); the Makefile's ``make figures`` always uses ``--jobs 2``.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
from pathlib import Path
from typing import Callable, Sequence, TypeVar

from .discovery import resolve_notebook

__all__ = ["declared_after", "declared_minutes", "kernel_threads_env", "run_scheduled", "start_order"]

R = TypeVar("R")


def _fda_metadata(path: str | os.PathLike) -> dict:
    with open(path, encoding="utf-8") as f:
        meta = json.load(f).get("metadata", {}).get("fda", {})
    if not isinstance(meta, dict):
        raise ValueError(f"{Path(path).name}: metadata fda must be a mapping, got {meta!r}")
    return meta


def _minutes(meta: dict, name: str) -> float:
    minutes = meta.get("minutes", 1)
    if isinstance(minutes, bool) or not isinstance(minutes, (int, float)) or not minutes > 0:
        raise ValueError(f"{name}: metadata fda.minutes must be a number > 0, got {minutes!r}")
    return float(minutes)


def _after(meta: dict, name: str) -> list[str]:
    after = meta.get("after", [])
    if not isinstance(after, list) or not all(isinstance(a, str) for a in after):
        raise ValueError(f"{name}: metadata fda.after must be a list of notebook numbers or stems, got {after!r}")
    return after


def declared_minutes(path: str | os.PathLike) -> float:
    """The notebook's run time at its defaults, in minutes (metadata ``fda.minutes``; 1 when not given)."""
    return _minutes(_fda_metadata(path), Path(path).name)


def declared_after(path: str | os.PathLike) -> list[str]:
    """The notebooks ``path`` must run after (its metadata ``fda.after``: numbers or stems), as written."""
    return _after(_fda_metadata(path), Path(path).name)


def _plan(paths: Sequence[Path]) -> tuple[list[set[int]], list[float]]:
    """Per notebook (metadata read once): the indices of the earlier notebooks of this run it waits for, and its
    chain of work, its minutes plus the longest chain of the notebooks of this run that wait on it. A name in
    ``fda.after`` is resolved as on the command line (:func:`.discovery.resolve_notebook`, in the notebook's folder)."""
    resolved = [Path(p).resolve() for p in paths]
    before: list[set[int]] = []
    own: list[float] = []
    for i, path in enumerate(paths):
        meta = _fda_metadata(path)
        own.append(_minutes(meta, Path(path).name))
        wanted = {resolve_notebook(spec, Path(path).parent).resolve() for spec in _after(meta, Path(path).name)}
        before.append({j for j in range(i) if resolved[j] in wanted})
    chain = own[:]
    for i in reversed(range(len(paths))):  # waiting notebooks come later in the run
        chain[i] = own[i] + max((chain[j] for j in range(i + 1, len(paths)) if i in before[j]), default=0.0)
    return before, chain


def _longest_chain_first(chain: list[float]) -> list[int]:
    return sorted(range(len(chain)), key=lambda i: (-chain[i], i))


def start_order(paths: Sequence[Path]) -> list[int]:
    """The order in which notebooks start when every worker is free and nothing waits (longest chain first)."""
    return _longest_chain_first(_plan(paths)[1])


def kernel_threads_env(jobs: int, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment added to each kernel when ``jobs`` run at once: ``OMP_NUM_THREADS`` (and MKL's) set to
    ``cpu_count // jobs`` (at least 1); nothing for one job or when ``OMP_NUM_THREADS`` is already set."""
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    environ = os.environ if environ is None else environ
    if jobs == 1 or "OMP_NUM_THREADS" in environ:
        return {}
    threads = str(max(1, (os.cpu_count() or 1) // jobs))
    return {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}


def run_scheduled(paths: Sequence[Path], run_one: Callable[[int], R], *, jobs: int = 1,
                  ok: Callable[[R], bool] = lambda r: True, keep_going: bool = False,
                  on_result: Callable[[int, R], None] | None = None) -> dict[int, R]:
    """Run ``run_one(i)`` for every notebook ``paths[i]``, ``jobs`` at a time, longest chain of work first
    (:func:`declared_minutes`; one job: in the given order), each after the notebooks it declares
    (:func:`declared_after`). ``on_result(i, result)`` is called as each finishes (in the calling thread). After a result that is not ``ok`` nothing new starts unless ``keep_going``. Returns the results by
    index (notebooks never started are missing)."""
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    before, chain = _plan(paths)
    results: dict[int, R] = {}
    # one at a time the order cannot shorten the run: keep the user's
    waiting = _longest_chain_first(chain) if jobs > 1 else list(range(len(paths)))
    running: dict[concurrent.futures.Future[R], int] = {}
    stopped = False
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="fda-run")
    try:
        while waiting or running:
            if not stopped:
                for i in list(waiting):
                    if len(running) >= jobs:
                        break
                    if before[i] <= results.keys():
                        waiting.remove(i)
                        running[pool.submit(run_one, i)] = i
            if not running:
                break  # stopped, or (cannot happen: dependencies point backwards) nothing can start
            done, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
            for fut in sorted(done, key=lambda f: running[f]):
                i = running.pop(fut)
                results[i] = fut.result()
                if on_result is not None:
                    on_result(i, results[i])
                if not ok(results[i]) and not keep_going:
                    stopped = True
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return results
