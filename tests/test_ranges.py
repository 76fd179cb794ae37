"""Declared parameter ranges (fda_core.workbook.parameters): the syntax, validation before anything runs,
``fda list``, and every notebook's defaults inside its own ranges."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import nbformat
import papermill
import pytest

from fda_core.workbook import discovery, parameters
from fda_core.workbook.cli import main
from fda_core.workbook.parameters import Range, parse_range

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize(
    ("help_text", "expected", "rest"),
    [
        ("β of FedDA (weight of the source part) [0, 1]", Range(0, 1), "β of FedDA (weight of the source part)"),
        ("a fraction (0, 1]", Range(0, 1, low_open=True), "a fraction"),
        ("momentum [0, 1)", Range(0, 1, high_open=True), "momentum"),
        ("level (0, 1)", Range(0, 1, True, True), "level"),
        ("parts ≥ 2", Range(2), "parts"),
        ("lr > 0", Range(0, low_open=True), "lr"),
        ("a cap ≤ 1e3", Range(high=1000.0), "a cap"),
        ("below < -0.5", Range(high=-0.5, high_open=True), "below"),
        ("[1, inf)", Range(1), ""),
        ("(-inf, 2]", Range(high=2), ""),
        ("in [0, 1] (weight of the source part)", None, "in [0, 1] (weight of the source part)"),  # not trailing
        ("rounds (paper: 50)", None, "rounds (paper: 50)"),
        ("x>1", None, "x>1"),  # the range must be separated from the text
        ("", None, ""),
    ],
)
def test_parse_range(help_text: str, expected: Range | None, rest: str) -> None:
    assert parse_range(help_text) == (expected, rest)


def test_range_membership_and_text() -> None:
    r = Range(0, 1, low_open=True)
    assert 0.5 in r and 1 in r and 0 not in r and math.nan not in r and str(r) == "(0, 1]"
    assert str(Range(2)) == "≥ 2" and str(Range(0, low_open=True)) == "> 0" and str(Range(0.5, 2.5)) == "[0.5, 2.5]"
    for bad in ("[1, 0]", "(1, 1]", "n >= 1", "n <= 3"):
        with pytest.raises(ValueError):
            parse_range(bad)
    with pytest.raises(ValueError, match="write ≥ 1 or \\[1, inf\\)"):
        parse_range("count >= 1")


PARAMS = """\
from typing import Optional
beta: float = 0.5  # weight of the source part [0, 1]
n: int = 3  # a count ≥ 1
lr: float = 0.1  # learning rate > 0
sizes: list = [2, 4]  # sizes ≥ 2
frac: Optional[float] = None  # optional fraction (0, 1]
name: str = "x"  # a name [0, 1]
broken: int = 1  # written with an unusable bound >= 1
device: str = "auto"  # where runs compute {"auto", "cpu", "cuda"}
parts: list = ["a"]  # parts to run {"a", "b"}
twice: str = "a"  # a set naming a value twice {"a", "a"}"""


@pytest.mark.parametrize(
    ("help_text", "expected", "rest"),
    [
        ('where runs compute {"auto", "cpu", "cuda"}', ("auto", "cpu", "cuda"), "where runs compute"),
        ('parts {"a"}', ("a",), "parts"),
        ('{ "a" , "b c", }', ("a", "b c"), ""),  # spaces inside a choice, a trailing comma
        ('"auto" (CUDA when present), "cpu" or "cuda"', None, '"auto" (CUDA when present), "cpu" or "cuda"'),
        ('a set {"a", "b"} then text', None, 'a set {"a", "b"} then text'),  # not trailing
        ("{'a', 'b'}", None, "{'a', 'b'}"),  # double quotes only, as the notebooks write their strings
        ('x{"a"}', None, 'x{"a"}'),  # separated from the text
        ("{}", None, "{}"),
    ],
)
def test_parse_choices(help_text: str, expected: tuple[str, ...] | None, rest: str) -> None:
    assert parameters.parse_choices(help_text) == (expected, rest)


def test_validate_rejects_values_outside_the_choices(ranged: Path) -> None:
    ok = parameters.validate_parameters(ranged, {"device": "cpu", "parts": '["b", "a"]'}, raw=True)
    assert ok == {"device": "cpu", "parts": ["b", "a"]}
    assert parameters.validate_parameters(ranged, {"parts": []}, raw=False) == {"parts": []}
    with pytest.raises(discovery.ParameterError) as info:
        parameters.validate_parameters(ranged, {"device": "gpu", "parts": '["a", "c"]', "twice": "a"}, raw=True)
    assert info.value.errors == [
        "parameter 'device' of 01_ranged must be one of \"auto\", \"cpu\", \"cuda\", got 'gpu'",
        "parameter 'parts' of 01_ranged: every element must be one of \"a\", \"b\", got 'c' in ['a', 'c']",
        "parameter 'twice' of 01_ranged: choices {'a'} name a value twice: ['a', 'a'] in its help comment",
    ]
    with pytest.raises(discovery.ParameterError, match="got 1 in \\['a', 1\\]"):  # a list of strings
        parameters.validate_parameters(ranged, {"parts": ["a", 1]}, raw=False)


@pytest.fixture
def ranged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "notebooks"
    d.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    cell = nbformat.v4.new_code_cell(PARAMS)
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell, nbformat.v4.new_code_cell("raise RuntimeError('must not run')")]
    nbformat.write(nb, d / "01_ranged.ipynb")
    monkeypatch.setenv("FDA_NOTEBOOKS", str(d))
    return d / "01_ranged.ipynb"


def test_validate_rejects_out_of_range(ranged: Path) -> None:
    ok = parameters.validate_parameters(ranged, {"beta": "1", "n": "1", "sizes": "[2, 3]", "frac": "none"}, raw=True)
    assert ok == {"beta": 1.0, "n": 1, "sizes": [2, 3], "frac": None}
    assert parameters.validate_parameters(ranged, {"frac": 1, "name": "zzz"}, raw=False) == {"frac": 1.0, "name": "zzz"}
    with pytest.raises(discovery.ParameterError) as info:
        parameters.validate_parameters(ranged, {"beta": "2", "n": "0", "lr": "0", "sizes": "[2, 1, 5]", "frac": "0",
                                                "broken": "3"}, raw=True)
    assert info.value.errors == [
        "parameter 'beta' of 01_ranged must be in [0, 1], got 2.0",
        "parameter 'n' of 01_ranged must be ≥ 1, got 0",
        "parameter 'lr' of 01_ranged must be > 0, got 0.0",
        "parameter 'sizes' of 01_ranged: every element must be ≥ 2, got 1 in [2, 1, 5]",
        "parameter 'frac' of 01_ranged must be in (0, 1], got 0.0",
        "parameter 'broken' of 01_ranged: unusable range >= 1 (papermill cannot parse a declaration line with two "
        "'=': write ≥ 1 or [1, inf)) in its help comment",
    ]
    with pytest.raises(discovery.ParameterError, match="must be in \\[0, 1\\], got nan"):
        parameters.validate_parameters(ranged, {"beta": "nan"}, raw=True)


def test_run_and_sweep_out_of_range_exit_2(ranged: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "1", "-p", "beta", "1.5", "--out", str(tmp_path / "o")]) == 2
    assert "parameter 'beta' of 01_ranged must be in [0, 1], got 1.5" in capsys.readouterr().err
    grid = tmp_path / "grid.yaml"
    grid.write_text("sizes: [[2, 3], [0]]\n")
    assert main(["sweep", "1", "-f", str(grid), "--out", str(tmp_path / "o")]) == 2
    assert "set #2: parameter 'sizes' of 01_ranged: every element must be ≥ 2, got 0 in [0]" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_list_shows_ranges(ranged: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "1"]) == 0
    out = capsys.readouterr().out
    assert "weight of the source part; range [0, 1]" in out
    assert "a count; range ≥ 1" in out and "sizes; each ≥ 2" in out and "optional fraction; range (0, 1]" in out
    assert 'where runs compute; one of "auto", "cpu", "cuda"' in out and 'parts to run; each one of "a", "b"' in out


def test_run_dry_run_outside_the_choices_exits_2(ranged: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A misspelt choice is refused by `fda run --dry-run` too, before any kernel starts."""
    assert main(["run", "1", "-p", "parts", '["a", "ablation"]', "--dry-run", "--out", str(tmp_path / "o")]) == 2
    assert "parameter 'parts' of 01_ranged: every element must be one of \"a\", \"b\", got 'ablation'" in capsys.readouterr().err
    assert main(["run", "1", "-p", "parts", '["b"]', "-p", "device", "cuda", "--dry-run", "--out", str(tmp_path / "o")]) == 0
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------------------------------------
# the workbook's notebooks


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_defaults_satisfy_their_ranges(nb: Path) -> None:
    declared = parameters.notebook_parameters(nb)
    defaults = parameters.default_values(nb)
    assert set(defaults) == set(declared), "every default should be a literal"
    problems = [check(name, declared[name], value, nb.stem) for name, value in defaults.items()
                for check in (parameters.check_range, parameters.check_choices)]
    assert not [p for p in problems if p], problems
    # every declaration stays readable by papermill itself (a second '=' on a line, e.g. '>=', hides it)
    assert set(papermill.inspect_notebook(str(nb))) == set(declared)


def _notebook_constants(nb: Path) -> dict[str, object]:
    """The literal constants the notebook's code cells assign at top level (``A = (...)``, ``A, B = (...), (...)``)."""
    import ast

    found: dict[str, object] = {}
    for cell in nbformat.read(nb, as_version=4).cells:
        if cell.cell_type != "code" or "parameters" in cell.metadata.get("tags", []):
            continue
        for node in ast.parse(cell.source).body:
            if not isinstance(node, ast.Assign):
                continue
            for target in node.targets:
                pairs = (zip(target.elts, node.value.elts) if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple)
                         else [(target, node.value)])
                for name, value in pairs:
                    if isinstance(name, ast.Name):
                        with contextlib.suppress(ValueError):
                            found[name.id] = ast.literal_eval(value)
    return found


def _declared_choices_sources() -> dict[tuple[str, str], tuple[str, ...]]:
    """Each declared set of choices and what the notebook checks it against: the library's constant, the notebook's
    own (a top-level constant), or the tuple its check spells out."""
    from fda_core.core.wasserstein import METHODS as WD_METHODS
    from fda_core.data.datasets.domainbed_mnist import ColoredMNIST
    from fda_core.data.datasets.semi_synthetic import _BASES, LABEL_SHIFT_PARTITIONS, NOISE_DRAWS
    from fda_core.experiments.batched_clients import CLIENT_BATCHING
    from fda_core.experiments.federated import DATA_SEEDS
    from fda_core.experiments.methods.registry import VARIANTS
    from fda_core.experiments.translation.dg_clients import CLIENT_BATCHING as DG_CLIENT_BATCHING
    from fda_core.experiments.translation.dg_study import DATASETS as DG_DATASETS
    from fda_core.experiments.translation.inb import VARIANTS as INB_VARIANTS
    from fda_core.experiments.translation.stargan_study import METRICS as STARGAN_METRICS
    from fda_core.experiments.translation.study import OPTIONS as INB_OPTIONS

    nb05 = _notebook_constants(ROOT / "notebooks" / "05_semi_synthetic.ipynb")
    methods = {"variant": tuple(VARIANTS), "data_seed": DATA_SEEDS, "client_batching": CLIENT_BATCHING}
    return {
        **{("04_real_data", k): v for k, v in methods.items()}, ("04_real_data", "baseline_options"): ("source_sweep", "defaults"),
        **{("05_semi_synthetic", k): v for k, v in methods.items()},
        ("05_semi_synthetic", "base"): _BASES, ("05_semi_synthetic", "noise_draw"): NOISE_DRAWS, ("05_semi_synthetic", "label_shift_partition"): LABEL_SHIFT_PARTITIONS,
        ("05_semi_synthetic", "sections"): nb05["SECTIONS"], ("05_semi_synthetic", "faithful_settings"): nb05["SETTINGS"],
        ("05_semi_synthetic", "ablations"): nb05["ABLATIONS"], ("05_semi_synthetic", "sweep_setting"): nb05["SWEEP_SETTINGS"],
        ("06_inb_translation", "variant"): INB_VARIANTS, ("06_inb_translation", "variants"): INB_VARIANTS,
        ("06_inb_translation", "stargan_client_batching"): DG_CLIENT_BATCHING, ("06_inb_translation", "wd_method"): WD_METHODS,
        ("06_inb_translation", "option"): tuple(INB_OPTIONS), ("06_inb_translation", "stargan_metric"): STARGAN_METRICS,
        ("07_auxiliary_tasks", "client_batching"): CLIENT_BATCHING, ("07_auxiliary_tasks", "fda_baselines"): ("FADA", "KD3A"),
        ("08_domain_generalisation", "client_batching"): DG_CLIENT_BATCHING, ("08_domain_generalisation", "dataset"): DG_DATASETS,
        ("08_domain_generalisation", "option"): tuple(INB_OPTIONS), ("09_flower", "target"): tuple(ColoredMNIST.ENVIRONMENTS),
    }


def test_declared_choices_are_the_ones_the_code_checks() -> None:
    """Every declared set of choices is the set the notebook or the library checks (``fda run`` refuses the rest before a
    kernel starts, the notebook's own check when it runs in Jupyter); a set spelt out in a notebook's check is there."""
    sources = _declared_choices_sources()
    declared = {(nb.stem, name): parameters.parameter_choices(info) for nb in NOTEBOOKS
                for name, info in parameters.notebook_parameters(nb).items() if parameters.parameter_choices(info)}
    assert set(declared) == set(sources)
    for key, choices in declared.items():
        assert choices == tuple(sources[key]), key
    for stem, name in (("04_real_data", "baseline_options"), ("07_auxiliary_tasks", "fda_baselines")):
        code = "".join(c.source for c in nbformat.read(ROOT / "notebooks" / f"{stem}.ipynb", as_version=4).cells
                       if c.cell_type == "code" and "parameters" not in c.metadata.get("tags", []))
        assert f"not in {sources[(stem, name)]!r}".replace("'", '"') in code, (stem, name)


def test_notebooks_declare_ranges() -> None:
    """The notebooks annotated here (01, 02, 03, 06) give their numeric parameters a range."""
    for stem, names in {
        "01_delta_errors": ["beta", "delta_bar", "tau2", "m", "mc_draws", "mc_parts", "real_pool", "seed"],
        "02_phase_diagram": ["beta", "lr", "momentum", "n_parts", "n_trials", "steps", "n_sizes", "seed"],
        "03_unbiased_estimators": ["B_values", "n_values", "level", "n_draws", "gauss_m", "seed"],
        "06_inb_translation": ["L", "K", "J", "V", "J_values", "V_values", "wd_reg", "threads", "seed"],
    }.items():
        declared = parameters.notebook_parameters(ROOT / "notebooks" / f"{stem}.ipynb")
        assert [n for n in names if parameters.parameter_range(declared[n]) is None] == [], stem


def test_run_01_beta_2_exits_2_before_executing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("FDA_NOTEBOOKS", raising=False)
    sentinel = tmp_path / "figures"
    sentinel.mkdir()
    (sentinel / "phase_boundaries.csv").write_text("sentinel")
    out = tmp_path / "executed"
    assert main(["run", "01", "-p", "beta", "2", "-p", "figures_dir", str(sentinel), "--out", str(out)]) == 2
    assert "parameter 'beta' of 01_delta_errors must be in [0, 1], got 2.0" in capsys.readouterr().err
    assert [p.name for p in sentinel.iterdir()] == ["phase_boundaries.csv"]
    assert (sentinel / "phase_boundaries.csv").read_text() == "sentinel"
    assert not out.exists()
    # with the default figures_dir: the committed figures are not touched either
    committed = ROOT / "figures" / "01_delta_errors"
    before = {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in committed.rglob("*")} if committed.exists() else {}
    assert main(["run", "01", "-p", "beta", "2", "--out", str(out)]) == 2
    after = {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in committed.rglob("*")} if committed.exists() else {}
    assert after == before and not out.exists()
