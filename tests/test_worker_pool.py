"""Runs side by side in worker processes (fda_core.experiments.worker_pool, ``run_many(..., workers=N)``): the
same results as one after another, bit for bit at equal thread counts; the store's reuse and resume; a failing
run named, with the runs in flight kept; pieces defined outside fda_core imported by the workers; pieces no
worker can import computed here; bad counts refused; the store's runs reused, the others computed once and saved,
an object shared out to the workers (look_up, compute_and_store, store_side_by_side). Each test that starts workers
has a timeout."""

import json
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from fda_core.common.store import ResultStore
from fda_core.experiments import federated, worker_pool
from fda_core.experiments.federated import computed_content, run_many
from fda_core.experiments.methods import _REGISTRY as METHODS
from fda_core.experiments.methods import FedDA
from worker_tasks import scaled

# A plug-in module, as a user would write one: a tiny 3-environment data set and a method, registered on import.
# The workers find both only by importing it (worker_pool.worker_modules).
PLUGIN = textwrap.dedent('''
    import sys
    sys.path.insert(0, TESTS_DIR)
    from test_federated import Blobs
    from fda_core.data.datasets.base import register_dataset
    from fda_core.experiments.methods import FedGP, register_method

    class PluginWarning(UserWarning):
        pass

    class WorkerBlobs(Blobs):
        def __init__(self, n=160, seed=0, warn=False):
            if warn:
                import warnings
                warnings.warn("this data set was asked to warn", RuntimeWarning)
                warnings.warn("and in its own category", PluginWarning)
            super().__init__(n, seed)

    register_dataset("WorkerBlobs", WorkerBlobs, overwrite=True)

    @register_method
    class PluginGP(FedGP):
        name = "plugin_gp"
        label = "Plugin GP"
''').replace("TESTS_DIR", repr(str(Path(__file__).resolve().parent)))

BASE = dict(dataset="WorkerBlobs", target=0, rounds=3, warmup_rounds=1, n_target_labeled=24, target_batch_size=6,
            source_lr=0.02, model="mlp", source_batch_size=32, device="cpu")


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """Import the plug-in from a folder on sys.path (spawned workers get the same sys.path); unregister after."""
    (tmp_path / "fda_worker_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    module = importlib.import_module("fda_worker_plugin")
    from fda_core.data.datasets import base

    yield module
    base._REGISTRY.pop("WorkerBlobs", None)
    METHODS.pop("plugin_gp", None)
    sys.modules.pop("fda_worker_plugin", None)


@pytest.fixture
def one_thread():
    """Runs here and in the workers on one thread each, so that both compute the same bits."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("workers", [0, -1, True, 1.5, "2", None])
def test_bad_worker_counts_are_refused_before_anything_runs(workers, tmp_path):
    with pytest.raises(ValueError, match=r"workers must be an integer ≥ 1"):
        run_many([{**BASE, "dataset": "MNIST", "rule": "fedgp"}], store=tmp_path, workers=workers, progress=False)
    assert not list(tmp_path.iterdir())


def test_worker_modules_name_what_a_worker_must_import(plugin):
    configs = [federated.make_config(**BASE, rule=r) for r in ("plugin_gp", "fedgp")]
    modules, blockers = worker_pool.worker_modules(configs)
    assert modules == ("fda_worker_plugin",) and blockers == []
    builtin = [federated.make_config(**{**BASE, "dataset": "MNIST"}, rule="fedgp")]
    assert worker_pool.worker_modules(builtin) == ((), [])
    assert worker_pool.worker_threads(10**6) == 1


@pytest.mark.timeout(300)
def test_workers_give_the_runs_of_one_after_another_bit_for_bit(plugin, one_thread, tmp_path):
    configs = [{**BASE, "rule": r, "seed": s} for r in ("plugin_gp", "fedda", "target_only") for s in (0, 1)]
    labels = [{"k": i} for i in range(len(configs))]
    here = run_many(configs, progress=False, labels=labels)
    seen = []
    side = run_many(configs, progress=False, labels=labels, workers=2, on_result=lambda r: seen.append(r["labels"]["k"]))
    assert computed_content(side) == computed_content(here)
    assert seen == list(range(len(configs)))  # on_result in the configs' order, whichever finished first
    assert [r["method"] for r in side[:2]] == ["Plugin GP", "Plugin GP"]  # the plug-in's method ran in the workers

    # through the store: saved as they finish; a repeated config computed once; a second sweep reuses them all
    store = ResultStore(tmp_path)
    stored = run_many(configs + configs[:2], store=store, experiment="w", progress=False, workers=3,
                      labels=labels + labels[:2])
    assert store.counts["w"] == {"reused": 2, "computed": 6, "stale": 0}
    assert len(list((tmp_path / "w").glob("*.json"))) == 6
    assert computed_content(stored[:6]) == computed_content(here)
    assert stored[6:] == stored[:2] and stored[0] is not stored[6]  # read back from the store: equal, not shared
    again = ResultStore(tmp_path)
    assert run_many(configs, store=again, experiment="w", progress=False, workers=2, labels=labels) == stored[:6]
    assert again.counts["w"] == {"reused": 6, "computed": 0, "stale": 0}


@pytest.mark.timeout(300)
def test_a_failing_run_is_named_and_the_finished_runs_are_kept(plugin, tmp_path):
    good = [{**BASE, "rule": "fedda", "seed": s} for s in (0, 1, 2)]
    bad = {**BASE, "rule": "fedgp", "source_lr": 1e30, "optimizer": "sgd"}  # diverges in its first round
    store = ResultStore(tmp_path)
    with pytest.raises(FloatingPointError, match="client") as info:
        run_many([good[0], bad, *good[1:]], store=store, experiment="f", progress=False, workers=2)
    note = "\n".join(getattr(info.value, "__notes__", []))
    assert "run 2 of 4 of 'f' (rule 'fedgp', dataset 'WorkerBlobs'" in note and "worker process" in note
    # the run before the failure, and any in flight, finished and were saved; the rest resume later
    kept = [ResultStore(tmp_path).load("f", federated.store_key(federated.make_config(**g))) for g in good]
    assert kept[0] is not None
    assert len(list((tmp_path / "f").glob("*.json"))) == sum(k is not None for k in kept)
    resumed = ResultStore(tmp_path)
    run_many(good, store=resumed, experiment="f", progress=False, workers=2)
    assert resumed.counts["f"]["reused"] == sum(k is not None for k in kept)


def test_a_method_of_a_notebook_cell_runs_here_with_a_warning(plugin, tmp_path):
    class CellFedDA(FedDA):  # as if defined in a notebook cell: its module is __main__
        name = "cell_fedda_for_workers"
        label = "Cell FedDA"

    CellFedDA.__module__ = "__main__"
    METHODS[CellFedDA.name] = CellFedDA
    try:
        configs = [{**BASE, "rule": CellFedDA.name, "seed": s} for s in (0, 1)]
        with pytest.warns(RuntimeWarning, match=r"method 'cell_fedda_for_workers' is defined in '__main__'.*"
                                                r"computing the 2 run\(s\) in this process"):
            out = run_many(configs, progress=False, workers=2)
        assert [r["method"] for r in out] == ["Cell FedDA"] * 2
        assert computed_content(out) == computed_content(run_many(configs, progress=False))
    finally:
        METHODS.pop(CellFedDA.name, None)


@pytest.mark.timeout(300)
def test_an_interrupted_sweep_ends_its_workers_and_keeps_what_finished(plugin, tmp_path):
    import multiprocessing
    import time

    configs = [{**BASE, "rule": "fedda", "seed": s} for s in range(6)]

    def interrupt(res):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_many(configs, store=tmp_path, experiment="i", progress=False, workers=2, on_result=interrupt)
    saved = len(list((tmp_path / "i").glob("*.json")))
    assert 1 <= saved < len(configs)  # the first finished run was saved before the stop; not all ran
    deadline = time.monotonic() + 30
    while multiprocessing.active_children() and time.monotonic() < deadline:  # ended, not left running
        time.sleep(0.1)
    assert multiprocessing.active_children() == []


NOTEBOOK_CELL = '''
import json, torch
torch.set_num_threads(1)
import fda_worker_plugin  # registers WorkerBlobs and plugin_gp; the workers import it too
from fda_core.experiments.federated import computed_content, run_many
base = {base!r}
configs = [dict(base, rule=r, seed=s) for r in ("plugin_gp", "fedda") for s in (0, 1)]
side = run_many(configs, progress=False, workers=workers)
assert computed_content(side) == computed_content(run_many(configs, progress=False)), "workers changed the results"
print("side by side:", len(side), "runs")
'''


@pytest.mark.timeout(300)
def test_workers_start_from_a_jupyter_kernel(tmp_path):
    """The notebooks' case: a Jupyter kernel's __main__ is ipykernel's, which spawned workers re-import by name."""
    import nbformat

    from fda_core.workbook.runner import execute

    (tmp_path / "fda_worker_plugin.py").write_text(PLUGIN)
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("workers: int = 1  # runs side by side ≥ 1")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(NOTEBOOK_CELL.format(base=BASE))]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, tmp_path / "side.ipynb")
    res = execute(tmp_path / "side.ipynb", tmp_path / "out.ipynb", {"workers": 2}, cwd=tmp_path, progress_bar=False,
                  execution_timeout=240, stall_timeout=120)
    assert res.ok, res.error_summary()
    out = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    assert "side by side: 4 runs" in "".join(o.get("text", "") for o in out.cells[-1].outputs)


SCRIPT = '''
import sys
sys.path.insert(0, {folder!r})
import fda_worker_plugin
from fda_core.experiments.federated import run_many

if __name__ == "__main__":
    configs = [dict({base!r}, rule="fedda", seed=s, rounds=40) for s in range(200)]
    run_many(configs, progress=False, workers=2, store={store!r}, experiment="k")
'''


def _children(pid: int) -> set[int]:
    out = set()
    for task in __import__("pathlib").Path(f"/proc/{pid}/task").glob("*/children"):
        out |= {int(x) for x in task.read_text().split()}
    return out


def _alive(pid: int) -> bool:
    try:
        stat = __import__("pathlib").Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.timeout(300)
@pytest.mark.parametrize("when", ["starting", "computing"])
def test_workers_end_when_the_process_that_started_them_is_killed(tmp_path, when):
    """Killed while its workers still import (they must not take their adopter for their caller), or once they
    compute (a run is in the store)."""
    import signal
    import subprocess
    import time

    (tmp_path / "fda_worker_plugin.py").write_text(PLUGIN)
    (tmp_path / "sweep.py").write_text(SCRIPT.format(folder=str(tmp_path), base=BASE, store=str(tmp_path / "store")))
    proc = subprocess.Popen([sys.executable, str(tmp_path / "sweep.py")], cwd=tmp_path)
    try:
        deadline = time.monotonic() + 120
        while len(_children(proc.pid)) < 3 and time.monotonic() < deadline:  # 2 workers + the resource tracker
            time.sleep(0.05)
        started = _children(proc.pid)
        assert len(started) >= 3, f"the sweep's workers did not start (children {started})"
        while when == "computing" and not list(tmp_path.glob("store/k/*.json")) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert when == "starting" or list(tmp_path.glob("store/k/*.json")), "no run finished"
        proc.send_signal(signal.SIGKILL)  # no clean-up runs in the caller
        proc.wait(30)
        deadline = time.monotonic() + 60
        while any(_alive(p) for p in started) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [p for p in started if _alive(p)], "workers outlived the process that started them"
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.timeout(300)
def test_the_warnings_of_a_run_in_a_worker_reach_the_caller(plugin):
    """A worker's stderr is not the notebook's: its runs' warnings are raised again in the caller, naming the run."""
    configs = [{**BASE, "rule": "fedda", "seed": s, "dataset_options": {"warn": s == 1}} for s in (0, 1)]
    with pytest.warns(Warning) as record:
        run_many(configs, progress=False, workers=2)
    messages = [(w.category, str(w.message)) for w in record]
    assert (RuntimeWarning, "this data set was asked to warn [run 2 of 2 of 'federated' (rule 'fedda', dataset "
            "'WorkerBlobs', target 0, seed 1), computed in a worker process]") in messages
    assert any(c is UserWarning and m.startswith("fda_worker_plugin.PluginWarning: and in its own category [run 2 of 2")
               for c, m in messages)
    assert not [m for c, m in messages if "run 1 of 2" in m]


# -- other kinds of runs: a WorkerTask -------------------------------------------------------------------------
@pytest.mark.timeout(300)
def test_a_task_runs_its_function_in_workers_after_its_setup(tmp_path):
    """WorkerTask(function, setup, setup_args): each worker runs the set-up once, then the function on its items;
    results come back by index. Here the set-up changes the worker's folder, which the function's results show."""
    import os

    here = os.getcwd()
    task = worker_pool.WorkerTask(os.path.abspath, os.chdir, (str(tmp_path),))
    got = dict(worker_pool.compute_side_by_side([".", "sub", ".", "sub"], 2, task=task))
    assert got == {0: str(tmp_path), 1: str(tmp_path / "sub"), 2: str(tmp_path), 3: str(tmp_path / "sub")}
    assert os.getcwd() == here  # the set-up ran in the workers, not here


def test_a_task_a_worker_cannot_import_runs_here_with_a_warning():
    """A function defined in a function (or a notebook cell) cannot be found by a worker: the items are computed
    in this process, set-up first, after a RuntimeWarning naming it."""
    seen = []
    task = worker_pool.WorkerTask(lambda item: item * 10, lambda tag: seen.append(tag), ("set up",))
    assert task.blockers() and "not a module-level function" in task.blockers()[0]
    with pytest.warns(RuntimeWarning, match="computing the 3 run"):
        got = list(worker_pool.compute_side_by_side([1, 2, 3], 2, task=task))
    assert got == [(0, 10), (1, 20), (2, 30)] and seen == ["set up"]
    assert worker_pool.WorkerTask(json.dumps).blockers() == []


# -- runs a result store may hold: look_up, compute_and_store, store_side_by_side ----------------------------------
def _runs(keys, revision="r1"):
    return [worker_pool.StoredRun({"k": k}, k, revision, f"run {k}") for k in keys]


def test_look_up_reuses_stored_runs_and_computes_a_repeated_key_once(tmp_path):
    """Hand-worked case: keys a b a c b, with b stored by this revision and c by another (stale): b is found
    twice, a and c are computed, the second a is a repeat of the first."""
    store = ResultStore(tmp_path)
    store.save("e", {"k": "b"}, {"v": 2}, "r1")
    store.save("e", {"k": "c"}, {"v": 3}, "r0")
    runs = _runs(["a", "b", "a", "c", "b"])
    found, to_compute, repeats = worker_pool.look_up(store, "e", runs)
    assert found == {1: {"v": 2}, 4: {"v": 2}}
    assert to_compute == [0, 3] and repeats == {0: [2], 3: []}
    for nothing_read in (None, ResultStore(tmp_path, recompute=True)):  # every run computed, none merged
        assert worker_pool.look_up(nothing_read, "e", runs) == ({}, [0, 1, 2, 3, 4], {})


@pytest.mark.timeout(300)
def test_store_side_by_side_shares_an_object_saves_each_run_and_reads_repeats_back(tmp_path):
    """Two workers each load the shared object once and compute the missing runs; each result is saved and passed
    on as the store returns it; a repeated key is read back, not computed; a second pass computes nothing; the
    object is not left loaded here."""
    ResultStore(tmp_path).save("e", {"k": 4}, {"value": -1}, "r1")  # stored: reused as it is
    store = ResultStore(tmp_path)
    runs = _runs([1, 2, 3, 2, 4])
    seen = {}
    task = worker_pool.WorkerTask(scaled)
    n = worker_pool.store_side_by_side(runs, 2, store=store, experiment="e", task=task, shared=lambda: {"factor": 3},
                                       on_result=lambda i, r, computed: seen.__setitem__(i, (r, computed)))
    assert n == 3
    assert seen == {0: ({"value": 3}, True), 1: ({"value": 6}, True), 2: ({"value": 9}, True),
                    3: ({"value": 6}, False), 4: ({"value": -1}, False)}
    assert store.counts["e"] == {"reused": 2, "computed": 3, "stale": 0}  # run 4, and run 2 read back for its repeat
    assert worker_pool._SHARED == {}
    again, seen = ResultStore(tmp_path), {}
    assert worker_pool.store_side_by_side(runs, 2, store=again, experiment="e", task=task, shared=lambda: {"factor": 5},
                                          on_result=lambda i, r, c: seen.__setitem__(i, (r["value"], c))) == 0
    assert seen == {0: (3, False), 1: (6, False), 2: (9, False), 3: (6, False), 4: (-1, False)}


def test_store_side_by_side_leaves_the_runs_to_the_caller_when_it_cannot_share_them(tmp_path):
    """Nothing is computed (0 returned, only stored runs passed on) with one worker, with fewer missing runs than
    ``at_least``, or with a shared object whose class a worker cannot import (with a warning naming it); a task with
    its own set-up cannot take a shared object; shared_object() outside a worker says where it works; a bad
    ``at_least`` is refused before the store is read."""
    store = ResultStore(tmp_path)
    store.save("e", {"k": 1}, {"value": 1}, "r1")
    runs = _runs([1, 2, 3])
    task = worker_pool.WorkerTask(json.dumps)
    built = []

    def shared():
        built.append(1)
        return {}

    for workers, at_least in ((1, 2), (2, 3)):
        seen = []
        assert worker_pool.store_side_by_side(runs, workers, store=store, experiment="e", task=task, shared=shared,
                                              at_least=at_least, on_result=lambda i, r, c: seen.append((i, c))) == 0
        assert seen == [(0, False)]
    assert built == []  # the shared object is only built when runs are computed
    local = type("LocalData", (), {"__module__": "__main__"})
    with pytest.warns(RuntimeWarning, match="class LocalData is defined in '__main__'.*computing the 2 run"):
        assert worker_pool.store_side_by_side(runs, 2, store=store, experiment="e", task=task, shared=local,
                                              on_result=lambda *a: None) == 0
    with pytest.raises(ValueError, match="its own set-up"):
        worker_pool.store_side_by_side(runs, 2, store=store, experiment="e", shared=dict, on_result=lambda *a: None,
                                       task=worker_pool.WorkerTask(json.dumps, json.loads, ("1",)))
    with pytest.raises(RuntimeError, match="store_side_by_side"):
        worker_pool.shared_object()
    read = json.dumps(store.counts)
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="at_least must be an integer ≥ 1"):
            worker_pool.store_side_by_side(runs, 2, store=store, experiment="e", task=task, at_least=bad,
                                           on_result=lambda *a: None)
    assert json.dumps(store.counts) == read


class _DictStore:
    """A stand-in for ResultStore's lookup: the results of the keys it holds, counted per read."""

    recompute = False

    def __init__(self, held):
        self.held, self.reads = held, []

    def load(self, experiment, key, revision=None):
        self.reads.append(key["k"])
        return self.held.get(key["k"])


@given(keys=st.lists(st.integers(0, 5), max_size=12), held=st.sets(st.integers(0, 5)))
def test_look_up_splits_every_run_into_found_computed_once_or_a_repeat(keys, held):
    """Any keys, any stored subset: every index is found, computed or a repeat, exactly once; each missing key is
    computed once, at its first index, its later indices its repeats; the store is read once per stored index and
    once per missing key."""
    store = _DictStore({k: {"v": k} for k in held})
    found, to_compute, repeats = worker_pool.look_up(store, "e", _runs(keys))
    placed = sorted([*found, *to_compute, *(r for rs in repeats.values() for r in rs)])
    assert placed == list(range(len(keys)))
    assert all(keys[i] in held and found[i] == {"v": keys[i]} for i in found)
    assert [keys[i] for i in to_compute] == list(dict.fromkeys(k for k in keys if k not in held))
    assert to_compute == [keys.index(keys[i]) for i in to_compute] and sorted(repeats) == to_compute
    assert all(keys[r] == keys[i] and r > i for i, rs in repeats.items() for r in rs)
    assert sorted(store.reads) == sorted([k for k in keys if k in held] + [keys[i] for i in to_compute])
