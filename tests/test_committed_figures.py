"""The committed result CSVs under ``figures/`` are what the code makes today.

``make check-figures`` recomputes every notebook (about 16 minutes) and is not part of ``make test``; so a change
of code that moves a committed number (a config key added to Flower's messages grew notebook 09's message sizes by
27 bytes, found only by ``make check-figures``) could land unnoticed. The notebooks whose default run is cheap enough are
re-executed here with their default parameters (a fresh result store, so every run is recomputed) and their CSVs
compared byte for byte with the committed ones. The runs go side by side, one kernel per core, when the first guard
starts (:func:`regenerations`).

The committed figures are those of ``make figures``: one torch thread per kernel (README § Performance; thread
counts move the last digits of CPU results), so the kernels here get ``OMP_NUM_THREADS=1`` too.

Byte identity also needs the same floating-point kernels: MKL and oneDNN pick their code path by the CPU's
instruction set, and a CPU of another family gives other last digits. Each folder of committed figures records the
fingerprint of the kernels that made it (``float_kernels.txt``, written by ``fda run``; a folder without one comes
from the machine of the first committed figures, :data:`fda_core.workbook.float_kernels.LEGACY_FINGERPRINT`). The
guard computes this machine's fingerprint once (five seconds) and compares a notebook byte for byte where it
matches that notebook's, and skips it, naming both, elsewhere: so figures regenerated on one kind of machine are
checked on that kind, and the others' on theirs.
"""

import concurrent.futures
import importlib.util
import os
from pathlib import Path

import papermill as pm
import pytest

ROOT = Path(__file__).resolve().parent.parent

#: notebooks whose default run CI can afford (one thread each, on the 2-core VM of 2026-11-25: 01 ≈ 50 s,
#: 04 ≈ 6–7 min, the papers' Table 1, the baselines and the reference-budget check, 07 ≈ 70 s, 09 ≈ 30 s; 07 took 228 s
#: on a slower VM of 2026-11-27; on the AMD EPYC kind 01 and 09 133 s together, 07 about 4 min, 04 16.3 min alone), with a
#: package each needs (skipped, naming it, when it is missing). Notebooks 02, 03 and 06 joined on 2026-11-30, when a VM
#: with the first machine's float kernels (an AMD EPYC of family 26, AVX-512) remade their committed CSVs byte for byte
#: (the one exception, notebook 06's Sinkhorn cross-check, regenerated there): 02 246 s and 06 374 s side by side there,
#: 03 about a minute; they run only on that kind, where notebooks 01, 04, 07 and 09 (made on the AMD EPYC kind of family
#: 25) skip. Notebook 08 joined on 2026-12-06: its committed CSVs were made on the AVX-512-FP16 Intel kind
#: (fingerprint 0.21272190459362486, as the Cascade Lake kind's), where no guard had run before; there its default run
#: remade them byte for byte, alone on one thread, in 4.9 min (the test with its fingerprint)
CHEAP = {"01_delta_errors": None, "02_phase_diagram": None, "03_unbiased_estimators": None, "04_real_data": None,
         "06_inb_translation": None, "07_auxiliary_tasks": None, "08_domain_generalisation": None,
         "09_flower": "flwr"}

#: committed CSVs that a documented non-default run makes (not the default run checked here), per notebook:
#: file → the command that regenerates it
_CNN_CHECK = ("fda run 04 -p reference_check true -p check_model mnist_cnn -p check_targets '[\"-90%\"]' "
              "-p check_trials 3")
#: notebook 04's RotatedMNIST table left the default run on 2026-11-29 (its committed table is shown); until its guard
#: ran again (2026-11-30) nothing noticed that the default run no longer writes these two files
_RMNIST = "fda run 04 -p datasets '[\"ColoredMNIST\", \"RotatedMNIST\"]'"
#: (the paper-CNN check's two files were made on an AVX-512 kind, the rest of notebook 04's on the AMD EPYC kind)
EXTRA = {"04_real_data": {"reference_budget_check_mnist_cnn.csv": _CNN_CHECK,
                          "reference_budget_check_mnist_cnn_runs.csv": _CNN_CHECK,
                          "rotatedmnist_accuracy.csv": _RMNIST, "rotatedmnist_table.csv": _RMNIST},
         # Table 5's runs under the other option, a check kept out of the main job (the default run shows this table)
         "06_inb_translation": {"iterations_vs_paper.csv": "fda run 06 -p compare_options true"}}
#: parameters beyond the defaults: the checks a notebook keeps out of the main job, whose committed CSVs the default
#: run shows but does not make (notebook 04's reference-budget check, `fda run 04 -p reference_check true`)
PARAMS = {"04_real_data": {"reference_check": True}}
#: minutes each guard's run took on one thread where it last ran (docs/performance.md § Test suite): only their
#: order matters, the order in which the runs start side by side (longest first, so the others fit beside it)
GUARD_MINUTES = {"01_delta_errors": 1.0, "02_phase_diagram": 8.0, "03_unbiased_estimators": 1.4, "04_real_data": 16.3,
                 "06_inb_translation": 11.5, "07_auxiliary_tasks": 4.3,
                 "08_domain_generalisation": 4.9, "09_flower": 1.1}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def this_machines_kernels() -> str:
    """This machine's float-kernel fingerprint (module docstring)."""
    from fda_core.workbook.float_kernels import fingerprint

    return fingerprint()


def committed_folder(notebook: Path) -> Path:
    """The folder of ``notebook``'s committed figures: its default ``figures_dir``, resolved as ``fda run`` resolves
    it (:func:`fda_core.workbook.staging.plan_staging`)."""
    from fda_core.workbook.staging import plan_staging

    return plan_staging(notebook, {}, ROOT).destination


def _committed_folder(stem: str) -> Path:
    return committed_folder(ROOT / "notebooks" / f"{stem}.ipynb")


def _why_not_here(stem: str, here: str) -> str | None:
    """Why ``stem``'s guard cannot run on this machine (a package it needs is missing, or this machine's float
    kernels ``here`` are not those that made its committed files), or None when it can."""
    from fda_core.workbook.float_kernels import recorded

    package = CHEAP[stem]
    if package is not None and importlib.util.find_spec(package) is None:
        return f"{stem} needs {package}, which is not installed"
    committed = _committed_folder(stem)
    made_by = recorded(committed)
    if here != made_by:
        return (f"this CPU's float kernels differ from those that made {committed.name} (fingerprint "
                f"{here} here, {made_by} recorded); byte identity cannot hold here")
    return None


def _regenerate(stem: str, work: Path):
    """``stem``'s default run (plus :data:`PARAMS`) into ``work``: a fresh figures folder and result store, one
    torch thread."""
    from fda_core.workbook.runner import execute

    nb = ROOT / "notebooks" / f"{stem}.ipynb"
    declared = pm.inspect_notebook(str(nb))
    params = {"figures_dir": str(work / "figures"), **PARAMS.get(stem, {})}
    if "results_dir" in declared:
        params["results_dir"] = str(work / "results")
    return execute(nb, work / nb.name, params, cwd=ROOT, progress_bar=False, execution_timeout=2400,
                   stall_timeout=120, kernel_env={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})


_GUARD = "test_default_run_reproduces_the_committed_csvs"


@pytest.fixture(scope="module")
def regenerations(request, tmp_path_factory, this_machines_kernels):
    """The default runs of the selected guards that can run here, started side by side when the first guard
    runs: one kernel per core (each of one thread, as before, so the numbers are the same), longest first
    (:data:`GUARD_MINUTES`). One after another they left the second core idle for their whole length: the guards of
    06, 02 and 03 took 1,005 s so and 671 s side by side on the 2-core VM of 2026-12-03 (docs/performance.md § Test
    suite). stem → (the future of the run's result, its figures folder)."""
    selected = [item.callspec.params["stem"] for item in request.session.items
                if getattr(item, "originalname", None) == _GUARD and hasattr(item, "callspec")]
    runnable = sorted((s for s in set(selected) if _why_not_here(s, this_machines_kernels) is None),
                      key=lambda s: (-GUARD_MINUTES[s], s))
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(len(runnable), os.cpu_count() or 1)),
                                                 thread_name_prefix="guard")
    runs = {}
    for stem in runnable:
        work = tmp_path_factory.mktemp(stem)
        runs[stem] = (pool.submit(_regenerate, stem, work), work / "figures")
    yield runs
    pool.shutdown(wait=True, cancel_futures=True)


# a hang's bound: notebook 04 alone took 19 min on one thread of the slower 2-core VMs in CI, and the first guard
# to run may wait for the others' runs side by side
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("stem", sorted(CHEAP))
def test_default_run_reproduces_the_committed_csvs(stem, this_machines_kernels, regenerations):
    reason = _why_not_here(stem, this_machines_kernels)
    if reason is not None:
        pytest.skip(reason)
    committed = _committed_folder(stem)
    future, figures = regenerations[stem]
    res = future.result()
    assert res.ok, f"{stem} failed: {res.error_summary()}"
    extra = EXTRA.get(stem, {})
    assert all((committed / n).exists() for n in extra), f"an EXTRA file of {stem} is not committed"
    names = sorted(p.name for p in committed.glob("*.csv") if p.name not in extra)
    assert names, f"no committed CSV under {committed}"
    assert names == sorted(p.name for p in figures.glob("*.csv"))
    stale = [n for n in names if (committed / n).read_bytes() != (figures / n).read_bytes()]
    assert not stale, (f"{stem}: the committed {', '.join(stale)} differ from what the code makes now; "
                       f"regenerate with `fda run {stem[:2]}` (one thread: OMP_NUM_THREADS=1) and commit them")


def test_the_commands_named_for_extra_files_and_the_guard_parameters_are_valid(fda_dry_run):
    """Each command :data:`EXTRA` names for a committed file runs its notebook with parameters it declares, in their
    ranges (``fda run --dry-run``), and :data:`PARAMS` names declared parameters only: a renamed parameter would
    otherwise show only when someone regenerates the file, or when the guard runs on the kind that made it."""
    import shlex

    from fda_core.workbook.discovery import resolve_notebook

    for stem, files in EXTRA.items():
        for name, command in files.items():
            argv = shlex.split(command)
            assert argv[:2] == ["fda", "run"] and resolve_notebook(argv[2]).stem == stem, (name, command)
            code, err = fda_dry_run(argv[1:])
            assert code == 0, f"{name}: `{command}` is refused: {err}"
    for stem, params in PARAMS.items():
        declared = pm.inspect_notebook(str(ROOT / "notebooks" / f"{stem}.ipynb"))
        assert set(params) <= set(declared), (stem, sorted(set(params) - set(declared)))


def test_every_guard_has_its_minutes():
    """:func:`regenerations` orders the runs by :data:`GUARD_MINUTES`: a guard added to :data:`CHEAP` without its
    minutes would fail there, on the kind of machine that made its files only."""
    assert set(GUARD_MINUTES) == set(CHEAP)
    assert all(m > 0 for m in GUARD_MINUTES.values())
