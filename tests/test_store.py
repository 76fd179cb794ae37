"""The result store ties runs to the code that produced them: a stale-code run is never reused."""

import json
import textwrap

import pytest

from fda_core.common import provenance
from fda_core.common.store import ResultStore, config_hash


def test_roundtrip_and_hash(tmp_path):
    assert config_hash({"a": 1, "b": [1, 2]}) == config_hash({"b": [1, 2], "a": 1})
    assert config_hash({"a": 1}) != config_hash({"a": 2})
    store = ResultStore(tmp_path)
    calls = []
    out = store.cached("exp", {"a": 1}, lambda: calls.append(1) or {"x": 1.5}, revision="r1")
    assert out == {"x": 1.5}
    assert store.cached("exp", {"a": 1}, lambda: calls.append(1) or {"x": 0}, revision="r1") == {"x": 1.5}
    assert calls == [1]
    assert store.load("exp", {"a": 2}) is None
    with pytest.raises(ValueError, match="experiment"):
        store.path("../x", {})
    assert json.loads(store.path("exp", {"a": 1}).read_text())["revision"] == "r1"


def test_a_run_of_other_code_is_stale_and_replaced(tmp_path):
    store = ResultStore(tmp_path)
    store.save("exp", {"a": 1}, {"x": 1}, revision="old")
    assert store.load("exp", {"a": 1}, revision="new") is None  # not served to the new code
    assert store.cached("exp", {"a": 1}, lambda: {"x": 2}, revision="new") == {"x": 2}
    assert store.load("exp", {"a": 1}, revision="new") == {"x": 2}  # the new result replaced it
    assert store.counts["exp"] == {"reused": 1, "computed": 2, "stale": 2}
    text = store.summary("exp")
    assert "1 run(s) reused" in text and "2 computed" in text and "new" in text and "stale" not in text
    assert "other code revisions recomputed" in text
    # a file written before revisions were recorded is stale too
    p = store.path("exp", {"a": 3})
    p.write_text(json.dumps({"config": {"a": 3}, "result": {"x": 3}}))
    assert store.load("exp", {"a": 3}, revision="new") is None


def test_recompute_flag_ignores_stored_runs(tmp_path):
    ResultStore(tmp_path).save("exp", {"a": 1}, {"x": 1}, revision="r")
    forced = ResultStore(tmp_path, recompute=True)
    assert forced.load("exp", {"a": 1}, revision="r") is None
    assert forced.cached("exp", {"a": 1}, lambda: {"x": 5}, revision="r") == {"x": 5}
    assert "recompute=True" in forced.summary()


def _package(root, files):
    pkg = root / "fda_core"
    for name, text in files.items():
        path = pkg / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return pkg


def test_code_revision_follows_the_import_closure(tmp_path, monkeypatch):
    pkg = _package(tmp_path, {
        "__init__.py": "", "core/__init__.py": "", "viz/__init__.py": "",
        "core/a.py": '"""Doc."""\nfrom .b import f\n\ndef g():\n    from ..core import c\n    return f()\n',
        "core/b.py": "def f():\n    return 1\n",
        "core/c.py": "X = 1\n",
        "viz/plot.py": "from ..core.a import g\n",
    })
    monkeypatch.setattr(provenance, "_ROOT", pkg)
    assert provenance.import_closure("fda_core.core.a") == [
        "fda_core", "fda_core.core", "fda_core.core.a", "fda_core.core.b", "fda_core.core.c"]
    rev = provenance.code_revision("fda_core.core.a")
    (pkg / "viz/plot.py").write_text("from ..core.a import g  # not imported by a\nY = 2\n")
    assert provenance.code_revision("fda_core.core.a") == rev  # outside the closure
    (pkg / "core/a.py").write_text('"""Other doc."""\nfrom .b import f  # a comment\n\ndef g():\n'
                                   '    """New docstring."""\n    from ..core import c\n    return f()\n')
    assert provenance.code_revision("fda_core.core.a") == rev  # docstrings and comments do not count
    (pkg / "core/c.py").write_text("X = 2\n")  # imported inside a function: still in the closure
    changed = provenance.code_revision("fda_core.core.a")
    assert changed != rev
    (pkg / "core/b.py").write_text("def f():\n    return 2\n")
    assert provenance.code_revision("fda_core.core.a") not in (rev, changed)
    with pytest.raises(ValueError, match="not a module"):
        provenance.code_revision("fda_core.nope")


_CHECKED = """
import warnings

def f(x):
    if x < 0:
        raise ValueError(f"x must be >= 0, got {x!r}")
    assert x != 1, "one is not allowed"
    if x > 9:
        warnings.warn("x is large", RuntimeWarning, stacklevel=2)
    return x
"""


@pytest.mark.parametrize("edit, same", [
    (("must be >= 0, got", "must be at least 0 (got"), True),  # an error's wording
    (("one is not allowed", "x = 1 is refused"), True),  # an assertion's message
    (("x is large", "x is over 9"), True),  # a warning's
    (("ValueError(", "TypeError("), False),  # which exception
    (("{x!r}", "{-x!r}"), False),  # what a message computes
    (("x != 1", "x != 2"), False),  # what is checked
    (("RuntimeWarning", "UserWarning"), False),
    (("return x", "return 'x'"), False),  # a string that is not a message
])
def test_code_revision_ignores_the_wording_of_messages(tmp_path, monkeypatch, edit, same):
    pkg = _package(tmp_path, {"__init__.py": "", "core/__init__.py": "", "core/a.py": _CHECKED})
    monkeypatch.setattr(provenance, "_ROOT", pkg)
    rev = provenance.code_revision("fda_core.core.a")
    old, new = edit
    assert old in _CHECKED
    (pkg / "core/a.py").write_text(_CHECKED.replace(old, new))
    provenance._revision.cache_clear()  # hash the edited text, whatever its time stamp
    assert (provenance.code_revision("fda_core.core.a") == rev) is same


def test_object_revision_of_code_outside_the_package():
    from fda_core.experiments.methods import FedGP

    class A:
        def f(self):
            return 1

    class B:
        def f(self):
            return 2

    assert provenance.object_revision(FedGP) == ""  # package code: covered by code_revision
    assert provenance.object_revision(A) and provenance.object_revision(A) != provenance.object_revision(B)


def test_a_run_stored_by_another_experiment_is_reused_only_where_asked_and_only_for_its_config(tmp_path):
    """``any_experiment=True``: the same config and revision under another experiment is reused and copied; another
    revision, another config of the same file name (a forged hash collision) and the default lookup are not."""
    store = ResultStore(tmp_path)
    store.save("05_target_samples", {"rule": "fedda", "seed": 0}, {"acc": 91.6}, revision="r1")
    assert store.load("05_projection", {"rule": "fedda", "seed": 0}, revision="r1") is None  # default: own folder only
    assert store.load("05_projection", {"rule": "fedda", "seed": 0}, revision="r2", any_experiment=True) is None
    got = store.load("05_projection", {"rule": "fedda", "seed": 0}, revision="r1", any_experiment=True)
    assert got == {"acc": 91.6}
    copied = store.path("05_projection", {"rule": "fedda", "seed": 0})
    assert copied.read_text() == store.path("05_target_samples", {"rule": "fedda", "seed": 0}).read_text()
    assert store.counts["05_projection"] == {"reused": 1, "computed": 0, "stale": 0, "elsewhere": 1}
    assert "1 run(s) reused from the result store (1 of them stored by another experiment)" in store.summary("05_projection")
    # read again: now from its own folder, not counted as from elsewhere
    assert ResultStore(tmp_path).load("05_projection", {"rule": "fedda", "seed": 0}, "r1", any_experiment=True) == got
    # a file of the same name whose config differs is not the run asked for
    forged = store.path("05_beta", {"rule": "fedgp", "seed": 1})
    forged.parent.mkdir(parents=True)
    forged.write_text(json.dumps({"config": {"rule": "other"}, "revision": "r1", "result": {"acc": 0.0}}))
    assert store.load("05_source_labels", {"rule": "fedgp", "seed": 1}, "r1", any_experiment=True) is None
    assert not store.path("05_source_labels", {"rule": "fedgp", "seed": 1}).exists()
    assert ResultStore(tmp_path, recompute=True).load("05_x", {"rule": "fedda", "seed": 0}, "r1",
                                                      any_experiment=True) is None
