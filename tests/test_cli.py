"""Tests of the ``fda`` command (fda_core.workbook.cli) and its helpers (fda_core.workbook).

Tiny notebooks are built in tmp_path and FDA_NOTEBOOKS points there. Kernel starts cost ~2 s each,
so only a dozen executions happen here; everything else uses --dry-run or the helpers directly.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

from fda_core.workbook import discovery, parameters, sweeps
from fda_core.workbook.cli import main

KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}

PARAMS_01 = """\
from typing import Optional
n: int = 3  # number of things
name: str = "a"  # a name
xs: list = [1, 2]  # values
flag: bool = False  # a flag
ratio: float = 0.5  # a ratio
opt: Optional[int] = None  # optional count
maybe: int | None = None  # union with None
pairs: dict[str, int] = {}  # a mapping
anything = 5
out_file: str = ""  # where to write the values (json)"""

BODY_01 = """\
import json, os
if out_file:
    with open(out_file, "w") as fh:
        json.dump({"n": n, "name": name, "xs": xs, "flag": flag, "ratio": ratio, "cwd": os.getcwd(),
                   "types": {k: type(v).__name__ for k, v in dict(n=n, name=name, xs=xs, flag=flag, ratio=ratio).items()}}, fh)
print(n, name, xs, flag)"""

PARAMS_02 = """\
fail: bool = False  # raise on purpose
k: int = 0  # a knob"""

BODY_02 = """\
x = k + 1
if fail:
    raise ValueError(f"boom k={k}")"""


def _write_nb(path: Path, params: str, *bodies: str, kernelspec: bool = True) -> Path:
    nb = nbformat.v4.new_notebook()
    if kernelspec:
        nb.metadata["kernelspec"] = KERNELSPEC
    cell = nbformat.v4.new_code_cell(params)
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [nbformat.v4.new_markdown_cell("# test notebook"), cell, *(nbformat.v4.new_code_cell(b) for b in bodies)]
    nbformat.write(nb, path)
    return path


@pytest.fixture
def nbdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "notebooks"
    d.mkdir()
    _write_nb(d / "01_params.ipynb", PARAMS_01, BODY_01)
    _write_nb(d / "02_fail.ipynb", PARAMS_02, BODY_02)
    _write_nb(d / "10_tenth.ipynb", "seed: int = 0  # seed", "pass", kernelspec=False)
    _write_nb(d / "scratch.ipynb", "z: int = 1", "pass")  # not numbered: not in 'all'
    monkeypatch.setenv("FDA_NOTEBOOKS", str(d))
    return d


def _executed_params(path: Path) -> dict:
    return nbformat.read(path, as_version=4).metadata["papermill"]["parameters"]


# ------------------------------------------------------------------------------------------------
# discovery and resolution


def test_find_and_resolve(nbdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert [p.name for p in discovery.find_notebooks()] == ["01_params.ipynb", "02_fail.ipynb", "10_tenth.ipynb"]
    p01 = nbdir / "01_params.ipynb"
    for spec in ["1", "01", "001", "01_params", "01_params.ipynb", "params", str(p01)]:
        assert discovery.resolve_notebook(spec) == p01, spec
    assert discovery.resolve_notebook("10") == nbdir / "10_tenth.ipynb"
    assert discovery.resolve_notebook("scratch") == nbdir / "scratch.ipynb"
    monkeypatch.chdir(tmp_path)
    assert discovery.resolve_notebook("notebooks/02_fail.ipynb") == nbdir / "02_fail.ipynb"
    assert discovery.resolve_notebooks(["all"]) == discovery.find_notebooks()
    assert discovery.resolve_notebooks(["2", "all"])[0] == nbdir / "02_fail.ipynb"
    assert len(discovery.resolve_notebooks(["2", "all"])) == 3
    with pytest.raises(discovery.NotebookNotFoundError, match="01_params, 02_fail, 10_tenth"):
        discovery.resolve_notebook("7")
    with pytest.raises(discovery.NotebookNotFoundError, match="unknown notebook 'nope'"):
        discovery.resolve_notebook("nope")


def test_notebooks_dir_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FDA_NOTEBOOKS", raising=False)
    assert discovery.notebooks_dir() == Path(discovery.__file__).resolve().parents[2] / "notebooks"
    assert discovery.repo_root() == Path(discovery.__file__).resolve().parents[2]


def test_unknown_notebook_exits_2(nbdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "99", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "no notebook numbered 99" in err and "01_params" in err and "02_fail" in err
    assert main(["list", "nope"]) == 2


# ------------------------------------------------------------------------------------------------
# list


def test_list_shows_parameters(nbdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "[01] 01_params" in out and "[02] 02_fail" in out and "[10] 10_tenth" in out
    assert "scratch" not in out
    assert "n: int = 3" in out and "number of things" in out
    assert 'name: str = "a"' in out and "a name" in out
    assert "xs: list = [1, 2]" in out and "flag: bool = False" in out and "a flag" in out
    assert "maybe: int | None = None" in out and "union with None" in out  # papermill's regex misses it
    assert "anything: ? = 5" in out
    assert "seed: int = 0" in out  # notebook without kernelspec metadata
    assert out.index("01_params") < out.index("02_fail") < out.index("10_tenth")

    assert main(["list", "2"]) == 0
    out = capsys.readouterr().out
    assert "02_fail" in out and "fail: bool = False" in out and "raise on purpose" in out
    assert "01_params" not in out


def test_broken_notebook_is_reported(nbdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (nbdir / "03_broken.ipynb").write_text("{ not json")
    assert main(["list"]) == 1  # the others are still listed
    captured = capsys.readouterr()
    assert "01_params" in captured.out and "cannot read the parameters of notebook" in captured.out
    assert main(["run", "3", "--dry-run"]) == 2
    assert "03_broken" in capsys.readouterr().err


def test_notebook_parameters_matches_papermill(nbdir: Path) -> None:
    import papermill

    path = nbdir / "01_params.ipynb"
    ours = parameters.notebook_parameters(path)
    theirs = papermill.inspect_notebook(str(path))
    assert list(ours) == ["n", "name", "xs", "flag", "ratio", "opt", "maybe", "pairs", "anything", "out_file"]
    for name, info in theirs.items():
        assert ours[name] == info
    assert ours["maybe"] == {"name": "maybe", "inferred_type_name": "int | None", "default": "None", "help": "union with None"}


# ------------------------------------------------------------------------------------------------
# validation (no execution)


@pytest.mark.parametrize(
    ("annotation", "raw", "expected"),
    [
        ("int", "007", 7),
        ("int", "-3", -3),
        ("str", "007", "007"),
        ("str", " x y ", " x y "),
        ("float", "1e-3", 1e-3),
        ("float", "2", 2.0),
        ("bool", "YES", True),
        ("bool", "0", False),
        ("bool", "False", False),
        ("list", "[1, 2]", [1, 2]),
        ("list[int]", "[1, 2]", [1, 2]),
        ("list[float]", "[1, 2.5]", [1.0, 2.5]),
        ("dict", "{a: 1}", {"a": 1}),
        ("dict[str, int]", '{"a": 1}', {"a": 1}),
        ("Optional[int]", "none", None),
        ("Optional[int]", "12", 12),
        ("int | None", "NULL", None),
        ("str | None", "007", "007"),
        ("Union[int, str]", "007", 7),
        ("Union[int, str]", "abc", "abc"),
        ("Literal['a', 'b']", "b", "b"),
        ("None", "[1, 2]", [1, 2]),
        ("None", "abc", "abc"),
        ("tuple[int, int]", "[1, 2]", [1, 2]),
    ],
)
def test_coerce_raw(annotation: str, raw: str, expected: object) -> None:
    value = parameters.coerce_raw(parameters.parse_type(annotation), raw)
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize(
    ("annotation", "raw"),
    [("int", "1.5"), ("int", "abc"), ("int", ""), ("float", "x"), ("bool", "maybe"), ("list", "1"),
     ("list[int]", "[1, a]"), ("dict", "[1]"), ("int", "none"), ("Literal['a', 'b']", "c"), ("tuple[int, int]", "[1]")],
)
def test_coerce_raw_rejects(annotation: str, raw: str) -> None:
    with pytest.raises(ValueError):
        parameters.coerce_raw(parameters.parse_type(annotation), raw)


@pytest.mark.parametrize(
    ("annotation", "value", "ok"),
    [("int", 3, True), ("int", True, False), ("int", 3.0, False), ("float", 3, True), ("float", True, False),
     ("str", "x", True), ("str", 7, False), ("bool", 1, False), ("bool", False, True), ("list", [1], True),
     ("list", "1,2", False), ("list[int]", [1, "2"], False), ("dict", {"a": 1}, True), ("Optional[int]", None, True),
     ("int", None, False), ("int | None", None, True), ("None", object, True)],
)
def test_conform_value(annotation: str, value: object, ok: bool) -> None:
    spec = parameters.parse_type(annotation)
    if ok:
        parameters.conform_value(spec, value)
    else:
        with pytest.raises(ValueError):
            parameters.conform_value(spec, value)


def test_validate_parameters_messages(nbdir: Path) -> None:
    path = nbdir / "01_params.ipynb"
    assert parameters.validate_parameters(path, {"n": "007", "name": "007", "xs": "[3]", "flag": "yes", "opt": "null"}, raw=True) == {
        "n": 7, "name": "007", "xs": [3], "flag": True, "opt": None,
    }
    assert parameters.validate_parameters(path, {"ratio": 1, "n": 2}, raw=False) == {"ratio": 1.0, "n": 2}
    with pytest.raises(discovery.ParameterError) as info:
        parameters.validate_parameters(path, {"n": "12x", "name": 7, "bogus": 1, "flag": 1}, raw=False)
    errors = info.value.errors
    assert "parameter 'n' of 01_params expects int, got str '12x'" in errors
    assert any(e.startswith("parameter 'name' of 01_params expects str, got int 7") and "quote" in e for e in errors)
    assert "parameter 'flag' of 01_params expects bool, got int 1" in errors
    assert any(e.startswith("unknown parameter 'bogus' for 01_params; allowed: n, name, xs, flag") for e in errors)


def test_run_bad_int_exits_2(nbdir: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["run", "1", "-p", "n", "abc", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "parameter 'n' of 01_params expects int, got 'abc' (not an integer)" in err
    assert not (tmp_path / "o").exists()  # nothing ran, nothing was written
    assert main(["run", "1", "-p", "n", "1.5", "--dry-run"]) == 2
    assert "expects int" in capsys.readouterr().err


def test_run_unknown_parameter_exits_2(nbdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "1", "-p", "nn", "3", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "unknown parameter 'nn' for 01_params; allowed: n, name, xs, flag" in err
    # several notebooks: a parameter must be declared by at least one, and goes only to those
    assert main(["run", "1", "2", "-p", "zzz", "3", "--dry-run"]) == 2
    assert "none of 01_params, 02_fail declares it" in capsys.readouterr().err
    assert main(["run", "1", "2", "-p", "k", "4", "-p", "n", "5", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "01_params" in out and "[n=5]" in out and "[k=4]" in out


def test_run_refuses_to_overwrite_source(nbdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "1", "--out", str(nbdir), "--dry-run"]) == 2
    assert "holds the notebook 01_params.ipynb itself" in capsys.readouterr().err


def test_run_params_file_typed(nbdir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pfile = tmp_path / "p.yaml"
    pfile.write_text("n_bad: 1\n")
    assert main(["run", "1", "-f", str(pfile), "--dry-run"]) == 2
    assert "unknown parameter 'n_bad'" in capsys.readouterr().err
    pfile.write_text("n: '12x'\nxs: [1, 2, 3]\n")
    assert main(["run", "1", "-f", str(pfile), "--dry-run"]) == 2
    assert "parameter 'n' of 01_params expects int, got str '12x'" in capsys.readouterr().err
    # -p wins over -f
    assert main(["run", "1", "-f", str(pfile), "-p", "n", "4", "--dry-run"]) == 0
    assert "n=4" in capsys.readouterr().out
    pfile.write_text("- 1\n")
    assert main(["run", "1", "-f", str(pfile), "--dry-run"]) == 2
    assert "must hold a mapping" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------
# run (executes notebooks)


def test_run_injects_typed_values(nbdir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_dir, result = tmp_path / "executed", tmp_path / "values.json"
    pfile = tmp_path / "p.yaml"
    pfile.write_text("flag: true\nratio: 2\n")
    code = main(["run", "01_params", "-p", "name", "007", "-p", "n", "007", "-p", "xs", "[3, 4]",
                 "-p", "out_file", str(result), "-f", str(pfile), "--out", str(out_dir), "--no-progress"])
    assert code == 0, capsys.readouterr().err
    values = json.loads(result.read_text())
    assert values["n"] == 7 and values["name"] == "007" and values["xs"] == [3, 4]
    assert values["flag"] is True and values["ratio"] == 2.0
    assert values["types"] == {"n": "int", "name": "str", "xs": "list", "flag": "bool", "ratio": "float"}
    assert Path(values["cwd"]) == discovery.repo_root()  # default working directory: the repository root
    executed = out_dir / "01_params.ipynb"
    assert executed.exists()
    assert _executed_params(executed)["name"] == "007"
    assert not [p for p in out_dir.iterdir() if p.name != "01_params.ipynb"]  # no temp files left
    assert "ok 01_params" in capsys.readouterr().out


def test_run_failure_reports_cell_and_stops(nbdir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "executed"
    code = main(["run", "2", "1", "-p", "fail", "true", "-p", "k", "5", "--out", str(out_dir), "--no-progress",
                 "--cwd", str(tmp_path)])
    assert code == 1
    err = capsys.readouterr().err
    assert "FAILED 02_fail" in err and "ValueError: boom k=5" in err
    assert "cell 3 (In [3])" in err  # markdown, parameters, injected-parameters (In [2]), failing cell
    assert 'line 3: raise ValueError(f"boom k={k}")' in err
    assert "1 notebook(s) not run" in err
    failed = out_dir / "02_fail.failed.ipynb"
    assert failed.exists() and not (out_dir / "02_fail.ipynb").exists()
    assert not (out_dir / "01_params.ipynb").exists()  # stopped at the first failure
    nb = nbformat.read(failed, as_version=4)
    assert any(o.get("ename") == "ValueError" for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))

    # --keep-going runs the rest; exit code still 1
    code = main(["run", "2", "1", "-p", "fail", "true", "--out", str(out_dir), "--no-progress", "--keep-going",
                 "--cwd", str(tmp_path)])
    assert code == 1
    assert (out_dir / "01_params.ipynb").exists() and (out_dir / "02_fail.failed.ipynb").exists()

    # a later success replaces the failed copy
    assert main(["run", "2", "--out", str(out_dir), "--no-progress", "--cwd", str(tmp_path)]) == 0
    assert (out_dir / "02_fail.ipynb").exists() and not failed.exists()


class _Terminal:
    """A stderr that says it is a terminal and keeps what is written (thread-safe enough for tqdm's lock)."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def write(self, text: str) -> int:
        self.parts.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return True

    def text(self) -> str:
        return "".join(self.parts)


@pytest.mark.timeout(300)
def test_run_side_by_side_shows_each_notebooks_cells_on_a_terminal_only(nbdir: Path, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """fda run --jobs 2: on a terminal one cell bar per running notebook, named after it, on the lines below the
    overall bar (a long main job shows where each kernel is); into a file (a log) none, only the overall bar."""
    terminal, captured = _Terminal(), sys.stderr
    monkeypatch.setattr(sys, "stderr", terminal)
    try:
        code = main(["run", "1", "10", "--jobs", "2", "--out", str(tmp_path / "tty"), "--cwd", str(tmp_path)])
    finally:
        monkeypatch.setattr(sys, "stderr", captured)
    text = terminal.text()
    assert code == 0, text
    for stem in ("01_params", "10_tenth"):  # 3 code cells each: parameters, injected parameters, body
        assert re.search(rf"\r{stem}: +\d+%\|[^|]*\| [0-3]/3 \[[^]]*cell", text), (stem, text)
    assert "fda run:" in text  # the overall bar, on the first line

    code = main(["run", "1", "10", "--jobs", "2", "--out", str(tmp_path / "log"), "--cwd", str(tmp_path)])
    assert code == 0
    err = capsys.readouterr().err
    assert "fda run:" in err and "cell" not in err and "01_params:" not in err


# ------------------------------------------------------------------------------------------------
# sweeps


def test_load_parameter_sets_shapes(tmp_path: Path) -> None:
    grid = {"n": [1, 2], "name": ["a", "b"], "flag": True}
    sets = sweeps.load_parameter_sets(grid)
    assert sets == [
        {"n": 1, "name": "a", "flag": True}, {"n": 1, "name": "b", "flag": True},
        {"n": 2, "name": "a", "flag": True}, {"n": 2, "name": "b", "flag": True},
    ]
    assert sweeps.load_parameter_sets({"grid": grid}) == sets
    assert sweeps.load_parameter_sets([{"n": 1}, {"n": 2, "xs": [1]}]) == [{"n": 1}, {"n": 2, "xs": [1]}]
    assert sweeps.load_parameter_sets({"sets": [{"n": 1}]}) == [{"n": 1}]
    assert sweeps.load_parameter_sets({"xs": [[1, 2]]}) == [{"xs": [1, 2]}]
    f = tmp_path / "g.yaml"
    f.write_text(yaml.safe_dump(grid))
    assert sweeps.load_parameter_sets(f) == sets
    for bad in (3, [1, 2], {"n": []}, []):
        with pytest.raises(discovery.NotebookError):
            sweeps.load_parameter_sets(bad)


def test_sweep_output_name() -> None:
    order = ["n", "name", "xs"]
    assert sweeps.sweep_output_name("01_p", {"name": "a b/c", "n": 3}, order) == "01_p__n=3__name=a_b_c.ipynb"
    assert sweeps.sweep_output_name("01_p", {"xs": [1, 2.5], "n": -1}, order) == "01_p__n=-1__xs=1,2.5.ipynb"
    assert sweeps.sweep_output_name("01_p", {}, order) == "01_p__defaults.ipynb"
    long1 = sweeps.sweep_output_name("01_p", {"name": "x" * 300}, order)
    long2 = sweeps.sweep_output_name("01_p", {"name": "x" * 299 + "y"}, order)
    assert len(long1) <= 150 and long1.endswith(".ipynb") and long1 != long2
    assert long1 == sweeps.sweep_output_name("01_p", {"name": "x" * 300}, order)  # deterministic


def test_sweep_validation_exits_2(nbdir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grid = tmp_path / "grid.yaml"
    grid.write_text("n: [1, '2x']\nname: [a]\n")
    assert main(["sweep", "1", "-f", str(grid), "--out", str(tmp_path / "s"), "--no-progress"]) == 2
    assert "set #2: parameter 'n' of 01_params expects int, got str '2x'" in capsys.readouterr().err
    grid.write_text("n: [1, 2]\n")
    assert main(["sweep", "1", "-f", str(grid), "-p", "n", "3", "--dry-run"]) == 2
    assert "both swept and fixed" in capsys.readouterr().err
    assert main(["sweep", "1", "-f", str(grid), "-p", "nope", "3", "--dry-run"]) == 2
    assert "unknown parameter 'nope'" in capsys.readouterr().err
    assert main(["sweep", "1", "-f", str(tmp_path / "missing.yaml"), "--dry-run"]) == 2
    assert "cannot read sweep file" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def test_sweep_grid_parallel_then_skip(nbdir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grid, out_dir = tmp_path / "grid.yaml", tmp_path / "sweep"
    grid.write_text("n: [1, 2]\nname: ['007', b]\n")
    cwd_before = os.getcwd()
    code = main(["sweep", "01_params", "-f", str(grid), "--jobs", "2", "-p", "flag", "true",
                 "--out", str(out_dir), "--no-progress", "--cwd", str(tmp_path)])
    assert code == 0, capsys.readouterr().err
    assert os.getcwd() == cwd_before  # executions in threads do not chdir the process
    names = sorted(p.name for p in out_dir.iterdir())
    assert names == [
        "01_params__n=1__name=007__flag=True.ipynb", "01_params__n=1__name=b__flag=True.ipynb",
        "01_params__n=2__name=007__flag=True.ipynb", "01_params__n=2__name=b__flag=True.ipynb",
    ]
    assert _executed_params(out_dir / names[0]) == {"n": 1, "name": "007", "flag": True}
    assert "4 done, 0 skipped, 0 failed" in capsys.readouterr().out

    assert main(["sweep", "1", "-f", str(grid), "-p", "flag", "true", "--out", str(out_dir), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "0 done, 4 skipped, 0 failed" in out and "skipped (exists): 01_params__n=1__name=007__flag=True.ipynb" in out


def test_sweep_failure_summary(nbdir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grid, out_dir = tmp_path / "grid.yaml", tmp_path / "sweep"
    grid.write_text(yaml.safe_dump({"sets": [{"fail": False, "k": 1}, {"fail": True, "k": 2}]}))
    code = main(["sweep", "2", "-f", str(grid), "--out", str(out_dir), "--no-progress", "--cwd", str(tmp_path)])
    assert code == 1
    captured = capsys.readouterr()
    assert "1 done, 0 skipped, 1 failed" in captured.out
    assert "[fail=True, k=2] cell 3 (In [3]): ValueError: boom k=2" in captured.err
    assert (out_dir / "02_fail__fail=False__k=1.ipynb").exists()
    assert (out_dir / "02_fail__fail=True__k=2.failed.ipynb").exists()
    assert not (out_dir / "02_fail__fail=True__k=2.ipynb").exists()
    # a re-run retries only the failed set (dry run shows the plan)
    assert main(["sweep", "2", "-f", str(grid), "--out", str(out_dir), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "skip (exists) 02_fail__fail=False__k=1.ipynb" in out and "run           02_fail__fail=True__k=2.ipynb" in out


# ------------------------------------------------------------------------------------------------
# entry points


def test_help_returns_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert "sweep" in capsys.readouterr().out
    for cmd in ("list", "run", "sweep"):
        assert main([cmd, "--help"]) == 0
    assert main([]) == 2
    assert main(["sweep", "1"]) == 2  # -f is required


def test_python_m_fda_core_help() -> None:
    proc = subprocess.run([sys.executable, "-m", "fda_core", "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "usage: fda" in proc.stdout and "run" in proc.stdout and "sweep" in proc.stdout


# what a command that executes nothing imports: the papermill engine (papermill, nbclient, nbformat and jsonschema,
# about 3 s) is imported by execute() alone (fda_core.workbook.stalls), and torch only by what needs it (fda data
# reads fda_core.data.packaged, which imports no torch); `fda --help` took 7.7 s before, 0.4 s after
_NO_ENGINE = ("papermill", "nbclient", "nbformat", "jsonschema", "torch")
_IMPORT_PROBE = """\
import contextlib, io, json, sys
from fda_core.workbook.cli import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    rc = main(json.loads(sys.argv[1]))
print(json.dumps({"rc": rc, "modules": [m for m in json.loads(sys.argv[2]) if m in sys.modules]}))
"""


@pytest.mark.parametrize("argv, absent", [
    (["--help"], _NO_ENGINE),
    (["run", "--help"], _NO_ENGINE),
    (["data"], _NO_ENGINE),
    (["timings", "--executed", "no-such-folder"], _NO_ENGINE),
    (["list"], ("torch",)),  # reads the parameters with papermill and nbformat
])
def test_commands_import_only_what_they_use(argv: list[str], absent: tuple[str, ...], tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", _IMPORT_PROBE, json.dumps(argv), json.dumps(list(absent))],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["rc"] in (0, 2), report  # timings on a missing folder: 2, with its message
    assert report["modules"] == [], f"fda {' '.join(argv)} imported {report['modules']}"


def test_execute_registers_the_engine_it_names() -> None:
    """The engine name the runner passes to papermill is the one the watchdog registers (imported lazily)."""
    from papermill.engines import papermill_engines

    from fda_core.workbook import runner, stalls, watchdog

    assert runner.ENGINE_NAME == stalls.ENGINE_NAME == watchdog.ENGINE_NAME
    assert papermill_engines.get_engine(stalls.ENGINE_NAME) is watchdog.StallWatchingEngine
    assert runner.KernelStallError is watchdog.KernelStallError
