"""The package's layers: imports point downward only (README § Architecture).

common ← core ← data ← experiments ← viz ← workbook. A module may import its own layer and the layers
below it, never a layer above; the package root (``fda_core/__init__.py``, ``__main__.py``) is the
public facade and may import any layer. Every import statement counts, including those inside
functions. Third-party libraries are restricted per layer too: maths never draws or tabulates, nothing
below the workbook drives notebooks.
"""

import sys
from pathlib import Path

import pytest

from fda_core.common.provenance import imports_of

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "fda_core"
LAYERS = ["common", "core", "data", "experiments", "viz", "workbook"]
#: third-party top-level modules a layer must not import (its own and the layers above it may)
FORBIDDEN = {
    "common": {"pandas", "matplotlib", "seaborn", "ipywidgets", "papermill", "nbclient", "nbformat", "sympy", "ot"},
    "core": {"pandas", "matplotlib", "seaborn", "ipywidgets", "papermill", "nbclient", "nbformat"},
    "data": {"matplotlib", "seaborn", "ipywidgets", "papermill", "nbclient", "nbformat"},
    "experiments": {"matplotlib", "seaborn", "ipywidgets", "papermill", "nbclient", "nbformat"},
    "viz": {"papermill", "nbclient", "nbformat"},
    "workbook": set(),
}


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _module_name(path: Path) -> list[str]:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute dotted name) of every import in ``path`` (relative imports resolved), without the
    ``package.name`` guesses for names imported from a package that are not modules."""
    name = ".".join(_module_name(path))
    found = imports_of(path, name)
    return [(line, dotted) for line, dotted in found
            if dotted.split(".")[0] != "fda_core" or _is_module(dotted) or (line, dotted.rsplit(".", 1)[0]) not in found]


def _is_module(dotted: str) -> bool:
    base = ROOT.joinpath(*dotted.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _layer(dotted: str) -> str | None:
    parts = dotted.split(".")
    if parts[0] != "fda_core" or len(parts) < 2:
        return None
    return parts[1] if parts[1] in LAYERS else "<root>"


def test_every_module_belongs_to_a_layer():
    stray = [str(p.relative_to(ROOT)) for p in _modules()
             if p.parent != PACKAGE and _module_name(p)[1] not in LAYERS]
    loose = [p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    assert not stray and not loose, f"modules outside the layers {LAYERS}: {stray + loose}"


def test_imports_point_downward():
    problems = []
    for path in _modules():
        own = _layer(".".join(_module_name(path)))
        if own in (None, "<root>"):
            continue  # the facade
        for line, dotted in _imports(path):
            target = _layer(dotted)
            if target is None:
                top = dotted.split(".")[0]
                if top in FORBIDDEN[own]:
                    problems.append(f"{path.relative_to(ROOT)}:{line} imports {top} (not allowed in {own}/)")
                continue
            if target == "<root>":
                problems.append(f"{path.relative_to(ROOT)}:{line} imports the package facade {dotted}")
            elif LAYERS.index(target) > LAYERS.index(own):
                problems.append(f"{path.relative_to(ROOT)}:{line} ({own}) imports {dotted} ({target}, a higher layer)")
    assert not problems, "\n".join(problems)


def test_the_checker_catches_an_upward_import(tmp_path, monkeypatch):
    """The parser resolves relative imports: an upward one written relatively is still found."""
    fake = tmp_path / "fda_core" / "core"
    fake.mkdir(parents=True)
    (tmp_path / "fda_core" / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("")
    bad = fake / "bad.py"
    bad.write_text("def f():\n    from ..viz.plotting import set_style\n    import pandas\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    found = _imports(bad)
    assert (2, "fda_core.viz.plotting") in found and (3, "pandas") in found
    assert _layer("fda_core.viz.plotting") == "viz"


@pytest.mark.parametrize("layer", LAYERS)
def test_layer_imports_on_its_own(layer):
    """Importing a layer does not need anything above it (a fresh interpreter, only that layer imported)."""
    import subprocess

    code = (f"import sys, importlib, pkgutil, fda_core.{layer} as L\n"
            f"[importlib.import_module(m.name) for m in pkgutil.walk_packages(L.__path__, L.__name__ + '.')]\n"
            f"above = {LAYERS[LAYERS.index(layer) + 1:]!r}\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'fda_core' and len(m.split('.')) > 1 "
            "and m.split('.')[1] in above)\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=300)
