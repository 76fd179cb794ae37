"""Tables in docs/ that quote committed result files agree with them.

The docs quote a few measured tables next to their discussion (Fed INB's iteration counts beside the paper's
Table 5, FedDIRT beside the paper's Table 3). When a notebook's results change (a fixed data set, a fixed
estimator) and the figures are regenerated, these tables must be regenerated too; this test fails until they
are, instead of leaving the docs quietly describing an earlier run. Rounding: the docs print one decimal.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parent.parent
TRANSLATION = ROOT / "docs" / "translation.md"
FIGURES = ROOT / "figures"


def markdown_table(text: str, header: str) -> list[list[str]]:
    """The body rows (cells stripped) of the markdown table whose header line is ``header``."""
    lines = text.splitlines()
    try:
        start = lines.index(header)
    except ValueError:
        raise AssertionError(f"table header not found: {header!r}") from None
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def number(cell: str) -> float:
    return float(cell.replace(",", ""))


def close(doc_value: float, exact: float, decimals: int = 1) -> bool:
    """``doc_value`` is ``exact`` printed with ``decimals`` decimals (either way at a tie)."""
    return abs(doc_value - exact) <= 0.5 * 10 ** -decimals + 1e-9


def _csv(path: Path) -> pd.DataFrame:
    if not path.exists():
        pytest.skip(f"{path.relative_to(ROOT)} is not committed")
    return pd.read_csv(path, comment="#")


def test_markdown_table_parser():
    text = "x\n| a | b |\n|---|---|\n| 1 | 2,000.5 |\n| 3 | |\n\nafter"
    assert markdown_table(text, "| a | b |") == [["1", "2,000.5"], ["3", ""]]
    assert number("2,000.5") == 2000.5
    assert close(46.2, 46.25) and close(46.3, 46.25) and not close(46.4, 46.25)
    with pytest.raises(AssertionError, match="not found"):
        markdown_table(text, "| c |")


def test_translation_iteration_table_matches_notebook_06():
    """docs/translation.md's Armijo-iteration table = figures/06_inb_translation/iterations_vs_paper.csv."""
    runs = _csv(FIGURES / "06_inb_translation" / "iterations_vs_paper.csv").set_index(["variant", "option"])
    rows = markdown_table(TRANSLATION.read_text(),
                          "| variant | library option | reference option | paper Table 5 |")
    label = {"INB": "INB", "Hist INB (V = 500)": "Hist INB", "IndAEINB": "IndAEINB"}
    assert [r[0] for r in rows] == list(label)
    for name, library, reference, paper in rows:
        variant = label[name]
        assert close(number(library), runs.loc[(variant, "library"), "ours_mean"]), (name, "library")
        assert close(number(reference), runs.loc[(variant, "reference"), "ours_mean"]), (name, "reference")
        assert number(paper) == runs.loc[(variant, "reference"), "paper"], (name, "paper")


def test_translation_table3_matches_notebook_08():
    """docs/translation.md's FedDIRT table = figures/08_domain_generalisation/table3.csv (mean ± std)."""
    table = _csv(FIGURES / "08_domain_generalisation" / "table3.csv")
    table = table.astype({"domain": str, "period": int}).set_index(["method", "domain", "period"])
    header = "| unseen, period | FedAvg | FedDIRT | FedDIRT (shared space) | paper FedAvg | paper FedDIRT |"
    rows = markdown_table(TRANSLATION.read_text(), header)
    assert len(rows) == 6
    methods = ["FedAvg", "FedDIRT", "FedDIRT (shared space)"]
    for first, *cells in rows:
        m = re.fullmatch(r"(\d+)°, s = (\d+)", first)
        assert m, first
        domain, period = m.group(1), int(m.group(2))
        for method, cell in zip(methods, cells[:3]):
            key = (method, domain, period)
            if not cell:
                assert key not in table.index, f"{key} is measured but the docs leave it empty"
                continue
            mean, std = (number(v) for v in cell.split("±"))
            assert close(mean, table.loc[key, "mean"]) and close(std, table.loc[key, "std"]), (key, cell)
        for method, cell in zip(["FedAvg", "FedDIRT"], cells[3:]):
            mean, std = (number(v) for v in cell.split("±"))
            row = table.loc[(method, domain, period)]
            assert (mean, std) == (row["paper_mean"], row["paper_std"]), (method, domain, period, cell)
