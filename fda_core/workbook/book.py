"""A static HTML site of the executed notebooks, for teaching (``fda book`` / ``make book``).

:func:`build_book` renders every numbered executed notebook (``executed/NN_topic.ipynb``, written by
``fda run all --out executed``) with nbconvert's ``HTMLExporter`` (lab template, extended by the small template
``book_template/fda_book``: a navigation bar at the top and bottom of each page) and writes ``index.html``, the
contents page: chapter number, title (the notebook's first ``# `` heading) and its first paragraph.

The site is one folder that works when copied, without a server or the network:

* images are embedded (base64 data URIs, nbconvert's default; markdown images too, ``embed_images``);
* ipywidgets outputs cannot run in a static page, so :class:`StaticWidgetsPreprocessor` replaces them: a panel's
  ``image/png`` fallback, else the outputs its ``Output`` widgets held when the notebook ran, then the note
  :data:`WIDGET_NOTE`; a progress bar (tqdm) becomes its final state. No widget state or widget manager is
  embedded, so no "Error displaying widget" placeholder can appear;
* MathJax 3 (``tex-svg-full.js``, one self-contained file) is copied into ``_static/`` when the package
  ``django-static-mathjax`` is installed (:func:`offline_mathjax`); otherwise pages load it from a CDN when viewed
  (building never needs the network).

The build is deterministic: the same notebooks give byte-identical files (no timestamps, no random ids).
"""

from __future__ import annotations

import html
import importlib.util
import re
import shutil
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
from nbconvert import HTMLExporter
from nbconvert.filters.markdown_mistune import markdown2html_mistune
from nbconvert.preprocessors import Preprocessor

from .discovery import find_notebooks, notebook_number, notebooks_dir

__all__ = ["build_book", "Chapter", "MissingExecutedNotebooksError", "StaticWidgetsPreprocessor", "offline_mathjax",
           "WIDGET_NOTE", "BOOK_TEMPLATE_DIR"]

BOOK_TEMPLATE_DIR = Path(__file__).with_name("book_template")
"""Package data: holds the nbconvert template ``fda_book`` (chapter pages, contents page, shared macros)."""
TEMPLATE_NAME = "fda_book"
DEFAULT_TITLE = "Federated domain adaptation workbook"

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
WIDGET_NOTE = "Interactive panel: run this notebook in JupyterLab or open its dashboard (`fda dashboard`)"
"""The note shown under every interactive widget panel (markdown; ``fda dashboard`` is rendered as code)."""
_WIDGET_NOTE_HTML = ('<p class="fda-widget-note">Interactive panel: run this notebook in JupyterLab or open its '
                     "dashboard (<code>fda dashboard</code>)</p>")

MATHJAX_CDN = "https://cdnjs.cloudflare.com/ajax/libs/mathjax/3.2.2/es5/tex-svg-full.js"
MATHJAX_LOCAL = "_static/mathjax/tex-svg-full.js"
"""Where the offline MathJax goes, relative to the site folder (also the pages' ``src``)."""

_UUID_NAMESPACE = uuid.UUID("6f1f8a52-3c1e-4d52-9d35-0f3a4b6c7d8e")
_HEADING = re.compile(r"^#\s+(?P<title>.+?)\s*#*\s*$")


class MissingExecutedNotebooksError(FileNotFoundError):
    """Notebooks of the workbook have no executed copy; ``missing`` holds their stems."""

    def __init__(self, missing: Sequence[str], executed_dir: Path):
        self.missing = list(missing)
        self.executed_dir = executed_dir
        super().__init__(
            f"{len(self.missing)} notebook(s) have no executed copy in {executed_dir}: {', '.join(self.missing)}. "
            "Run `make figures` (or `fda run NN --out executed` for one) first, or build with --allow-missing "
            "(allow_missing=True) to list them as not executed yet."
        )


# --------------------------------------------------------------------------------------------------
# widgets


def _model_id(ref: Any) -> str | None:
    """``IPY_MODEL_<id>`` (how widget state refers to another model) -> ``<id>``."""
    return ref[len("IPY_MODEL_"):] if isinstance(ref, str) and ref.startswith("IPY_MODEL_") else None


def _progress_html(model_id: str, state: dict[str, Any]) -> str | None:
    """A progress bar (an HBox of HTML labels around a Float/IntProgress, as tqdm.notebook makes) as static HTML,
    in its final state; None when ``model_id`` is not one."""
    model = state.get(model_id)
    if not model or model.get("model_name") != "HBoxModel":
        return None
    children = [state.get(_model_id(ref) or "") or {} for ref in model.get("state", {}).get("children", [])]
    names = [c.get("model_name") for c in children]
    if not any(n in ("FloatProgressModel", "IntProgressModel") for n in names):
        return None
    if not all(n in ("FloatProgressModel", "IntProgressModel", "HTMLModel", "LabelModel") for n in names):
        return None
    parts = []
    for child, name in zip(children, names):
        s = child.get("state", {})
        if name == "HTMLModel":
            parts.append(f"<span>{s.get('value', '')}</span>")
        elif name == "LabelModel":
            parts.append(f"<span>{html.escape(str(s.get('value', '')))}</span>")
        else:
            parts.append(f'<progress value="{s.get("value", 0)}" max="{s.get("max", 100)}"></progress>')
    return '<div class="fda-progress">' + " ".join(parts) + "</div>"


def _captured_outputs(model_id: str, state: dict[str, Any], seen: set[str] | None = None) -> list[dict[str, Any]]:
    """The outputs held by the ``Output`` widgets inside a widget (depth first, in the children's order)."""
    seen = set() if seen is None else seen
    model = state.get(model_id)
    if not model or model_id in seen:
        return []
    seen.add(model_id)
    s = model.get("state", {})
    if model.get("model_name") == "OutputModel":
        return list(s.get("outputs", []))
    found: list[dict[str, Any]] = []
    for ref in s.get("children", []):
        child = _model_id(ref)
        if child:
            found.extend(_captured_outputs(child, state, seen))
    return found


def _static_output(raw: dict[str, Any]) -> nbformat.NotebookNode | None:
    """One captured output as a plain notebook output (widget views inside dropped), or None."""
    kind = raw.get("output_type")
    if kind == "stream":
        return nbformat.v4.new_output("stream", name=raw.get("name", "stdout"), text=raw.get("text", ""))
    if kind == "error":
        return nbformat.v4.new_output("error", ename=raw.get("ename", ""), evalue=raw.get("evalue", ""),
                                      traceback=raw.get("traceback", []))
    if kind in ("display_data", "execute_result"):
        data = {k: v for k, v in raw.get("data", {}).items() if k != WIDGET_VIEW}
        if WIDGET_VIEW in raw.get("data", {}):  # a nested widget: only its images, never its text repr
            data = {k: v for k, v in data.items() if k.startswith("image/")}
        if data:
            return nbformat.v4.new_output("display_data", data=data, metadata=raw.get("metadata", {}))
    return None


def _note_output() -> nbformat.NotebookNode:
    return nbformat.v4.new_output("display_data", data={"text/html": _WIDGET_NOTE_HTML})


class StaticWidgetsPreprocessor(Preprocessor):
    """Replaces ipywidgets outputs (``application/vnd.jupyter.widget-view+json``) by static ones and drops the
    notebook's widget state.

    A panel with an image fallback (``image/png`` ...) shows the image; one without shows what its ``Output``
    widgets held when the notebook ran (taken from the saved widget state, which is then not embedded). Either
    way :data:`WIDGET_NOTE` follows. A progress bar (tqdm) is shown in its final state, without the note. The
    widget's text repr (``interactive(children=...)``) is never shown.
    """

    def preprocess(self, nb: nbformat.NotebookNode, resources: dict[str, Any]
                   ) -> tuple[nbformat.NotebookNode, dict[str, Any]]:
        widgets = nb.metadata.pop("widgets", None) or {}
        state: dict[str, Any] = (widgets.get(WIDGET_STATE) or {}).get("state") or {}
        for cell in nb.cells:
            if cell.cell_type == "code" and any(WIDGET_VIEW in o.get("data", {}) for o in cell.get("outputs", [])):
                cell.outputs = self._static_outputs(cell.outputs, state)
        return nb, resources

    def _static_outputs(self, outputs: list[Any], state: dict[str, Any]) -> list[Any]:
        new: list[Any] = []
        for out in outputs:
            data = out.get("data", {})
            if WIDGET_VIEW not in data:
                new.append(out)
                continue
            model_id = str((data.get(WIDGET_VIEW) or {}).get("model_id", ""))
            images = {k: v for k, v in data.items() if k.startswith("image/")}
            if images:
                new.append(nbformat.v4.new_output("display_data", data=images, metadata=out.get("metadata", {})))
            else:
                bar = _progress_html(model_id, state)
                if bar is not None:
                    new.append(nbformat.v4.new_output("display_data", data={"text/html": bar}))
                    continue
                new.extend(o for o in map(_static_output, _captured_outputs(model_id, state)) if o is not None)
            new.append(_note_output())
        return new


class _BookExporter(HTMLExporter):
    """nbconvert's HTMLExporter with element ids derived from the page name and a counter instead of random
    ``uuid4()`` values (the lab template gives each JavaScript output one), so rebuilding gives the same bytes."""

    _uuid_seed = ""
    _uuid_count = 0

    def _next_uuid(self) -> uuid.UUID:
        self._uuid_count += 1
        return uuid.uuid5(_UUID_NAMESPACE, f"{self._uuid_seed}:{self._uuid_count}")

    def _create_environment(self) -> Any:
        environment = super()._create_environment()
        environment.globals["uuid4"] = self._next_uuid
        return environment

    def render(self, nb: nbformat.NotebookNode, name: str, resources: dict[str, Any]) -> str:
        """The HTML page of one notebook; ``name`` seeds the element ids."""
        self._uuid_seed, self._uuid_count = name, 0
        body, _ = self.from_notebook_node(nb, resources=resources)
        return body


# --------------------------------------------------------------------------------------------------
# chapters


@dataclass(frozen=True)
class Chapter:
    """One chapter: ``executed`` is None when the notebook has no executed copy (listed as "not executed yet")."""

    number: int
    stem: str
    title: str  # markdown of the first "# " heading (or the stem)
    blurb: str  # markdown of the first paragraph after it
    executed: Path | None

    @property
    def page(self) -> str:
        """The chapter's file name in the site."""
        return f"{self.stem}.html"

    @property
    def label(self) -> str:
        """``NN · title`` as plain text (navigation bar, page title); a title already numbered is not renumbered."""
        text = _plain(self.title)
        prefix = re.match(rf"^0*{self.number}\s*[·:.\-–—]\s*", text)
        return text if prefix else f"{self.number:02d} · {text}"


def _plain(markdown: str) -> str:
    """Inline markdown as plain text (tags stripped, entities decoded)."""
    return html.unescape(re.sub(r"<[^>]+>", "", _inline_html(markdown))).strip()


def _inline_html(markdown: str) -> str:
    """Inline markdown (a title) as HTML without the surrounding paragraph."""
    text = markdown2html_mistune(markdown).strip()
    return text[3:-4].strip() if text.startswith("<p>") and text.endswith("</p>") else text


def title_and_blurb(nb: nbformat.NotebookNode, fallback: str) -> tuple[str, str]:
    """The first markdown ``# `` heading of a notebook and the first paragraph after it (markdown), or
    ``(fallback, "")``."""
    title, blurb = None, ""
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        for block in re.split(r"\n\s*\n", cell.source.strip()):
            lines = block.strip().splitlines()
            if not lines:
                continue
            if title is None:
                m = _HEADING.match(lines[0])
                if m:
                    title = m["title"]
                    rest = "\n".join(lines[1:]).strip()
                    if rest and not rest.startswith("#"):
                        return title, rest
                continue
            if not lines[0].lstrip().startswith("#"):
                return title, block.strip()
    return (title, blurb) if title is not None else (fallback, "")


def _read_chapter(stem: str, executed: Path | None, source: Path | None) -> Chapter:
    """The chapter of notebook ``stem``: title and blurb from the executed copy, else from the source notebook."""
    fallback = stem.split("_", 1)[-1].replace("_", " ")
    title, blurb = fallback, ""
    for path in (executed, source):
        if path is not None and path.is_file():
            title, blurb = title_and_blurb(nbformat.read(path, as_version=4), fallback)
            break
    return Chapter(number=notebook_number(stem) or 0, stem=stem, title=title, blurb=blurb, executed=executed)


def offline_mathjax() -> Path | None:
    """MathJax 3's self-contained ``es5/tex-svg-full.js`` from the package ``django-static-mathjax`` (import name
    ``mathjax``), or None when it is not installed."""
    spec = importlib.util.find_spec("mathjax")
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        candidate = Path(folder) / "static" / "mathjax" / "es5" / "tex-svg-full.js"
        if candidate.is_file():
            return candidate
    return None


def _needs_requirejs(nb: nbformat.NotebookNode) -> bool:
    """Whether an output runs JavaScript that may use require.js (otherwise the page does not load it)."""
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if "application/javascript" in data or "require(" in str(data.get("text/html", "")):
                return True
    return False


def _write(path: Path, text: str) -> None:
    """Write only when the bytes differ (keeps modification times of unchanged pages)."""
    data = text.encode("utf-8")
    if not path.is_file() or path.read_bytes() != data:
        path.write_bytes(data)


# --------------------------------------------------------------------------------------------------
# the book


def build_book(executed_dir: Path, out_dir: Path, *, notebooks: list[Path] | None = None,
               allow_missing: bool = False, title: str = DEFAULT_TITLE) -> Path:
    """Render the executed notebooks in ``executed_dir`` as a static site in ``out_dir``; returns ``index.html``.

    ``notebooks`` are the chapters expected (only their names count; default: the numbered notebooks of
    :func:`~.discovery.notebooks_dir`); each must have its executed copy ``executed_dir/<name>``. Without any
    expected notebook (no source folder), every numbered notebook found in ``executed_dir`` is a chapter.
    Missing executed copies raise :class:`MissingExecutedNotebooksError` (a FileNotFoundError naming them) unless
    ``allow_missing``, which lists them on the contents page as "not executed yet".
    """
    executed_dir, out_dir = Path(executed_dir), Path(out_dir)
    expected = list(notebooks) if notebooks is not None else find_notebooks(notebooks_dir())
    found = {p.name: p for p in find_notebooks(executed_dir)}
    sources = {Path(p).name: Path(p) for p in expected} or {name: None for name in found}
    names = sorted(sources, key=lambda n: (notebook_number(n) or 0, n))
    missing = [Path(n).stem for n in names if n not in found]
    if missing and not allow_missing:
        raise MissingExecutedNotebooksError(missing, executed_dir)
    if not names:
        raise FileNotFoundError(f"no numbered executed notebooks (NN_topic.ipynb) in {executed_dir}; "
                                "run `make figures` (or `fda run NN --out executed`) first")
    chapters = [_read_chapter(Path(n).stem, found.get(n), sources[n]) for n in names]

    out_dir.mkdir(parents=True, exist_ok=True)
    mathjax = offline_mathjax()
    if mathjax is not None:
        target = out_dir / MATHJAX_LOCAL
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.is_file() or target.read_bytes() != mathjax.read_bytes():
            shutil.copyfile(mathjax, target)
    mathjax_url = MATHJAX_LOCAL if mathjax is not None else MATHJAX_CDN

    exporter = _BookExporter(template_name=TEMPLATE_NAME, extra_template_basedirs=[str(BOOK_TEMPLATE_DIR)],
                             embed_images=True, mathjax_url=mathjax_url)
    exporter.register_preprocessor(StaticWidgetsPreprocessor(), enabled=True)

    built = [c for c in chapters if c.executed is not None]
    for i, chapter in enumerate(built):
        assert chapter.executed is not None
        nb = nbformat.read(chapter.executed, as_version=4)
        resources = {
            "metadata": {"name": chapter.label, "path": str(chapter.executed.parent)},
            "fda_book": {"contents_href": "index.html", "current": _link(chapter),
                         "prev": _link(built[i - 1] if i > 0 else None),
                         "next": _link(built[i + 1] if i + 1 < len(built) else None),
                         "requirejs": _needs_requirejs(nb)},
        }
        _write(out_dir / chapter.page, exporter.render(nb, chapter.stem, resources))

    pages = {c.page for c in built}
    for stale in out_dir.glob("*.html"):  # pages of chapters that are gone (renamed or removed notebooks)
        if notebook_number(stale) is not None and stale.name not in pages:
            stale.unlink()

    index = out_dir / "index.html"
    _write(index, _render_contents(chapters, title, mathjax_url))
    return index


def _link(chapter: Chapter | None) -> dict[str, str] | None:
    """A navigation-bar link (``href``, ``label``) to ``chapter``; None for none."""
    return None if chapter is None else {"href": chapter.page, "label": chapter.label}


def _render_contents(chapters: Sequence[Chapter], title: str, mathjax_url: str) -> str:
    """The contents page (``contents.html.j2``, autoescaped)."""
    from jinja2 import Environment, FileSystemLoader
    from markupsafe import Markup

    env = Environment(loader=FileSystemLoader(str(BOOK_TEMPLATE_DIR / TEMPLATE_NAME)), autoescape=True,
                      keep_trailing_newline=True)
    rows = [{"number": f"{c.number:02d}", "href": c.page if c.executed is not None else None,
             "title_html": Markup(_inline_html(_strip_number(c))),
             "blurb_html": Markup(markdown2html_mistune(c.blurb)) if c.blurb else ""} for c in chapters]
    return env.get_template("contents.html.j2").render(title=title, chapters=rows, mathjax_url=mathjax_url)


def _strip_number(chapter: Chapter) -> str:
    """A title without its leading chapter number (``02 · Phase diagram`` -> ``Phase diagram``)."""
    return re.sub(rf"^0*{chapter.number}\s*[·:.\-–—]\s*", "", chapter.title, count=1) or chapter.title
