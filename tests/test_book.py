"""Tests of the static HTML book (fda_core.workbook.book, ``fda book``).

Small executed notebooks are written with nbformat in tmp_path (no kernel, no network): markdown headings, a PNG
display, a widget panel with a PNG fallback, one without (its Output widget's plot is in the saved widget
state), a tqdm-style progress bar, and a stream output.
"""

from __future__ import annotations

import base64
import struct
import zlib
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest

from fda_core.workbook import book
from fda_core.workbook.book import (MATHJAX_CDN, MATHJAX_LOCAL, WIDGET_VIEW, build_book, offline_mathjax,
                                    title_and_blurb)
from fda_core.workbook.cli import main

NOTE = "Interactive panel: run this notebook in JupyterLab or open its dashboard"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def _png(rgb: tuple[int, int, int]) -> str:
    """A 1x1 PNG of one colour, base64 (distinct colours give distinct data URIs)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    raw = (chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(b"\x00" + bytes(rgb))) + chunk(b"IEND", b""))
    return base64.b64encode(b"\x89PNG\r\n\x1a\n" + raw).decode()


PLOT, FALLBACK, CAPTURED = _png((255, 0, 0)), _png((0, 255, 0)), _png((0, 0, 255))


def _view(model_id: str, text: str, **extra: str) -> nbformat.NotebookNode:
    data = {WIDGET_VIEW: {"model_id": model_id, "version_major": 2, "version_minor": 0}, "text/plain": text, **extra}
    return nbformat.v4.new_output("display_data", data=data)


def _model(name: str, **state: object) -> dict:
    return {"model_module": "@jupyter-widgets/controls", "model_module_version": "2.0.0", "model_name": name,
            "state": state}


def _notebook_a() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    plot = nbformat.v4.new_code_cell("plot()", execution_count=1, outputs=[
        nbformat.v4.new_output("display_data", data={"image/png": PLOT, "text/plain": "<Figure>"})])
    panel_with_png = nbformat.v4.new_code_cell("explorer()", execution_count=2,
                                               outputs=[_view("m-fallback", "VBox(...)", **{"image/png": FALLBACK})])
    panel = nbformat.v4.new_code_cell("theory_explorer()", execution_count=3,
                                      outputs=[_view("m-panel", "interactive(children=(FloatSlider(value=0.5)))")])
    progress = nbformat.v4.new_code_cell("train()", execution_count=4, outputs=[
        _view("m-bar", "train:   0%|          | 0/9"),
        nbformat.v4.new_output("stream", name="stdout", text="trained\n")])
    nb.cells = [
        nbformat.v4.new_markdown_cell("# 01 · Alpha *chapter*\n\nFirst paragraph of alpha, with $x^2$.\n\n"
                                      "Second paragraph."),
        plot, nbformat.v4.new_markdown_cell("## A section\nMore narrative."), panel_with_png, panel, progress,
    ]
    nb.metadata["widgets"] = {WIDGET_STATE: {"version_major": 2, "version_minor": 0, "state": {
        "m-panel": _model("VBoxModel", children=["IPY_MODEL_m-slider", "IPY_MODEL_m-out"]),
        "m-slider": _model("FloatSliderModel", value=0.5, description="beta"),
        "m-out": {"model_module": "@jupyter-widgets/output", "model_name": "OutputModel", "state": {"outputs": [
            {"output_type": "display_data", "data": {"image/png": CAPTURED, "text/plain": "<Figure>"},
             "metadata": {}}]}},
        "m-bar": _model("HBoxModel", children=["IPY_MODEL_m-l", "IPY_MODEL_m-p", "IPY_MODEL_m-r"]),
        "m-l": _model("HTMLModel", value="train: 100%"),
        "m-p": _model("FloatProgressModel", value=9.0, max=9.0),
        "m-r": _model("HTMLModel", value=" 9/9 [00:01&lt;00:00]"),
    }}}
    return nb


def _notebook_b() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# Beta chapter"),
                nbformat.v4.new_markdown_cell("Blurb of beta: the second cell's first paragraph.\n\nNot this."),
                nbformat.v4.new_code_cell("print(1)", execution_count=1,
                                          outputs=[nbformat.v4.new_output("stream", name="stdout", text="1\n")]),
                nbformat.v4.new_code_cell("js()", execution_count=2, outputs=[nbformat.v4.new_output(
                    "display_data", data={"application/javascript": "console.log(1)"})])]  # random element ids
    return nb


@pytest.fixture()
def workbook(tmp_path: Path) -> dict[str, Path]:
    """``src/`` (the notebooks expected: 01_a, 02_b, 03_c) and ``executed/`` (executed copies of 01_a, 02_b)."""
    src, executed = tmp_path / "src", tmp_path / "executed"
    src.mkdir()
    executed.mkdir()
    gamma = nbformat.v4.new_notebook()
    gamma.cells = [nbformat.v4.new_markdown_cell("# Gamma chapter\n\nGamma's blurb.")]
    for name, nb in (("01_a", _notebook_a()), ("02_b", _notebook_b()), ("03_c", gamma)):
        nbformat.write(nb, src / f"{name}.ipynb")
        if name != "03_c":
            nbformat.write(nb, executed / f"{name}.ipynb")
    return {"src": src, "executed": executed, "out": tmp_path / "site"}


class _Links(HTMLParser):
    """Every <a href> of a page, with its class and rel, and the number of <nav> elements."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[dict[str, str]] = []
        self.navs = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "nav":
            self.navs += 1
        if tag == "a" and "href" in a:
            self.links.append(a)


def _links(path: Path) -> _Links:
    parser = _Links()
    parser.feed(path.read_text(encoding="utf-8"))
    return parser


def _build(wb: dict[str, Path], out: Path | None = None, **kw: object) -> Path:
    names = kw.pop("names", ("01_a", "02_b"))
    return build_book(wb["executed"], out or wb["out"], notebooks=[wb["src"] / f"{n}.ipynb" for n in names], **kw)


def test_index_links_every_chapter(workbook: dict[str, Path]) -> None:
    index = _build(workbook)
    assert index == workbook["out"] / "index.html"
    hrefs = [a["href"] for a in _links(index).links]
    assert hrefs == ["01_a.html", "02_b.html"]
    assert all((index.parent / h).is_file() for h in hrefs)
    text = index.read_text(encoding="utf-8")
    assert "Alpha <em>chapter</em>" in text and "First paragraph of alpha" in text and "Second paragraph" not in text
    assert "Beta chapter" in text and "Blurb of beta" in text and "Not this" not in text
    assert "not executed yet" not in text


def test_navigation_bars(workbook: dict[str, Path]) -> None:
    out = _build(workbook).parent
    expected = {"01_a.html": (None, "02_b.html"), "02_b.html": ("01_a.html", None)}
    for page, (prev, nxt) in expected.items():
        parsed = _links(out / page)
        assert parsed.navs == 2  # top and bottom
        rel = lambda r: [a["href"] for a in parsed.links if a.get("rel") == r]  # noqa: E731
        contents = [a["href"] for a in parsed.links if "fda-book-contents" in a.get("class", "")]
        assert contents == ["index.html", "index.html"]
        assert rel("prev") == ([prev] * 2 if prev else [])
        assert rel("next") == ([nxt] * 2 if nxt else [])
        for a in parsed.links:
            if "fda-book" in a.get("class", ""):
                assert (out / a["href"]).is_file(), a
    page_a = (out / "01_a.html").read_text(encoding="utf-8")
    assert '<span class="fda-book-current" title="01 · Alpha chapter">01 · Alpha chapter</span>' in page_a
    assert "<title>01 · Alpha chapter</title>" in page_a
    page_b = (out / "02_b.html").read_text(encoding="utf-8")
    assert "02 · Beta chapter" in page_b
    assert "require.min.js" in page_b and "require.min.js" not in page_a  # only pages whose outputs run JavaScript


def test_images_embedded_and_widgets_static(workbook: dict[str, Path]) -> None:
    page = (_build(workbook).parent / "01_a.html").read_text(encoding="utf-8")
    for png in (PLOT, FALLBACK, CAPTURED):  # the plot, the panel's fallback, the plot its Output widget held
        assert f'src="data:image/png;base64,{png}"' in page
    assert page.count(NOTE) == 2  # one per panel; none under the progress bar
    assert "<progress" in page and "train: 100%" in page and "0/9" not in page
    for absent in ("Error displaying widget", WIDGET_VIEW, WIDGET_STATE, "interactive(children", "VBox(...)",
                   "jupyter-widgets", "unpkg.com", "require.min.js", "MathJax.Hub"):
        assert absent not in page, absent
    assert "trained" in page and "theory_explorer" in page  # outputs and code stay visible
    local = offline_mathjax()
    if local is not None:
        assert f'src="{MATHJAX_LOCAL}"' in page and (workbook["out"] / MATHJAX_LOCAL).is_file()
    else:
        assert f'src="{MATHJAX_CDN}"' in page


def test_missing_notebook(workbook: dict[str, Path]) -> None:
    with pytest.raises(FileNotFoundError, match="03_c") as info:
        _build(workbook, names=("01_a", "02_b", "03_c"))
    assert "make figures" in str(info.value) and "01_a" not in str(info.value)
    assert not (workbook["out"] / "index.html").exists()

    index = _build(workbook, names=("01_a", "02_b", "03_c"), allow_missing=True)
    text = index.read_text(encoding="utf-8")
    assert "Gamma chapter" in text and "not executed yet" in text  # title from the source notebook
    assert [a["href"] for a in _links(index).links] == ["01_a.html", "02_b.html"]
    assert not (index.parent / "03_c.html").exists()


def test_rebuild_is_byte_identical(workbook: dict[str, Path], tmp_path: Path) -> None:
    first = _build(workbook).parent
    files = {p.relative_to(first): p.read_bytes() for p in sorted(first.rglob("*")) if p.is_file()}
    assert _build(workbook).parent == first
    assert {p.relative_to(first): p.read_bytes() for p in sorted(first.rglob("*")) if p.is_file()} == files
    elsewhere = _build(workbook, tmp_path / "other").parent
    assert {p.relative_to(elsewhere): p.read_bytes() for p in sorted(elsewhere.rglob("*")) if p.is_file()} == files


def test_stale_chapter_pages_removed(workbook: dict[str, Path]) -> None:
    out = _build(workbook).parent
    (out / "07_old.html").write_text("old", encoding="utf-8")
    _build(workbook, names=("01_a",))
    assert not (out / "07_old.html").exists() and not (out / "02_b.html").exists()
    assert (out / "01_a.html").is_file()


def test_title_and_blurb_fallback() -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("No heading here.")]
    assert title_and_blurb(nb, "fallback") == ("fallback", "")
    nb.cells.insert(0, nbformat.v4.new_code_cell("x = 1"))
    nb.cells.append(nbformat.v4.new_markdown_cell("# Title #\n## Sub\n\nBody."))
    assert title_and_blurb(nb, "fallback") == ("Title", "Body.")


def test_cli(workbook: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FDA_NOTEBOOKS", str(workbook["src"]))  # expected: 01_a, 02_b, 03_c
    args = ["book", "--executed", str(workbook["executed"]), "--out", str(workbook["out"])]
    assert main(args) == 2
    captured = capsys.readouterr()
    assert "03_c" in captured.err and "make figures" in captured.err and captured.out == ""
    assert main([*args, "--allow-missing"]) == 0
    index = Path(capsys.readouterr().out.strip())
    assert index == (workbook["out"] / "index.html").resolve() and index.is_file()
    assert "not executed yet" in index.read_text(encoding="utf-8")


def test_template_is_package_data() -> None:
    folder = book.BOOK_TEMPLATE_DIR / book.TEMPLATE_NAME
    assert {p.name for p in folder.iterdir()} >= {"conf.json", "index.html.j2", "contents.html.j2",
                                                  "book_macros.html.j2"}


def test_mathjax_from_cdn_without_the_package(workbook: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(book, "offline_mathjax", lambda: None)
    out = _build(workbook).parent
    for page in ("index.html", "01_a.html"):
        assert f'src="{MATHJAX_CDN}"' in (out / page).read_text(encoding="utf-8")
    assert not (out / "_static").exists()
