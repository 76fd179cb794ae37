"""Runs computed side by side in worker processes: ``run_many(..., workers=N)`` (``docs/architecture.md``
§ Runs side by side).

A sweep's runs are independent: each is a function of its config and seed. With ``workers`` > 1 the runs the
result store does not hold are computed in ``workers`` spawned processes, each running
:func:`fda_core.experiments.federated.run_experiment` on one config at a time, and the calling process saves each
result to the store as it arrives (so an interrupted sweep keeps every finished run) and returns them in the
configs' order.

Where it pays: on a GPU a small model's round is launch-bound (the device idles between tiny kernels), so runs
launched from several processes share the device; on a CPU with more cores than one run uses. Not on the
2-core reference machine, whose two cores already run two notebooks at once (``fda run all --jobs 2``).

Other kinds of runs (:class:`WorkerTask`): a module-level function computed on each item, after a module-level
set-up run once in each worker (e.g. notebook 08's FedDIRT runs, whose workers load the clients' data and
translated images once from a file the caller wrote: ``dg_study.DGStudy.run_all``).

What a worker finds: a spawned process imports ``fda_core`` afresh, so it knows the built-in methods, datasets
and models, and imports the modules that registered the others the configs name. A method, dataset or model
defined in ``__main__`` (a notebook cell, a script) cannot be imported there: such a sweep runs in this process,
one run after another, with a warning saying why.

Runs a result store may hold (:class:`StoredRun`): :func:`look_up` finds those the store holds (a run whose key
repeats an earlier one's is looked up and computed once), :func:`compute_and_store` computes the others side by side
and saves each as it arrives, and :func:`store_side_by_side` does both for a study, optionally writing an object
every worker needs (the clients' data, a data set) to a temporary file that each worker loads once
(:func:`shared_object`). ``run_many``, the notebook 04 source-data sweep and notebooks 06 and 08's studies use them.

Threads: each worker runs torch on ``max(1, threads // workers)`` CPU threads, where ``threads`` is this
process's :func:`torch.get_num_threads`. On a CPU the thread count can change a result's last digits (the order
of a parallel sum), so a run computed by a worker equals the one computed here bit for bit when both use the same
number of threads (e.g. ``OMP_NUM_THREADS=1``); on a GPU the device computes the same either way.
"""

from __future__ import annotations

import builtins
import concurrent.futures
import contextlib
import functools
import importlib
import importlib.util
import multiprocessing
import os
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["check_workers", "worker_modules", "worker_threads", "compute_side_by_side", "WorkerTask", "StoredRun",
           "look_up", "compute_and_store", "store_side_by_side", "shared_object"]


def check_workers(workers: Any) -> int:
    """``workers`` as an int ≥ 1; ValueError naming the parameter otherwise (a bool is not a count)."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an integer ≥ 1 (runs computed side by side), got {workers!r}")
    return workers


@dataclass(frozen=True)
class WorkerTask:
    """What each worker computes: ``function(item)`` for every item it is given, after ``setup(*setup_args)`` once
    in each worker process (``setup`` None: nothing). Both must be module-level functions of an importable module
    (a worker finds them by name); ``setup_args`` and the items are pickled to the worker, the results back."""

    function: Callable[[Any], Any]
    setup: Callable[..., None] | None = None
    setup_args: tuple = ()

    def blockers(self) -> list[str]:
        """Why a worker cannot find the functions (empty: it can)."""
        out = []
        for what, f in (("function", self.function), ("setup", self.setup)):
            if f is None:
                continue
            module, name = _defining_module(f), getattr(f, "__qualname__", "")
            if module in (None, "__main__") or "<" in name or importlib.util.find_spec(module) is None:
                out.append(f"the task's {what} {name or f!r} is not a module-level function of an importable module "
                           f"(defined in {module!r})")
        return out


def _defining_module(obj: Any) -> str | None:
    """The module that defines ``obj`` (a class, a function, or a functools.partial of one)."""
    while isinstance(obj, functools.partial):
        obj = obj.func
    return getattr(obj, "__module__", None)


def worker_modules(configs: Sequence[Mapping[str, Any]]) -> tuple[tuple[str, ...], list[str]]:
    """What worker processes must import to find every method, dataset and model the (resolved) configs name:
    the defining modules outside ``fda_core`` (``fda_core``'s own register on import), sorted; and one line per
    piece that no worker can import (defined in ``__main__`` or in a module that cannot be found), empty when
    the configs can run in workers."""
    from ..data.datasets.base import dataset_factory
    from ..data.models import model_factory
    from .methods import method_class

    modules: set[str] = set()
    blockers: list[str] = []
    seen: set[tuple[str, str]] = set()
    for c in configs:
        for kind, name, obj in (("method", c["rule"], method_class(c["rule"])),
                                ("dataset", c["dataset"], dataset_factory(c["dataset"])),
                                ("model", c["model"], model_factory(c["model"]))):
            if (kind, name) in seen or obj is None:
                continue
            seen.add((kind, name))
            module = _defining_module(obj)
            if module is None or module == "fda_core" or module.startswith("fda_core."):
                continue
            if module == "__main__" or importlib.util.find_spec(module) is None:
                blockers.append(f"{kind} {name!r} is defined in {module!r} (a notebook cell or a script), which a "
                                "worker process cannot import")
                continue
            modules.add(module)
    return tuple(sorted(modules)), blockers


def worker_threads(workers: int) -> int:
    """The torch CPU threads of each of ``workers`` workers: this process's share, at least 1."""
    import torch

    return max(1, torch.get_num_threads() // workers)


def _exit_with(parent: int, every_s: float = 1.0) -> None:
    """End this worker when the process that started it is gone (killed, or a restarted Jupyter kernel): a pool's
    worker waiting for its next run would otherwise wait for ever, holding its memory (and a CUDA context)."""
    while os.getppid() == parent:
        time.sleep(every_s)
    os._exit(3)


def _start_worker(caller: int, threads: int, modules: tuple[str, ...], setup: Callable[..., None] | None = None,
                  setup_args: tuple = ()) -> None:
    import torch

    # the caller's pid comes from the caller: read here, after the imports, it could already be the pid that adopted
    # an orphan (the caller killed while this worker was starting), and the worker would wait for ever
    threading.Thread(target=_exit_with, args=(caller,), name="exit-with-parent", daemon=True).start()
    torch.set_num_threads(threads)
    for module in modules:  # registers the methods, datasets and models defined outside fda_core
        importlib.import_module(module)
    if setup is not None:
        setup(*setup_args)


def _run_config(config: dict[str, Any]) -> dict[str, Any]:
    from .federated import run_experiment

    return run_experiment(**config)


def _run_in_worker(function: Callable[[Any], Any], item: Any) -> tuple[Any, list[tuple[str, str]]]:
    """``function(item)`` and the warnings it raised, as (category name, message): a worker's own stderr is not the
    notebook's, so the caller raises them again (:func:`_warn_again`). A category that is not one of Python's built-in
    warnings travels as UserWarning with its name in the message (its class may not be importable in the caller)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = function(item)
    out = []
    for w in caught:
        name = w.category.__name__
        if getattr(builtins, name, None) is not w.category:
            out.append(("UserWarning", f"{w.category.__module__}.{w.category.__qualname__}: {w.message}"))
        else:
            out.append((name, str(w.message)))
    return result, out


def _warn_again(caught: list[tuple[str, str]], where: str) -> None:
    for name, message in caught:
        warnings.warn(f"{message} [{where}]", getattr(builtins, name), stacklevel=4)


def _stop(pool: concurrent.futures.ProcessPoolExecutor) -> None:
    """Cancel what has not started and end the workers now: an interrupted sweep (or one whose caller stopped
    reading its results) does not wait for the runs in flight; those already finished are saved.
    ``ProcessPoolExecutor`` has no public way to end its processes before Python 3.14."""
    pool.shutdown(wait=False, cancel_futures=True)
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        process.terminate()


def compute_side_by_side(configs: Sequence[Any], workers: int, *,
                         describe: Callable[[int], str] = lambda i: f"run {i + 1}",
                         task: WorkerTask | None = None) -> Iterator[tuple[int, Any]]:
    """Compute ``run_experiment(**configs[i])`` for every i in up to ``workers`` spawned processes; yield
    ``(i, result)`` as each finishes (in the order they finish). The warnings a run raised in a worker are raised
    again here, naming the run. ``task``: compute ``task.function(configs[i])`` instead, after ``task.setup`` in
    each worker (:class:`WorkerTask`).

    When a run raises, the runs not yet started are cancelled, those in flight finish and are yielded, and then
    the run's exception is re-raised with a note naming it (``describe(i)``); when the caller is interrupted
    (or stops iterating), the workers are ended at once. Runs whose pieces a worker
    cannot import (:func:`worker_modules`, :meth:`WorkerTask.blockers`) are computed here, one after another, after
    a warning (a task's set-up then runs here too)."""
    workers = check_workers(workers)
    if not configs:
        return
    function = _run_config if task is None else task.function
    modules, blockers = (), []
    if workers > 1 and len(configs) > 1:
        modules, blockers = worker_modules(configs) if task is None else ((), task.blockers())
    if blockers:
        warnings.warn(f"workers={workers}: " + "; ".join(blockers) + f"; computing the {len(configs)} run(s) in "
                      "this process, one after another", RuntimeWarning, stacklevel=3)
    if blockers or workers == 1 or len(configs) == 1:
        if task is not None and task.setup is not None:
            task.setup(*task.setup_args)
        for i, config in enumerate(configs):
            yield i, function(config)
        return
    n = min(workers, len(configs))
    pool = concurrent.futures.ProcessPoolExecutor(
        max_workers=n, mp_context=multiprocessing.get_context("spawn"),  # spawn: CUDA cannot be forked
        initializer=_start_worker, initargs=(os.getpid(), worker_threads(n), modules,
                                             None if task is None else task.setup, () if task is None else task.setup_args))
    failure: BaseException | None = None
    try:
        futures = {pool.submit(_run_in_worker, function, config): i for i, config in enumerate(configs)}
        for future in concurrent.futures.as_completed(futures):
            i = futures[future]
            if future.cancelled():
                continue
            exc = future.exception()
            if exc is None:
                result, caught = future.result()
                _warn_again(caught, f"{describe(i)}, computed in a worker process")
                yield i, result
            elif failure is None:  # cancel what has not started; the runs in flight finish and are yielded
                exc.add_note(f"in {describe(i)}, computed in a worker process (workers={workers})")
                failure = exc
                for other in futures:
                    other.cancel()
    except BaseException:  # interrupted, or the caller stopped: end the workers now
        _stop(pool)
        raise
    pool.shutdown(wait=True)
    if failure is not None:
        raise failure


# -- runs a result store may hold ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class StoredRun:
    """One run that a result store (:class:`fda_core.common.store.ResultStore`) may hold: its store ``key`` (a config
    mapping), the code ``revision`` a stored result must carry to be reused (None: any), the ``item`` a worker
    computes it from (``task.function(item)``, or ``run_experiment(**item)`` without a task) and the ``label``
    that names it in errors and in warnings raised again from a worker."""

    key: Mapping[str, Any]
    item: Any
    revision: str | None = None
    label: str = "a run"


def look_up(store: Any, experiment: str, runs: Sequence[StoredRun], *, any_experiment: bool = False
            ) -> tuple[dict[int, Any], list[int], dict[int, list[int]]]:
    """Which of ``runs`` the ``store`` holds, under ``experiment``, stored by their revision (``any_experiment``:
    or under another experiment, :meth:`~fda_core.common.store.ResultStore.load`).

    Returns ``(found, to_compute, repeats)``: ``found`` maps the index of each stored run to its result; ``to_compute``
    lists, in order, the indices of the runs to compute; ``repeats`` maps each of those to the later indices whose
    key is the same (computed once, then read back: :func:`compute_and_store`). With no store, or one opened with
    ``recompute=True``, every run is computed and none is a repeat (a store that ignores what it holds cannot read a
    repeat back)."""
    from ..common.store import config_hash

    found: dict[int, Any] = {}
    to_compute: list[int] = []
    repeats: dict[int, list[int]] = {}
    first_of: dict[str, int] = {}  # hash of a key -> the index that computes it
    for i, run in enumerate(runs):
        if store is None or store.recompute:
            to_compute.append(i)
            continue
        h = config_hash(run.key)
        if h in first_of:
            repeats[first_of[h]].append(i)
            continue
        result = (store.load(experiment, run.key, run.revision, any_experiment=True) if any_experiment
                  else store.load(experiment, run.key, run.revision))
        if result is not None:
            found[i] = result
            continue
        first_of[h] = i
        repeats[i] = []
        to_compute.append(i)
    return found, to_compute, repeats


def compute_and_store(runs: Sequence[StoredRun], indices: Sequence[int], workers: int, *, store: Any,
                      experiment: str, on_result: Callable[[int, Any], None], task: WorkerTask | None = None,
                      repeats: Mapping[int, Sequence[int]] | None = None) -> None:
    """Compute ``runs[i]`` for every i of ``indices``, up to ``workers`` at a time (:func:`compute_side_by_side`,
    each run named by its label), save each result to ``store`` as it arrives, and call ``on_result(i, result)``
    with the result as a later load returns it (:meth:`~fda_core.common.store.ResultStore.put`; the result itself
    without a store), in the order the runs finish. After run i, ``on_result(r, …)`` for each r of
    ``repeats[i]`` with the result read back from the store. A run that raises, an error in ``on_result`` or an
    interrupt ends the workers as :func:`compute_side_by_side` says; what finished before is saved."""
    indices = list(indices)
    repeats = repeats or {}
    items = [runs[i].item for i in indices]
    with contextlib.closing(compute_side_by_side(items, workers, describe=lambda j: runs[indices[j]].label,
                                                 task=task)) as done:
        for j, result in done:
            i = indices[j]
            run = runs[i]
            on_result(i, store.put(experiment, run.key, result, run.revision) if store is not None else result)
            for r in repeats.get(i, ()):
                on_result(r, store.load(experiment, runs[r].key, runs[r].revision))


#: the object :func:`store_side_by_side` gave its workers, loaded once by :func:`_load_shared`
_SHARED: dict[str, Any] = {}


def _load_shared(path: str) -> None:
    """A worker's set-up: the object :func:`store_side_by_side` wrote to ``path`` (this process's caller wrote it
    moments ago, so it is loaded whole, classes included)."""
    import torch

    _SHARED.clear()
    _SHARED["object"] = torch.load(path, weights_only=False)


def shared_object() -> Any:
    """In a task's function: the object :func:`store_side_by_side`'s ``shared`` returned, as this worker loaded it."""
    if "object" not in _SHARED:
        raise RuntimeError("shared_object() is only available in a task started by store_side_by_side(shared=...)")
    return _SHARED["object"]


def store_side_by_side(runs: Sequence[StoredRun], workers: int, *, store: Any, experiment: str, task: WorkerTask,
                       on_result: Callable[[int, Any, bool], None], shared: Callable[[], Any] | None = None,
                       at_least: int = 2) -> int:
    """A study's runs: ``on_result(i, result, False)`` for each of ``runs`` the ``store`` holds (:func:`look_up`),
    then, when at least ``at_least`` runs are missing and ``workers`` > 1, ``on_result(i, result, True)`` for each
    missing run, computed ``workers`` at a time in spawned processes and saved as it finishes
    (:func:`compute_and_store`; a run repeating another's key is read back, ``computed`` False). Returns the number
    of runs computed: 0 when too few were missing, and the caller then computes them as it would one after another.

    ``shared()``: an object every worker needs (the clients' data, a data set), built only when runs are computed,
    written to a temporary file and loaded once by each worker, where ``task.function`` reads it with
    :func:`shared_object` (the task then has no set-up of its own). An object whose class a worker cannot import
    (defined in ``__main__``) is not shared out: a RuntimeWarning says so and nothing is computed here."""
    workers = check_workers(workers)
    if isinstance(at_least, bool) or not isinstance(at_least, int) or at_least < 1:
        raise ValueError(f"at_least must be an integer ≥ 1 (missing runs that make workers worth starting), got "
                         f"{at_least!r}")
    if shared is not None and task.setup is not None:
        raise ValueError("store_side_by_side: a task with its own set-up cannot also be given a shared object")
    found, to_compute, repeats = look_up(store, experiment, runs)
    for i, result in found.items():
        on_result(i, result, False)
    if workers == 1 or len(to_compute) < at_least:
        return 0
    with contextlib.ExitStack() as stack:
        if shared is not None:
            obj = shared()
            module = _defining_module(type(obj))
            if module in (None, "__main__") or importlib.util.find_spec(module) is None:
                warnings.warn(f"workers={workers}: the shared object's class {type(obj).__qualname__} is defined in "
                              f"{module!r}, which a worker process cannot import; computing the {len(to_compute)} "
                              "run(s) in this process, one after another", RuntimeWarning, stacklevel=2)
                return 0
            path = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=f"fda-{experiment}-"))) / "shared.pt"
            import torch

            torch.save(obj, path)
            task = WorkerTask(task.function, _load_shared, (str(path),))
            stack.callback(_SHARED.clear)  # set here too when the runs are computed in this process
        computing = set(to_compute)
        compute_and_store(runs, to_compute, workers, store=store, experiment=experiment, task=task, repeats=repeats,
                          on_result=lambda i, result: on_result(i, result, i in computing))
    return len(to_compute)
