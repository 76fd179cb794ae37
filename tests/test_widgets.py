"""The slider panels without a browser: exact sliders, in-place redraws, readouts in units, display labels.

The same panels in a real browser (JupyterLab and Voila): tests/test_browser.py.
"""

import math

import matplotlib
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

matplotlib.use("Agg")

from fda_core.core import theory  # noqa: E402
from fda_core.viz.panels import exact_float_slider, exact_int_slider, labelled_selection_slider  # noqa: E402
from fda_core.viz.widgets import curves_explorer, theory_explorer  # noqa: E402


def _on_step(slider) -> bool:
    k = (slider.value - slider.min) / slider.step
    return abs(k - round(k)) < 1e-6 and slider.min <= slider.value <= slider.max


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 100000), st.sampled_from([0.05, 0.5, 0.25]), st.sampled_from([1, 2, 3, 4]))
def test_exact_float_slider_keeps_every_value(k, step, decimals):
    value = round(k / 10**decimals, decimals)  # any value with up to 4 decimals, inside or far outside the soft range
    s = exact_float_slider("x", "x", value, (0.0, 1.0), step)
    assert s.value == value and _on_step(s)
    assert s.max >= 1.0 and s.min <= 0.0  # the soft range is kept, only widened
    assert s.readout_format == f".{max(0, -math.floor(math.log10(s.step) + 1e-9))}f" or s.step >= 1


def test_sliders_refuse_values_outside_the_quantity_range():
    with pytest.raises(ValueError, match=r"beta must be in \[0, 1\]"):
        exact_float_slider("beta", "β", 1.2, (0, 1), 0.05, allowed=(0, 1))
    with pytest.raises(ValueError, match="m must be in"):
        exact_int_slider("m", "m", 0, (2, 1000), allowed=(1, math.inf))
    with pytest.raises(ValueError, match="does not fall on a slider step"):
        exact_float_slider("tau2", "τ̄²", 0.123456789, (0, 1), 0.05)
    with pytest.raises(ValueError, match="not among the options"):
        labelled_selection_slider("B", [("2 parts", 2)], 3)


def test_theory_explorer_shows_the_values_it_was_given():
    """The notebook-02 case: m = 6110, τ̄² = 0.57 and grid range 3.75 were shown as 1000, 0.55 and 3.5."""
    panel = theory_explorer(beta=0.5, tau2=0.57, m=6110, grid_max=3.75)
    for name, value in {"m": 6110, "tau2": 0.57, "grid_max": 3.75, "beta": 0.5}.items():
        slider = panel.controls[name]
        assert slider.value == value and _on_step(slider), name
    assert "m=6110" in panel.readout.value.replace(" ", "") and "τ̄² = 0.57" in panel.readout.value
    with pytest.raises(ValueError, match="beta"):
        theory_explorer(beta=-0.1)
    panel.close()


def test_theory_explorer_redraws_in_place_and_marks_beta():
    panel = theory_explorer(beta=0.5, m=20)
    map_fig = panel._plots["phase map"][0]
    curve_fig = panel._plots["Δ²(β)"][0]
    before = {k: img.value for k, img in panel.images.items()}
    assert all(before.values()) and all(len(t) == 1 for t in panel.redraw_times.values())
    panel.set(beta=0.8)
    assert panel._plots["phase map"][0] is map_fig and panel._plots["Δ²(β)"][0] is curve_fig  # same figures
    assert all(panel.images[k].value != before[k] for k in before)  # both plots changed
    ax = curve_fig.axes[0]
    assert "β = 0.8 (slider)" in [t.get_text() for t in ax.get_legend().get_texts()]
    assert "at β=0.8" in ax.get_title()
    # the marker of the slider's β sits on the FedGP curve at the closed-form value
    markers = [ln for ln in ax.lines if ln.get_marker() == "s"]
    values = sorted(float(ln.get_ydata()[0]) for ln in markers)
    expected = sorted([theory.delta_fedda(1.0, 2.0, 0.8), theory.delta_fedgp(1.0, 2.0, 0.8, 1.0, 0.5, 20)])
    assert np.allclose(values, expected)
    # the optimal β lines are at the closed forms and read out
    assert f"optimal β FedDA {1 / 3:.3f}" in panel.readout.value
    # the grid range changes only the map
    counts = {k: len(v) for k, v in panel.redraw_times.items()}
    panel.set(grid_max=5.0)
    assert len(panel.redraw_times["phase map"]) == counts["phase map"] + 1
    assert len(panel.redraw_times["Δ²(β)"]) == counts["Δ²(β)"]
    assert map_fig.axes[0].get_xlim() == (0.0, 5.0)
    with pytest.raises(ValueError, match="unknown control"):
        panel.set(sigma=1)
    panel.close()


def test_theory_explorer_auto_rules_and_display_labels():
    panel = theory_explorer(include_auto=False)
    legend = [t.get_text() for t in panel._plots["phase map"][0].axes[0].get_legend().get_texts()]
    assert "Source only" in legend and "source_only" not in legend
    panel.set(include_auto=True)
    legend = [t.get_text() for t in panel._plots["phase map"][0].axes[0].get_legend().get_texts()]
    assert any("Auto" in t or "auto" in t for t in legend), legend
    bundle = panel._repr_mimebundle_()
    assert {"application/vnd.jupyter.widget-view+json", "image/png", "text/plain"} <= set(bundle)
    panel.close()


def test_curves_explorer_reads_out_units_and_labels():
    from fda_core.experiments import phase_diagram as P

    data = P.make_phase_diagram_data(n_points=200, shift_levels=np.linspace(0.0, 0.5, 3),
                                     subset_sizes=P.spread_subset_sizes(200, 3), n_trials=1, seed=0)
    methods = ("source_only", "fedda(beta=0.5)", "fedgp(beta=0.5)", "target_only")
    result, metrics = P.run_phase_diagram(data, betas=(0.5,), steps=5, n_subsets=5)
    cells = P.compare_best(result, metrics, methods=methods)
    panel = curves_explorer(result, methods=P.method_labels(methods), cells=cells)
    shift_labels = [lab for lab, _ in panel.controls["shift_index"].options]
    size_labels = [lab for lab, _ in panel.controls["size_index"].options]
    assert all(lab.startswith("shift ") and "d = " in lab for lab in shift_labels)
    assert all(lab.endswith(" points") for lab in size_labels)
    legend = [t.get_text() for t in panel._plots["training curves"][0].axes[0].get_legend().get_texts()]
    assert "Source only" in legend and not any("_" in t for t in legend)
    before = panel.images["training curves"].value
    new_shift = panel.controls["shift_index"].options[0][1]
    panel.set(shift_index=new_shift)
    assert panel.images["training curves"].value != before
    assert shift_labels[0] in panel.readout.value and "lowest final target test loss" in panel.readout.value
    panel.close()
