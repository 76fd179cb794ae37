"""``fda timings``: where the main job's time went, section by section, read from the executed notebooks.

    fda timings                          # executed/ (written by make figures / fda run all)
    fda timings --executed /tmp/x/executed --level 3 --csv timings.csv
    fda timings --budget 30 --jobs 2     # against the main job's budget, two notebooks side by side

papermill records every cell's wall-clock ``duration`` in the executed copy's metadata (``cell.metadata.papermill``)
and the whole notebook's in ``metadata.papermill.duration``. :func:`section_timings` sums the cells' durations under
each markdown heading of the notebook (level 2, ``## ``, by default: the notebooks' sections, as a paper's); the
cells before the first such heading are the set-up (``(set-up)``), and the difference between the notebook's
duration and the sum of its cells (kernel start, papermill's own work) is ``(kernel and papermill)``.

The report puts beside each notebook its scheduling hint (metadata ``fda.minutes`` of the notebook in
``notebooks/``, :mod:`fda_core.workbook.schedule`): measured / hint is how much slower or faster this machine ran the
notebook than the reference CPU the hints were measured on, and a notebook whose ratio stands out from the others has
a stale hint. With ``--jobs K`` it gives the shortest wall clock K notebooks side by side can reach, the larger of
(kernel time) / K and the longest notebook; with ``--budget`` it says by how much that lower bound misses or meets
the budget. Nothing is run: the numbers are those of the run that wrote the executed copies (their machine, their
load). Exit status: 0, or 2 when the folder holds no executed notebook or one without papermill's timings.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from ..common.checks import is_int, is_number
from ..common.files import atomic_write_text
from .discovery import default_output_dir, find_notebooks, notebooks_dir
from .schedule import declared_minutes

__all__ = ["Section", "NotebookTimings", "section_timings", "read_timings", "format_report", "timings_csv",
           "add_timings_parser", "cmd_timings", "SETUP", "OVERHEAD"]

#: Name of the cells before a notebook's first heading of the chosen level.
SETUP = "(set-up)"
#: Name of the notebook's duration not spent in any cell (kernel start, papermill's own work).
OVERHEAD = "(kernel and papermill)"

_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


@dataclass(frozen=True)
class Section:
    """One section of an executed notebook: its heading, the seconds its code cells took, how many there were."""

    title: str
    seconds: float
    cells: int


@dataclass(frozen=True)
class NotebookTimings:
    """The timings of one executed notebook: ``seconds`` (papermill's duration of the whole notebook), its
    ``sections`` in notebook order (:data:`OVERHEAD` last), ``hint_minutes`` (its ``fda.minutes``; None when the
    source notebook is not found) and ``complete`` (False when some code cell has no duration: the run stopped)."""

    name: str
    seconds: float
    sections: tuple[Section, ...]
    hint_minutes: float | None
    complete: bool


def _source_text(cell: Any) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def _heading(cell: Any, level: int) -> str | None:
    """The first heading of level 2..``level`` in a markdown cell, as plain text (None: none); lines inside fenced
    code blocks (```` ``` ```` or ``~~~``) are code, not headings."""
    fenced = False
    for line in _source_text(cell).splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        m = _HEADING.match(line.strip())
        if m and not fenced and 2 <= len(m.group(1)) <= level:
            return m.group(2).strip() or "(untitled)"
    return None


def section_timings(nb: dict[str, Any], name: str, level: int = 2,
                    hint_minutes: float | None = None) -> NotebookTimings:
    """Sum the code cells' papermill durations of the executed notebook ``nb`` (its JSON, as a dict) by section.

    A section starts at a markdown cell holding a heading of level 2 to ``level`` (``## `` .. ``#`` × level;
    the notebook's ``# `` title never starts one) and runs to the next. ValueError naming ``name`` when the
    notebook carries no papermill timings or ``level`` is not in [2, 6]."""
    if not is_int(level) or not 2 <= level <= 6:
        raise ValueError(f"level must be an integer in [2, 6], got {level!r}")
    total = (nb.get("metadata", {}).get("papermill") or {}).get("duration")
    if not is_number(total):
        raise ValueError(f"{name}: no papermill duration in its metadata (not a notebook executed by fda run / papermill)")
    order: list[str] = []
    seconds: dict[str, float] = {}
    cells: dict[str, int] = {}
    current, complete = SETUP, True
    for cell in nb.get("cells", []):
        kind = cell.get("cell_type")
        if kind == "markdown":
            title = _heading(cell, level)
            if title is not None:
                current, k = title, 2
                while current in seconds:  # a heading seen before: a new section, numbered
                    current, k = f"{title} ({k})", k + 1
            continue
        if kind != "code":
            continue
        duration = (cell.get("metadata", {}).get("papermill") or {}).get("duration")
        if current not in seconds:
            order.append(current)
            seconds[current], cells[current] = 0.0, 0
        cells[current] += 1
        if is_number(duration):
            seconds[current] += float(duration)
        else:
            complete = False
    sections = [Section(t, seconds[t], cells[t]) for t in order]
    sections.append(Section(OVERHEAD, max(float(total) - sum(seconds.values()), 0.0), 0))
    return NotebookTimings(name, float(total), tuple(sections), hint_minutes, complete)


def read_timings(executed: str | Path, level: int = 2, notebooks: str | Path | None = None) -> list[NotebookTimings]:
    """:func:`section_timings` of every numbered executed notebook in ``executed`` (``NN_topic.ipynb``; failed
    copies are left out), in number order, with each one's ``fda.minutes`` hint from ``notebooks`` (default: the
    repository's ``notebooks/``). ValueError when the folder holds none."""
    folder = Path(executed)
    paths = find_notebooks(folder)
    if not paths:
        raise ValueError(f"no executed notebooks (NN_topic.ipynb) in {folder}: run `fda run all --out {folder}` "
                         "(make figures writes executed/)")
    sources = Path(notebooks) if notebooks is not None else notebooks_dir()
    out = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            nb = json.load(f)
        source = sources / path.name
        hint = declared_minutes(source) if source.is_file() else None
        out.append(section_timings(nb, path.stem, level, hint))
    return out


def _clock(seconds: float) -> str:
    return f"{seconds:,.0f} s ({seconds / 60:.1f} min)"


def format_report(timings: Sequence[NotebookTimings], jobs: int = 1, budget_minutes: float | None = None,
                  source: str = "") -> str:
    """The plain-text report of ``fda timings``: per notebook its seconds, hint and measured / hint, then its
    sections by seconds (largest first, with their share of the notebook), then the whole: kernel time, the
    lower bound of the wall clock with ``jobs`` notebooks side by side, and against ``budget_minutes``."""
    if not is_int(jobs) or jobs < 1:
        raise ValueError(f"jobs must be an integer >= 1, got {jobs!r}")
    if budget_minutes is not None and not (is_number(budget_minutes) and budget_minutes > 0):
        raise ValueError(f"budget must be a number of minutes > 0, got {budget_minutes!r}")
    lines = [f"Where the time went{f' ({source})' if source else ''}: papermill's duration of every cell, "
             "summed by section; largest first."]
    width = max([len(s.title) for t in timings for s in t.sections] + [20])
    width = min(width, 72)
    for t in sorted(timings, key=lambda t: -t.seconds):
        hint = ""
        if t.hint_minutes is not None:
            hint = f"; hint {t.hint_minutes:g} min, measured / hint {t.seconds / 60 / t.hint_minutes:.2f}"
        partial = "" if t.complete else "  (incomplete: some cells have no duration, the run stopped)"
        lines.append(f"\n{t.name}: {_clock(t.seconds)}{hint}{partial}")
        for s in sorted(t.sections, key=lambda s: -s.seconds):
            share = s.seconds / t.seconds if t.seconds > 0 else 0.0
            title = s.title if len(s.title) <= width else s.title[:width - 1] + "…"
            cells = f"{s.cells} cell{'s' if s.cells != 1 else ''}" if s.cells else ""
            lines.append(f"  {title:<{width}}  {s.seconds:>9,.1f} s  {share:>4.0%}  {cells}".rstrip())
    kernel = sum(t.seconds for t in timings)
    longest = max((t.seconds for t in timings), default=0.0)
    bound = max(kernel / jobs, longest)
    n = len(timings)
    lines.append(f"\nAll {n} notebook{'s' if n != 1 else ''}: {_clock(kernel)} of kernel time.")
    if jobs > 1:
        lines.append(f"With {jobs} side by side the wall clock is at least {_clock(bound)}: the larger of the kernel "
                     f"time / {jobs} and the longest notebook (set-up not counted).")
    if budget_minutes is not None:
        gap = bound - 60 * budget_minutes
        verdict = (f"over the budget by at least {_clock(gap)}" if gap > 0
                   else f"within the budget, {_clock(-gap)} to spare before set-up")
        lines.append(f"Budget {budget_minutes:g} min: {verdict}.")
    return "\n".join(lines)


def timings_csv(timings: Sequence[NotebookTimings]) -> str:
    """The timings as CSV text: ``notebook,section,seconds,cells,notebook_seconds,hint_minutes`` (one row per
    section, in notebook order)."""
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(["notebook", "section", "seconds", "cells", "notebook_seconds", "hint_minutes"])
    for t in timings:
        hint = "" if t.hint_minutes is None else f"{t.hint_minutes:g}"
        writer.writerows([t.name, s.title, f"{s.seconds:.3f}", s.cells, f"{t.seconds:.3f}", hint] for s in t.sections)
    return text.getvalue()


def add_timings_parser(sub: Any) -> None:
    """The ``timings`` sub-command of ``fda``."""
    p = sub.add_parser(
        "timings", help="where the time of executed notebooks went, by section (papermill's cell durations)",
        description="Read the executed notebooks (NN_topic.ipynb in --executed, written by 'fda run all --out DIR' "
        "or make figures) and print, per notebook, its wall-clock seconds, its scheduling hint (metadata "
        "fda.minutes) and the seconds of each section (code cells under each '## ' heading). Nothing is run.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Examples:\n  fda timings\n  fda timings --executed /tmp/ci/executed --budget 30 --jobs 2\n"
        "  fda timings --level 3 --csv timings.csv",
    )
    p.add_argument("--executed", type=Path, default=None, metavar="DIR",
                   help="folder of the executed notebooks (default: <repo>/executed)")
    p.add_argument("--level", type=int, default=2, metavar="N",
                   help="headings that start a section: levels 2..N (default 2, the '## ' sections; 3 adds '### ')")
    p.add_argument("--jobs", "-j", type=int, default=2, metavar="K",
                   help="notebooks side by side, for the wall-clock lower bound (default 2, as make figures)")
    p.add_argument("--budget", type=float, default=None, metavar="MINUTES",
                   help="compare that lower bound with a budget in minutes (the main job's: 30)")
    p.add_argument("--csv", type=Path, default=None, metavar="FILE", help="also write the sections as CSV (atomically)")


def cmd_timings(args: Any, out: TextIO, err: TextIO) -> int:
    """Run ``fda timings``; returns the exit status (2: bad usage or no timings to read)."""
    executed = args.executed if args.executed is not None else default_output_dir()
    try:
        timings = read_timings(executed, args.level)
        report = format_report(timings, args.jobs, args.budget, source=str(executed))
    except ValueError as exc:
        print(f"fda timings: {exc}", file=err)
        return 2
    print(report, file=out)
    if args.csv is not None:
        print(f"wrote {atomic_write_text(args.csv, timings_csv(timings))}", file=out)
    return 0
