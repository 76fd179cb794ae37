"""Project set-up: dependency lists in step, README commands, CI, notebooks reviewable."""

import json
import re
from pathlib import Path

import pytest
import yaml

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

ROOT = Path(__file__).resolve().parent.parent


def _name(req: str) -> str:
    return re.split(r"[<>=!~ \[]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_environment_yml_matches_pyproject():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = set(pyproject["dependencies"]) | set(pyproject["optional-dependencies"]["dev"])
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    got = {p for p in pip if not p.startswith("-e")}
    assert got == wanted, f"only in environment.yml: {got - wanted}; only in pyproject: {wanted - got}"
    assert "-e ." in pip
    assert "torch==2.13.0" in wanted  # the offline CPU wheel; looser pins pull CUDA builds
    assert not any(_name(r) == "torchvision" for r in wanted)


def _constraints() -> dict[str, str]:
    """constraints.txt's pins by canonical name; each line 'name==version', no package twice."""
    from packaging.utils import canonicalize_name

    pins: dict[str, str] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep and version and " " not in line, f"constraints.txt: {line!r} is not 'name==version'"
            assert canonicalize_name(name) not in pins, f"constraints.txt pins {name} twice"
            pins[canonicalize_name(name)] = version
    return pins


def test_constraints_pin_every_requirement_within_pyproject():
    """constraints.txt (what `make setup` installs) pins each package of pyproject.toml, the extras included, at a
    version its range admits, and pins nothing twice."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [Requirement(r) for r in pyproject["dependencies"]]
    wanted += [Requirement(r) for extra in pyproject["optional-dependencies"].values() for r in extra]
    pins = _constraints()
    for req in wanted:
        name = canonicalize_name(req.name)
        assert name in pins, f"constraints.txt does not pin {req.name} (pyproject.toml: {req})"
        assert req.specifier.contains(pins[name], prereleases=True), f"constraints.txt: {req.name}=={pins[name]} is outside {req}"
    assert pins["torch"] == "2.13.0"  # the local CPU wheel (a pin with +cpu would not match elsewhere)
    assert "-c constraints.txt" in (ROOT / "Makefile").read_text()


def test_gpu_wheels_pin_what_the_set_up_pins():
    """benchmarks/gpu_wheels.sh carries the papermill stack, mlxtend, SurvSet and POT to the GPU machine: at the
    versions of constraints.txt, so the device runs the notebooks with the CPU runs' libraries."""
    from packaging.utils import canonicalize_name

    script = (ROOT / "benchmarks" / "gpu_wheels.sh").read_text()
    lock = _constraints()
    carried = {canonicalize_name(n): v for n, v in re.findall(r"(?<![\w.-])([A-Za-z][\w.-]*)==([\w.+]+)", script)}
    assert len(carried) > 30 and "constraints.txt" in script
    differ = {name: (v, lock.get(name)) for name, v in carried.items() if lock.get(name) != v}
    assert not differ, f"gpu_wheels.sh pins differ from constraints.txt (script, lock): {differ}"


def test_readme_commands_and_ci():
    readme = (ROOT / "README.md").read_text()
    first = readme[: readme.index("\n## ")]
    assert "make figures" in first and "make test" in first
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci


def test_top_level_layout():
    for name in ("notebooks", "fda_core", "figures", "tests", "environment.yml"):
        assert (ROOT / name).exists(), name


def test_notebooks_have_parameters_and_no_outputs():
    notebooks = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert notebooks
    for nb_path in notebooks:
        nb = json.loads(nb_path.read_text())
        tagged = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
        assert len(tagged) == 1, f"{nb_path.name}: exactly one cell tagged 'parameters'"
        for line in "".join(tagged[0]["source"]).splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                assert re.match(r"^\w+: [\w\[\], |]+ = .+  # .+", line), f"{nb_path.name}: '{line}' is not 'name: type = default  # help'"
        ids = [c.get("id") for c in nb["cells"]]
        # nbformat >= 4.5 requires a unique id per cell (a missing one is a validation warning today and
        # "will become a hard error" in nbformat)
        assert all(ids) and len(set(ids)) == len(ids), f"{nb_path.name}: every cell needs a unique 'id'"
        for c in nb["cells"]:
            if c["cell_type"] == "code":
                assert not c.get("outputs"), f"{nb_path.name}: outputs must be stripped (keep notebooks reviewable)"


