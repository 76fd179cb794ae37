"""The exercises' checks: right and wrong answers, no answer, bad input; answers agree with the closed forms."""

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fda_core.core import theory
from fda_core.experiments import exercises as ex


def test_no_answer_states_the_question_only():
    c = ex.check_optimal_beta_fedda(None, 1.0, 2.0)
    assert c.correct is None and "0.333" not in str(c) and "Write your prediction" in str(c)


@settings(max_examples=40, deadline=None)
@given(st.floats(0.05, 10), st.floats(0.05, 10))
def test_optimal_beta_fedda_hand_formula(s2, d2):
    beta = s2 / (s2 + d2)  # derivative of (1-β)²σ² + β²d² is zero
    assert ex.check_optimal_beta_fedda(beta, s2, d2).correct
    assert not ex.check_optimal_beta_fedda(min(beta + 0.05, 1.0) if beta < 0.9 else beta - 0.05, s2, d2).correct
    # the β it names minimises the closed form on a fine grid
    grid = np.linspace(0, 1, 10001)
    assert abs(grid[np.argmin(theory.delta_fedda(s2, d2, grid))] - beta) < 2e-4


def test_fedgp_and_boundary_and_best_rule_by_hand():
    assert ex.check_optimal_beta_fedgp(0.5, 1.0, 2.0, tau2=0.5).correct  # 1 / (1 + 0.5·2)
    assert ex.check_boundary(5.4).correct and not ex.check_boundary(3.0).correct  # paper: r = 27/5
    assert ex.check_boundary(1 / 3, "source_only", "fedda").correct
    # r = d²/σ² = 1 lies between 0.6 and 5.4: FedGP; r = 0.36 between 1/3 and 0.6: FedDA
    assert ex.check_best_rule("FedGP", 1.0, 1.0).correct and ex.check_best_rule("fedgp", 1.0, 1.0).correct
    assert ex.check_best_rule("fedda", 0.6, 1.0).correct and not ex.check_best_rule("Target only", 0.6, 1.0).correct
    with pytest.raises(ValueError, match="answer must be a number"):
        ex.check_optimal_beta_fedda("a third")
    with pytest.raises(ValueError, match="not neighbouring"):
        ex.check_boundary(1.0, "source_only", "target_only")


def test_cell_winner_and_spread_ratio_read_their_tables():
    cells = pd.DataFrame([{"shift_index": 0, "size_index": 1, "shift": 0.25, "subset_size": 64, "d2": 0.5,
                           "sigma2": 1.0, "d2_over_sigma2": 0.5, "best_by_delta_mc": "FedDA", "best_by_loss": "FedGP"}])
    assert ex.check_cell_winner("fedgp", cells, 0, 1).correct
    assert not ex.check_cell_winner("FedDA", cells, 0, 1).correct
    with pytest.raises(ValueError, match="no cell"):
        ex.check_cell_winner("fedgp", cells, 3, 3)
    table = pd.DataFrame({"quantity": "sigma2", "source": np.nan, "n": 64, "B": [4, 16], "std": [0.2, 0.2 * math.sqrt(3 / 15)]})
    assert ex.check_spread_ratio(math.sqrt(3 / 15), table, 4, 16, 64).correct
    assert not ex.check_spread_ratio(1.0, table, 4, 16, 64).correct
    with pytest.raises(ValueError, match="B_from"):
        ex.check_spread_ratio(0.5, table, 2, 16, 64)
