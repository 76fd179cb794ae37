"""Figures do not depend on the machine's fonts (fda_core.viz.plotting.use_bundled_fonts; docs/architecture.md
§ Conventions)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import pytest
from matplotlib import font_manager
from matplotlib.backends.backend_pdf import PdfFile
from matplotlib.font_manager import FontProperties
from matplotlib.ft2font import FT2Font

from fda_core.viz.plotting import save_figure, set_style, use_bundled_fonts

BUNDLED = Path(matplotlib.get_data_path(), "fonts", "ttf").resolve()


@pytest.fixture
def manager(monkeypatch):
    """matplotlib's font manager with its font list restored, and findfont's cache emptied, afterwards."""
    fm = font_manager.fontManager
    monkeypatch.setattr(fm, "ttflist", list(fm.ttflist))
    yield fm
    fm._findfont_cached.cache_clear()


def _list_a_copy_first(manager, tmp_path: Path) -> Path:
    """A "system" copy of DejaVu Sans, listed before everything: it wins the tie, as Debian's copy did here."""
    copy = tmp_path / "DejaVuSans.ttf"
    shutil.copy(BUNDLED / "DejaVuSans.ttf", copy)
    manager.addfont(str(copy))
    manager.ttflist.insert(0, manager.ttflist.pop())
    assert Path(font_manager.findfont("DejaVu Sans")).resolve() == copy.resolve()
    return copy


def test_bundled_fonts_win_over_a_copy_of_the_same_family_listed_first(manager, tmp_path):
    copy = _list_a_copy_first(manager, tmp_path)
    use_bundled_fonts()
    for prop in (FontProperties(family="DejaVu Sans"), FontProperties(family="DejaVu Sans", style="italic"),
                 FontProperties(family="DejaVu Sans", weight="bold")):
        assert Path(font_manager.findfont(prop)).resolve().parent == BUNDLED, prop
    assert any(Path(f.fname).resolve() == copy.resolve() for f in manager.ttflist)  # other fonts stay listed


def test_set_style_uses_the_bundled_fonts_and_lists_each_once(manager):
    set_style()
    listed = len(manager.ttflist)
    set_style()
    assert len(manager.ttflist) == listed
    bundled = [f for f in manager.ttflist if Path(f.fname).resolve().parent == BUNDLED]
    assert bundled and manager.ttflist[:len(bundled)] == bundled
    assert len({(f.fname, f.name, f.style, f.weight) for f in bundled}) == len(bundled)
    assert Path(font_manager.findfont("DejaVu Sans")).resolve().parent == BUNDLED


def test_save_figure_uses_the_bundled_fonts_without_set_style(manager, tmp_path):
    _list_a_copy_first(manager, tmp_path)
    fig, ax = plt.subplots()
    ax.set_title("β = 0.5")
    try:
        written = save_figure(fig, tmp_path / "out", "check")
    finally:
        plt.close(fig)
    assert [p.suffix for p in written] == [".png", ".pdf"]
    assert Path(font_manager.findfont("DejaVu Sans")).resolve().parent == BUNDLED


# --- committed PDFs: drawn with the bundled fonts -------------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
# A Type 3 font of a matplotlib PDF: its subset tag, PostScript name and the glyph names its encoding lists.
_TYPE3_FONT = re.compile(r"/Type /Font /BaseFont /([A-Z]{6})\+([\w-]+)\s(?:(?!endobj).)*?/Subtype /Type3"
                         r"(?:(?!endobj).)*?/Differences \[(.*?)\]", re.S)


def _subset_tag(glyph_indices: frozenset[int]) -> str:
    """The six letters matplotlib's PDF backend puts before a subsetted font's name (a hash of the glyph indices)."""
    return PdfFile._get_subset_prefix(glyph_indices)[:6]


def _bundled_fonts_by_postscript_name() -> dict[str, FT2Font]:
    fonts = {}
    for path in sorted(BUNDLED.glob("*.ttf")):
        font = FT2Font(str(path))
        fonts.setdefault(font.postscript_name, font)
    return fonts


def test_committed_pdfs_were_drawn_with_the_bundled_fonts():
    """Every font subset in a committed PDF carries the tag of the bundled font's glyph indices (the tag hashes
    them, and another copy of the family, e.g. Debian's DejaVu, numbers some glyphs differently): a PDF drawn with
    a system font would not come out byte-identical when regenerated (docs/architecture.md § Conventions)."""
    fonts = _bundled_fonts_by_postscript_name()
    pdfs = sorted((ROOT / "figures").rglob("*.pdf"))
    assert len(pdfs) > 40
    wrong = []
    for pdf in pdfs:
        text = pdf.read_bytes().decode("latin-1")
        found = _TYPE3_FONT.findall(text)
        assert len(found) == text.count("/Type /Font "), f"{pdf}: a font that is not a Type 3 subset"
        for tag, name, differences in found:
            assert name in fonts, f"{pdf}: font {name} is not one of matplotlib's bundled fonts"
            glyphs = frozenset(fonts[name].get_name_index(t[1:]) for t in differences.split() if t.startswith("/"))
            if _subset_tag(glyphs) != tag:
                wrong.append(f"{pdf.relative_to(ROOT)} ({tag}+{name})")
    assert not wrong, "drawn with a font other than matplotlib's own (redraw them from their CSVs): " + ", ".join(wrong)
