"""The machinery of the slider panels: sliders that show exactly the value they were given, and figures that
are redrawn in place.

A panel (:class:`FigurePanel`) keeps one matplotlib figure per plot for its whole life. A control change
updates the artists of the plots that depend on it (``set_data``, ``set_array``, new titles; no new figure)
and re-renders only those plots to PNG, shown in an ``ipywidgets.Image``. That works the same in JupyterLab,
in Voila and in a batch run (papermill), needs no front-end extension, and the browser tests can tell by the
image bytes that a plot changed. The render time of every plot is recorded (:attr:`FigurePanel.redraw_times`)
and shown under the plots.

Sliders never change the value they are given (:func:`exact_float_slider`, :func:`exact_int_slider`): a
value outside the soft range widens the range, a value between steps refines the step, and a value outside
the quantity's allowed range is refused with a ``ValueError`` naming the parameter and the range.
"""

from __future__ import annotations

import base64
import io
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

__all__ = ["exact_float_slider", "exact_int_slider", "labelled_selection_slider", "FigurePanel", "png_bytes"]

_STYLE = {"description_width": "initial"}
_LAYOUT = {"width": "360px"}


def _allowed(name: str, value: float, allowed: tuple[float, float]) -> None:
    lo, hi = allowed
    if not (math.isfinite(value) and lo <= value <= hi):
        rng = f"[{lo:g}, {hi:g}]" if math.isfinite(hi) else f">= {lo:g}"
        raise ValueError(f"{name} must be in {rng} for its slider, got {value!r}")


def _decimals(step: float) -> int:
    return max(0, -math.floor(math.log10(step) + 1e-9)) if step < 1 else 0


def exact_float_slider(name: str, description: str, value: float, soft: tuple[float, float], step: float,
                       allowed: tuple[float, float] = (-math.inf, math.inf), min_step: float = 1e-4) -> Any:
    """A ``FloatSlider`` on which ``value`` sits exactly.

    ``soft`` is the usual range; a ``value`` outside it widens the range to reach it (up to ``allowed``, the
    quantity's range, beyond which a ``ValueError`` names ``name`` and the range). When ``value`` lies
    between two steps, ever finer decimal steps (5, 2, 1 × 10⁻ᵏ, down to ``min_step``) are tried until one lands on it; the
    readout shows as many decimals as the step has. ``value - min`` is then a whole number of steps, so
    the front end, which rounds to steps, shows and sends back the value itself.
    """
    import ipywidgets as w

    value = float(value)
    _allowed(name, value, allowed)
    lo, hi = min(soft[0], value), max(soft[1], value)
    # the given step, then ever finer decimal steps (5, 2, 1 × 10^-k) down to min_step
    candidates = [float(step)] + sorted((c * 10.0**-k for k in range(0, 7) for c in (5, 2, 1)
                                         if min_step * (1 - 1e-9) <= c * 10.0**-k < step), reverse=True)
    s = candidates[-1]
    for candidate in candidates:
        k = (value - lo) / candidate
        if abs(k - round(k)) < 1e-6:
            s = candidate
            break
    k = (value - lo) / s
    if abs(k - round(k)) >= 1e-6:
        raise ValueError(f"{name}={value!r} does not fall on a slider step ≥ {min_step:g} from {lo:g}; round it "
                         f"to {min_step:g}")
    hi = round(lo + math.ceil((hi - lo) / s - 1e-9) * s, 10)  # the range ends on a step too
    return w.FloatSlider(value=value, min=lo, max=hi, step=s, description=description, style=_STYLE,
                         readout_format=f".{_decimals(s)}f", continuous_update=False, layout=_LAYOUT)


def exact_int_slider(name: str, description: str, value: int, soft: tuple[int, int],
                     allowed: tuple[float, float] = (-math.inf, math.inf)) -> Any:
    """An ``IntSlider`` whose range is widened to hold ``value`` (refused outside ``allowed``)."""
    import ipywidgets as w

    if isinstance(value, bool) or int(value) != value:
        raise ValueError(f"{name} must be a whole number for its slider, got {value!r}")
    value = int(value)
    _allowed(name, value, allowed)
    return w.IntSlider(value=value, min=min(soft[0], value), max=max(soft[1], value), step=1,
                       description=description, style=_STYLE, continuous_update=False, layout=_LAYOUT)


def labelled_selection_slider(description: str, options: Sequence[tuple[str, Any]], value: Any) -> Any:
    """A ``SelectionSlider`` whose readout is the label of each option (a value in its units) while its
    ``value`` is the option's key (an index, a name)."""
    import ipywidgets as w

    keys = [k for _, k in options]
    if value not in keys:
        raise ValueError(f"{description}: initial value {value!r} is not among the options {keys}")
    return w.SelectionSlider(options=list(options), value=value, description=description, style=_STYLE,
                             continuous_update=False, layout=_LAYOUT)


def png_bytes(fig: Any, dpi: int = 80) -> bytes:
    """The figure rendered to PNG (Agg) at ``dpi``."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


class FigurePanel:
    """Controls, plots redrawn in place, and a readout line, as one ipywidgets ``VBox`` (:attr:`widget`).

    ``plots`` maps a plot name to ``(figure, update, depends)``: ``update(values)`` changes the figure's
    artists for the current control ``values`` (a dict name → value), ``depends`` names the controls it
    depends on. ``readout(values)`` returns the HTML line under the plots (the values in their units).
    Building the panel draws every plot once; a control change redraws only the plots depending on it.
    In a notebook the panel displays as the live widget, with the current PNGs as the static fallback
    (shown by nbconvert and by front ends without the widget manager).
    """

    def __init__(self, controls: Mapping[str, Any], plots: Mapping[str, tuple[Any, Callable[[dict], None], Iterable[str]]],
                 readout: Callable[[dict], str], *, dpi: int = 80, columns: int = 2, title: str = ""):
        import ipywidgets as w

        self.controls = dict(controls)
        self._plots = {name: (fig, update, set(depends)) for name, (fig, update, depends) in plots.items()}
        self._readout_fn = readout
        self.dpi = dpi
        self.redraw_times: dict[str, list[float]] = {name: [] for name in self._plots}
        self.images = {name: w.Image(format="png", layout={"max_width": "100%"}) for name in self._plots}
        for name, img in self.images.items():
            img.add_class("fda-plot")
            img.add_class("fda-plot-" + "".join(ch if ch.isalnum() else "-" for ch in name))
        self.readout = w.HTML()
        self.readout.add_class("fda-readout")
        self.error = w.HTML()
        boxes = [w.HBox(list(self.controls.values())[i:i + columns]) for i in range(0, len(self.controls), columns)]
        head = [w.HTML(f"<b>{title}</b>")] if title else []
        self.widget = w.VBox([*head, *boxes, w.HBox(list(self.images.values())), self.readout, self.error])
        self.widget.add_class("fda-panel")
        for name, control in self.controls.items():
            control.observe(lambda change, name=name: self._changed({name}), names="value")
        self._changed(None)

    @property
    def values(self) -> dict[str, Any]:
        """The current value of every control."""
        return {name: c.value for name, c in self.controls.items()}

    def set(self, **values: Any) -> None:
        """Set controls by name (as a slider move would); the dependent plots redraw once."""
        unknown = set(values) - set(self.controls)
        if unknown:
            raise ValueError(f"unknown control(s) {sorted(unknown)}; this panel has {sorted(self.controls)}")
        self._holding = True  # one redraw for all of them, not one per control
        try:
            for name, v in values.items():
                self.controls[name].value = v
        finally:
            self._holding = False
        self._changed(set(values))

    _holding = False

    def _changed(self, names: set[str] | None) -> None:
        if self._holding:
            return
        values = self.values
        try:
            for plot, (fig, update, depends) in self._plots.items():
                if names is not None and not (depends & names):
                    continue
                started = time.perf_counter()
                update(values)
                self.images[plot].value = png_bytes(fig, self.dpi)
                self.redraw_times[plot].append(time.perf_counter() - started)
            self.error.value = ""
        except ValueError as exc:  # a combination the maths refuses: say so, keep the last good plots
            self.error.value = f"<span style='color:#b00'>{exc}</span>"
        last = ", ".join(f"{p} {t[-1]:.2f} s" for p, t in self.redraw_times.items() if t)
        self.readout.value = self._readout_fn(values) + f"<br><small>redrawn in: {last}</small>"

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        bundle = dict(self.widget._repr_mimebundle_(**kwargs) or {})
        first = next(iter(self.images.values()))
        if first.value:
            bundle["image/png"] = base64.b64encode(first.value).decode("ascii") if len(self.images) == 1 else \
                base64.b64encode(_side_by_side([i.value for i in self.images.values()])).decode("ascii")
        bundle["text/plain"] = ("Interactive panel (ipywidgets): run the notebook in JupyterLab or open its dashboard "
                                "(`fda dashboard`) to move the sliders.")
        return bundle

    def close(self) -> None:
        """Close the widgets and the figures."""
        import matplotlib.pyplot as plt

        for control in self.controls.values():
            control.close()
        for widget in [*self.images.values(), self.readout, self.error, *self.widget.children, self.widget]:
            widget.close()
        for fig, _, _ in self._plots.values():
            plt.close(fig)


def _side_by_side(pngs: Sequence[bytes]) -> bytes:
    """The PNGs pasted left to right on a white background (the static fallback of a multi-plot panel)."""
    import matplotlib.image as mpimg
    import numpy as np

    arrays = [mpimg.imread(io.BytesIO(p), format="png") for p in pngs]
    arrays = [a if a.shape[2] == 4 else np.concatenate([a, np.ones(a.shape[:2] + (1,), a.dtype)], axis=2) for a in arrays]
    height = max(a.shape[0] for a in arrays)
    padded = [np.concatenate([a, np.ones((height - a.shape[0],) + a.shape[1:], a.dtype)], axis=0) for a in arrays]
    buf = io.BytesIO()
    mpimg.imsave(buf, np.concatenate(padded, axis=1), format="png")
    return buf.getvalue()
