"""sympy derivations agree with the numeric closed forms (the slider panels: tests/test_widgets.py)."""

import math

import numpy as np
import sympy as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from fda_core.core import symbolic, theory


def test_paper_boundaries_exact():
    b = symbolic.phase_boundaries()
    assert b[("source_only", "fedda")] == sp.Rational(1, 3)
    assert b[("fedda", "fedgp")] == sp.Rational(3, 5)
    assert b[("fedgp", "target_only")] == sp.Rational(27, 5)


@settings(max_examples=40, deadline=None)
@given(st.floats(0.01, 10), st.floats(0.01, 10), st.floats(0.05, 1), st.floats(0.05, 1), st.integers(2, 1000))
def test_symbolic_optimal_beta_matches_theory(s2, d2, tau2, delta_bar, m):
    opt = symbolic.optimal_beta_expressions()
    S = symbolic.SYMBOLS
    vals = {S["sigma2"]: s2, S["d2"]: d2, S["tau2"]: tau2, S["delta_bar"]: delta_bar, S["m"]: m}
    assert math.isclose(float(opt["fedda"].subs(vals)), theory.optimal_beta_fedda(s2, d2), rel_tol=1e-9)
    assert math.isclose(float(opt["fedgp"].subs(vals)),
                        theory.optimal_beta_fedgp(s2, tau2 * d2, m, delta_bar), rel_tol=1e-9)
    for rule, e in symbolic.delta_expressions().items():
        numeric = theory.delta_errors_theory(math.sqrt(d2), math.sqrt(s2), beta=0.3, delta_bar=delta_bar,
                                             tau2=tau2, m=m, rules=[rule])[rule]
        assert math.isclose(float(e.subs({**vals, S["beta"]: 0.3})), float(numeric), rel_tol=1e-9)


def test_boundaries_match_numeric_phase_diagram():
    b = symbolic.phase_boundaries(0.3, 0.8, 0.4, 50)
    for (left, right), r in b.items():
        r = float(r)
        lo = theory.phase_diagram_theory(math.sqrt(r * 0.999), 1.0, 0.3, 0.8, 0.4, 50)
        hi = theory.phase_diagram_theory(math.sqrt(r * 1.001), 1.0, 0.3, 0.8, 0.4, 50)
        assert str(lo) == left and str(hi) == right


def test_theory_panels_tables():
    from fda_core.viz.plotting import theory_panels

    fig, tables = theory_panels(grid_points=21, include_auto=True)
    assert set(tables) == {"phase_diagram_theory", "delta_vs_beta"}
    assert len(tables["phase_diagram_theory"]) == 20 * 20
    assert np.isclose(tables["delta_vs_beta"].fedda_optimal_beta.iloc[0], 1 / 3)
