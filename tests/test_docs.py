"""The repository is self-contained: its own docs/ hold the theory and settings, and every citation of
them resolves.

(a) No file cites the external spec files or ``shared/`` (they do not exist in a clone).
(b) Every ``docs/<name>.md § <Section>`` citation in .py / .ipynb / .md files names an existing heading.
(c) The docs files exist, are substantial and have the headings the code relies on.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
THIS = Path(__file__).resolve()

REQUIRED_HEADINGS = {
    "theory": ["Conventions", "Rules", "Layer-wise application", "Delta errors", "Optimal weights",
               "Phase diagram", "Unbiased estimators"],
    "experiments": ["Data", "Synthetic phase diagram", "Estimator checks", "Real data", "Semi-synthetic shifts",
                    "Warm-up and learning rates", "Deviations from the papers"],
    "translation": ["One INB layer", "VW histograms", "Variants", "Communication accounting", "FedDIRT"],
    "architecture": ["Data flow", "Conventions", "Layers"],
}

# Citations of material outside the repository. The spec file names are spelled in pieces so that this
# file does not match its own patterns (it is skipped anyway).
_SPEC_NAMES = "|".join(["theo" + "ry", "experi" + "ments", "in" + "b", "archi" + "tecture"])
FORBIDDEN = [
    # the shared folder next to the repository
    (re.compile(r"shared/(spec|papers)\b"), "a path under shared/"),
    # a spec file by bare name (anything not under docs/)
    (re.compile(r"(?<![\w/.-])(" + _SPEC_NAMES + r")\.md\b"), "a spec file outside docs/"),
    # "spec § Rules", "(spec: \"...\")"
    (re.compile(r"\bspec\b[\s`]*(§|:\s*\")", re.IGNORECASE), "'spec §' / 'spec:' citation"),
]

CITATION = re.compile(r"docs/([\w-]+)\.md`*\s*§\s*")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$")


def _repo_files() -> list[Path]:
    """Tracked files plus untracked, not-ignored ones (new files are checked before their first commit)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                             capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    paths = {ROOT / p for p in out.decode().split("\0") if p}
    return sorted(p for p in paths if p.is_file() and p.resolve() != THIS)


def _text(path: Path) -> str | None:
    """The file's text (a notebook: the joined sources of its cells), or None for a binary file."""
    data = path.read_bytes()
    if b"\0" in data:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if path.suffix == ".ipynb":
        cells = json.loads(text)["cells"]
        return "\n".join("".join(c["source"]) if isinstance(c["source"], list) else c["source"] for c in cells)
    return text


def headings(name: str) -> list[str]:
    """Heading texts (any level) of docs/<name>.md, outside fenced code blocks."""
    out, fenced = [], False
    for line in (DOCS / f"{name}.md").read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        m = None if fenced else HEADING.match(line)
        if m:
            out.append(m.group(1).strip())
    return out


def resolve(rest: str, heads: list[str]) -> str | None:
    """The longest heading that ``rest`` (the text after "§ ", whitespace collapsed) starts with, followed by
    the end of the text or a character that cannot continue a word (punctuation, space, backtick)."""
    best = None
    for h in heads:
        if rest.startswith(h) and (len(rest) == len(h) or not (rest[len(h)].isalnum() or rest[len(h)] in "_-")):
            if best is None or len(h) > len(best):
                best = h
    return best


def citations() -> list[tuple[str, int, str, str]]:
    """(file, line, docs name, text after §) for every docs citation in .py / .ipynb / .md files."""
    found = []
    for path in _repo_files():
        if path.suffix not in (".py", ".ipynb", ".md"):
            continue
        text = _text(path)
        if text is None:
            continue
        for m in CITATION.finditer(text):
            rest = " ".join(text[m.end(): m.end() + 200].split())
            found.append((str(path.relative_to(ROOT)), text.count("\n", 0, m.start()) + 1, m.group(1), rest))
    return found


def test_no_citation_of_files_outside_the_repository():
    bad = []
    for path in _repo_files():
        text = _text(path)
        if text is None:
            continue
        for pattern, what in FORBIDDEN:
            for m in pattern.finditer(text):
                line = text.count("\n", 0, m.start()) + 1
                bad.append(f"{path.relative_to(ROOT)}:{line}: {what}: {m.group(0)!r}")
    assert not bad, "cite docs/<file>.md § <section> instead:\n" + "\n".join(bad)


def test_every_docs_citation_resolves_to_a_heading():
    found = citations()
    assert len(found) >= 20, f"expected the code to cite docs/ sections, found only {len(found)}"
    names = {name for _, _, name, _ in found}
    heads = {name: headings(name) for name in names if (DOCS / f"{name}.md").is_file()}
    bad = []
    for file, line, name, rest in found:
        if name not in heads:
            bad.append(f"{file}:{line}: docs/{name}.md does not exist")
        elif resolve(rest, heads[name]) is None:
            bad.append(f"{file}:{line}: docs/{name}.md has no heading for '§ {rest[:60]}'")
    assert not bad, "broken docs citations:\n" + "\n".join(bad)


def test_resolver_rejects_missing_and_partial_sections():
    heads = ["Rules", "Layer-wise application", "Delta errors", "Unbiased estimators", "Averaging over θ ∼ π"]
    assert resolve("Rules, \"Layer-wise application\").", heads) == "Rules"
    assert resolve("Layer-wise application) and more", heads) == "Layer-wise application"
    assert resolve("Averaging over θ ∼ π). More text", heads) == "Averaging over θ ∼ π"
    assert resolve("Unbiased estimators`", heads) == "Unbiased estimators"
    assert resolve("Delta", heads) is None  # a prefix of a heading is not the heading
    assert resolve("Rulesets are", heads) is None  # the heading must end at a word boundary
    assert resolve("Optimal weights", heads) is None  # not a heading of this file
    assert resolve("A.4 warm-up", heads) is None


def test_docs_exist_and_have_the_cited_sections():
    for name, required in REQUIRED_HEADINGS.items():
        path = DOCS / f"{name}.md"
        assert path.is_file(), f"docs/{name}.md is missing"
        text = path.read_text(encoding="utf-8")
        assert len(text) > (1500 if name == "architecture" else 6000), f"docs/{name}.md is too short"
        heads = headings(name)
        missing = [h for h in required if h not in heads]
        assert not missing, f"docs/{name}.md lacks the headings {missing}"
        assert heads[0] and text.lstrip().startswith("# "), f"docs/{name}.md should start with a title"


def test_theory_states_the_beta_convention_and_the_key_formulas():
    text = (DOCS / "theory.md").read_text(encoding="utf-8")
    for must in ["β_library = 1 − β_paper", "β_i* = σ² / (σ² + d_i²)", "Proj₊(g_T | g_i) = max(⟨g_T, g_i⟩, 0) · g_i / ‖g_i‖²",
                 "σ̂²           = s² / B", "r = 1/3", "r = 3/5", "r = 27/5"]:
        assert must in text, must
