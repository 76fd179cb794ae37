"""Dashboards: the slider panels as Voila apps, and local servers started and stopped by process id.

A dashboard is a notebook under ``notebooks/dashboards/`` (``theory``, ``phase_diagram``, ``estimators``,
``results``); Voila runs it and shows only its outputs. ``fda dashboard NAME [-p NAME VALUE]...`` starts one
on 127.0.0.1 at a free port and prints its URL (:func:`serve`). Parameters are injected with papermill into a
prepared copy, exactly as ``fda run`` does, and checked against the dashboard's parameters cell first.

:class:`LocalServer` is also what the browser tests use for JupyterLab and Voila: a process in its own
session on 127.0.0.1, ready when its URL answers, stopped by its process id (SIGTERM to its process group,
then SIGKILL), with a bounded start-up time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from urllib.parse import urlsplit
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from ..common.ports import free_port, listening
from .discovery import NotebookError, notebooks_dir

__all__ = ["dashboards_dir", "list_dashboards", "resolve_dashboard", "prepare_notebook", "LocalServer",
           "voila_command", "jupyterlab_command", "start_dashboard", "serve"]


def dashboards_dir() -> Path:
    """``notebooks/dashboards`` of the workbook (follows ``$FDA_NOTEBOOKS`` like the notebooks)."""
    return notebooks_dir() / "dashboards"


def list_dashboards() -> dict[str, Path]:
    """Every dashboard by name (the notebook's stem), sorted."""
    folder = dashboards_dir()
    return {p.stem: p for p in sorted(folder.glob("*.ipynb")) if not p.name.startswith(".")} if folder.is_dir() else {}


def resolve_dashboard(name: str) -> Path:
    """The notebook of dashboard ``name``; a ``NotebookError`` lists the available ones otherwise."""
    found = list_dashboards()
    if name not in found:
        raise NotebookError(f"no dashboard {name!r}; available: {', '.join(found) or 'none'} (in {dashboards_dir()})")
    return found[name]


def prepare_notebook(path: str | os.PathLike, parameters: Mapping[str, Any], out_dir: str | os.PathLike) -> Path:
    """A copy of the notebook at ``path`` in ``out_dir`` with ``parameters`` injected after its parameters
    cell (papermill, not executed); values must already be validated. Returns the copy's path."""
    import papermill

    out = Path(out_dir) / Path(path).name
    papermill.execute_notebook(str(path), str(out), parameters=dict(parameters), prepare_only=True,
                               progress_bar=False, log_output=False)
    return out


class LocalServer:
    """A server process on 127.0.0.1: started in its own session, ready when ``url`` answers, stopped by pid.

    Use as a context manager or call :meth:`start` / :meth:`stop`. Output goes to ``log`` (a file path).
    """

    def __init__(self, command: Sequence[str], url: str, log: str | os.PathLike, cwd: str | os.PathLike | None = None,
                 env: Mapping[str, str] | None = None, probe: str | None = None):
        self.command = list(command)
        self.url = url
        self.probe = probe  # a URL to GET for readiness; None: the port accepting connections is enough
        self.log = Path(log)
        self.cwd = cwd
        self.env = {**os.environ, **(env or {})}
        self.process: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def start(self, timeout: float = 120.0) -> "LocalServer":
        """Start the process and wait (at most ``timeout`` s) until ``url`` answers; a process that exits or
        does not answer in time is stopped and raises ``RuntimeError`` with the end of its log."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("wb") as fh:
            self.process = subprocess.Popen(self.command, stdout=fh, stderr=subprocess.STDOUT, cwd=self.cwd,
                                            env=self.env, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}: {self._tail()}")
            try:
                if self.probe is None:
                    parts = urlsplit(self.url)
                    if listening(parts.port, parts.hostname):
                        return self
                    time.sleep(0.5)
                    continue
                with urllib.request.urlopen(self.probe, timeout=5):
                    return self
            except urllib.error.HTTPError:
                return self  # it answers (a redirect or an error page): it is up
            except (urllib.error.URLError, OSError):
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"server did not answer at {self.url} within {timeout:g} s: {self._tail()}")

    def _tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM to the process group (the server and its kernels), SIGKILL after ``grace`` seconds."""
        if self.process is None or self.process.poll() is not None:
            return
        pgid = self.process.pid  # start_new_session: the process leads its own group
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                return
            try:
                self.process.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def __enter__(self) -> "LocalServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def voila_command(notebook: str | os.PathLike, port: int) -> list[str]:
    """Voila serving one notebook on 127.0.0.1:``port`` (no browser; the kernel is this Python's)."""
    # only the widget manager among the installed JupyterLab extensions: others (jupytext's) fail to load in
    # Voila's page and log JavaScript errors
    return [sys.executable, "-m", "voila", str(notebook), "--no-browser", f"--port={port}", "--Voila.ip=127.0.0.1",
            "--show_tracebacks=True", "--VoilaConfiguration.extension_denylist=['jupyterlab-jupytext']"]


def jupyterlab_command(root_dir: str | os.PathLike, port: int) -> list[str]:
    """JupyterLab on 127.0.0.1:``port`` serving ``root_dir``, without token (loopback only), no browser."""
    return [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.root_dir={root_dir}", "--IdentityProvider.token=", "--ServerApp.password=",
            "--ServerApp.port_retries=0", "--ServerApp.allow_root=True", "--LabApp.news_url=",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate", "--LabApp.extension_manager=readonly"]


def start_dashboard(name: str, parameters: Mapping[str, Any] | None = None, *, port: int | None = None,
                    workdir: str | os.PathLike | None = None, timeout: float = 120.0) -> LocalServer:
    """Start dashboard ``name`` with Voila (parameters validated and injected first); returns the running
    server, whose ``url`` is the dashboard's address."""
    from .parameters import validate_parameters

    path = resolve_dashboard(name)
    params = dict(parameters or {})  # validated by the caller (cmd_dashboard) or given typed
    if params:
        params = validate_parameters(path, params, raw=False)
    work = Path(workdir or tempfile.mkdtemp(prefix=f"fda-dashboard-{name}-"))
    notebook = prepare_notebook(path, params, work) if params else path
    port = port or free_port()
    return LocalServer(voila_command(notebook, port), f"http://127.0.0.1:{port}/", work / "voila.log").start(timeout)


def serve(name: str, parameters: Mapping[str, Any] | None, port: int | None, duration: float | None,
          out: TextIO) -> int:
    """``fda dashboard NAME``: start it, print the URL, serve until Ctrl-C (or ``duration`` seconds), stop it."""
    server = start_dashboard(name, parameters, port=port)
    print(f"dashboard {name}: {server.url}  (pid {server.pid}; log {server.log}; Ctrl-C stops it)", file=out, flush=True)
    try:
        deadline = None if duration is None else time.monotonic() + duration
        while server.process.poll() is None and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    print(f"dashboard {name} stopped", file=out)
    return 0


def add_dashboard_parser(sub: Any) -> None:
    """The ``dashboard`` sub-command of ``fda``."""
    p = sub.add_parser("dashboard", help="start a dashboard (Voila) on 127.0.0.1 and print its URL",
                       description="Start one of the dashboards under notebooks/dashboards with Voila on 127.0.0.1 "
                       "(a free port unless --port) and print its URL; Ctrl-C stops it. Without NAME: list them.",
                       epilog="Examples:\n  fda dashboard theory\n  fda dashboard estimators -p n_draws 500\n"
                       "  fda dashboard results --port 8866", formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    p.add_argument("name", nargs="?", metavar="NAME", help="theory, phase_diagram, estimators or results")
    p.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"), dest="params",
                   help="set a parameter of the dashboard (repeatable; coerced by its declared type)")
    p.add_argument("--port", type=int, default=None, help="port on 127.0.0.1 (default: a free one)")
    p.add_argument("--duration", type=float, default=None, metavar="SECONDS",
                   help="stop after this many seconds (default: run until Ctrl-C)")


def cmd_dashboard(args: Any, out: TextIO, err: TextIO) -> int:
    """Run ``fda dashboard [NAME]``; returns the exit status (2: unknown dashboard or bad parameter)."""
    from .parameters import notebook_parameters, validate_parameters

    if not args.name:
        for name, path in list_dashboards().items():
            params = ", ".join(notebook_parameters(path))
            print(f"{name:14s} {path}  [parameters: {params}]", file=out)
        return 0
    path = resolve_dashboard(args.name)
    params = validate_parameters(path, {k: v for k, v in args.params}, raw=True) if args.params else {}
    if args.port is not None and not 1 <= args.port <= 65535:
        print(f"fda: --port must be in [1, 65535], got {args.port}", file=err)
        return 2
    try:
        return serve(args.name, params, args.port, args.duration, out)
    except RuntimeError as exc:
        print(f"fda: dashboard {args.name} did not start: {exc}", file=err)
        return 1
