"""A stall watchdog for batch notebook execution: the papermill engine ``fda`` (used by :func:`.runner.execute`).

Why: papermill (through nbclient) waits for each cell's ``execute_reply`` on the shell channel. When that
reply is lost — the kernel ran the cell, reported ``idle`` on IOPub and is waiting for work, but the reply
never reaches the client — nbclient waits forever unless a per-cell timeout is set, and a per-cell timeout
cannot tell a lost reply from a long computation. The watchdog can:

* the client polls the shell channel in short steps instead of blocking, and watches the IOPub messages
  of the running cell (``status``, ``execute_input``, outputs);
* a cell is **stalled** when its reply has not arrived and either the kernel reported ``idle`` for this
  cell's request more than ``stall_timeout`` seconds ago, or no IOPub message at all arrived for it
  within ``stall_timeout`` seconds of the request (not even ``busy``);
* a long silent computation (``busy``, no output, no reply yet) is *not* a stall and runs as long as it
  needs (``execution_timeout`` still bounds it when set).

On a stall the client raises :class:`KernelStallError` (cell index, ``In [n]``, source, the reason), the
kernel is shut down immediately (no leaked kernel process), the stalled cell gets an error output in the
executed copy, and :func:`.runner.execute` re-executes the notebook once with a fresh kernel before it
reports the failure.

The same bound applies to the ``kernel_info`` requests papermill sends before the first and after the
last cell (also unbounded in nbclient).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import uuid
from dataclasses import dataclass
from queue import Empty
from time import monotonic
from typing import Any

from jupyter_client.manager import AsyncKernelManager
from jupyter_core.utils import ensure_async, run_sync
from nbclient.client import timestamp
from nbclient.exceptions import CellTimeoutError
from papermill.clientwrap import PapermillNotebookClient
from papermill.engines import NBClientEngine, papermill_engines
from papermill.log import logger
from papermill.utils import merge_kwargs, remove_args
from traitlets import Float

from .stalls import DEFAULT_STALL_TIMEOUT, ENGINE_NAME, KernelStallError

__all__ = ["DEFAULT_STALL_TIMEOUT", "ENGINE_NAME", "IPCKernelManager", "KernelStallError", "StallWatchingClient",
           "StallWatchingEngine", "register_engine"]


@dataclass
class _Activity:
    """What the client has seen of one request: when it was sent, the last IOPub message, when idle came."""

    sent: float
    cell_index: int | None = None
    last_iopub: float | None = None
    idle: float | None = None


class StallWatchingClient(PapermillNotebookClient):
    """papermill's notebook client with a stall watchdog (see the module docstring)."""

    stall_timeout = Float(
        DEFAULT_STALL_TIMEOUT, allow_none=True,
        help="Seconds without a reply while the kernel is idle (or silent since the request) after which a "
        "cell counts as stalled; None or <= 0 disables the watchdog.",
    ).tag(config=True)
    stall_poll_interval = Float(0.5, help="Seconds between polls of the shell channel.").tag(config=True)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._fda_activity: dict[str, _Activity] = {}

    # -- bookkeeping ----------------------------------------------------------------------------------

    @property
    def _watching(self) -> bool:
        return self.stall_timeout is not None and self.stall_timeout > 0

    def _activity(self, msg_id: str) -> _Activity:
        act = self._fda_activity.get(msg_id)
        if act is None:  # one request at a time: forget the previous cells
            act = _Activity(sent=monotonic())
            self._fda_activity = {msg_id: act}
        return act

    async def _async_poll_output_msg(self, parent_msg_id: str, cell: Any, cell_index: int) -> None:
        self._activity(parent_msg_id).cell_index = cell_index
        return await super()._async_poll_output_msg(parent_msg_id, cell, cell_index)

    def process_message(self, msg: dict[str, Any], cell: Any, cell_index: int) -> Any:
        act = self._fda_activity.get((msg.get("parent_header") or {}).get("msg_id", ""))
        if act is not None:
            now = monotonic()
            act.last_iopub = now
            if msg.get("msg_type") == "status" and msg.get("content", {}).get("execution_state") == "idle":
                act.idle = now
        return super().process_message(msg, cell, cell_index)

    def _stall_reason(self, act: _Activity, now: float) -> str | None:
        limit = float(self.stall_timeout or 0)
        if act.idle is not None and now - act.idle > limit:
            return (f"the kernel finished it and went idle {now - act.idle:.0f} s ago, but its execute_reply "
                    f"never arrived (lost reply)")
        if act.last_iopub is None and now - act.sent > limit:
            return f"the kernel sent no message at all for it in {now - act.sent:.0f} s (not even 'busy')"
        return None

    def _stall(self, reason: str, cell: Any, cell_index: int | None) -> KernelStallError:
        self.shutdown_kernel = "immediate"  # a stalled kernel is not asked nicely
        exec_count = None
        source = None
        if cell is not None:
            exec_count = cell.get("execution_count")
            source = cell.get("source")
            if exec_count is None and cell_index is not None:
                exec_count = self.code_cells_executed or None
        return KernelStallError(reason, cell_index=cell_index, exec_count=exec_count, source=source,
                                stall_timeout=self.stall_timeout)

    # -- the watched waits ----------------------------------------------------------------------------

    async def _async_poll_for_reply(self, msg_id: str, cell: Any, timeout: int | None, task_poll_output_msg: Any,
                                    task_poll_kernel_alive: Any) -> dict[str, Any]:
        if not self._watching:
            return await super()._async_poll_for_reply(msg_id, cell, timeout, task_poll_output_msg,
                                                       task_poll_kernel_alive)
        assert self.kc is not None
        act = self._activity(msg_id)
        cell_index = act.cell_index
        if cell_index is None:
            cell_index = next((i for i, c in enumerate(self.nb.cells) if c is cell), None)
        deadline = monotonic() + timeout if timeout is not None else None
        error_reply: dict[str, Any] | None = None
        while True:
            if error_reply is not None:
                msg = error_reply
                msg["parent_header"] = {"msg_id": msg_id}
            else:
                wait = self.stall_poll_interval
                if deadline is not None:
                    wait = max(0.0, min(wait, deadline - monotonic()))
                try:
                    msg = await ensure_async(self.kc.shell_channel.get_msg(timeout=wait))
                except Empty:
                    now = monotonic()
                    if deadline is not None and now >= deadline:  # the user's per-cell execution timeout
                        assert timeout is not None
                        task_poll_kernel_alive.cancel()
                        await self._async_check_alive()
                        error_reply = await self._async_handle_timeout(timeout, cell)
                        deadline = monotonic() + timeout
                        continue
                    reason = self._stall_reason(act, now)
                    if reason is not None:
                        task_poll_kernel_alive.cancel()
                        raise self._stall(reason, cell, cell_index) from None
                    continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if self.record_timing:
                cell["metadata"]["execution"]["shell.execute_reply"] = timestamp(msg)
            try:  # as nbclient: the reply is in, wait (briefly) for the rest of the IOPub output
                await asyncio.wait_for(task_poll_output_msg, self.iopub_timeout)
            except (asyncio.TimeoutError, Empty):
                if self.raise_on_iopub_timeout:
                    task_poll_kernel_alive.cancel()
                    raise CellTimeoutError.error_from_timeout_and_cell(
                        "Timeout waiting for IOPub output", self.iopub_timeout, cell) from None
                self.log.warning("Timeout waiting for IOPub output")
            task_poll_kernel_alive.cancel()
            return msg

    async def async_wait_for_reply(self, msg_id: str, cell: Any = None) -> dict[str, Any] | None:
        if not self._watching or cell is not None or self._get_timeout(cell) is not None:
            return await super().async_wait_for_reply(msg_id, cell)
        assert self.kc is not None
        start = monotonic()
        while True:
            try:
                msg = await ensure_async(self.kc.shell_channel.get_msg(timeout=self.stall_poll_interval))
            except Empty:
                await self._async_check_alive()
                waited = monotonic() - start
                if waited > float(self.stall_timeout or 0):
                    raise self._stall(f"no reply in {waited:.0f} s", None, None) from None
            else:
                if msg["parent_header"].get("msg_id") == msg_id:
                    return msg

    wait_for_reply = run_sync(async_wait_for_reply)
    _wait_for_reply = wait_for_reply


class IPCKernelManager(AsyncKernelManager):
    """The kernel manager of the engine's executions: the kernel's five channels on Unix domain sockets (ZMQ's
    ``ipc`` transport), named under a prefix of its own in the temp folder, instead of TCP ports.

    Why: for TCP, jupyter_client picks five ports free at that moment, closes them and hands them to the kernel,
    which binds them a moment later. Meanwhile another socket can take one of them, e.g. the client of a
    kernel started beside it connecting from an ephemeral port. The kernel then dies with "Address already in
    use" before it answers ``kernel_info``, as seen in CI with ``fda sweep --jobs 2``. Socket files under a unique
    prefix cannot be taken that way. Windows has no ipc transport: there the kernels keep TCP."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if os.name != "nt":
            self.transport = "ipc"
            self.cache_ports = False  # the TCP port cache does not apply to ipc
            self.ip = os.path.join(tempfile.gettempdir(), f"fda-kernel-{uuid.uuid4().hex[:12]}")


class StallWatchingEngine(NBClientEngine):
    """papermill's nbclient engine with :class:`StallWatchingClient` and two extra options:
    ``stall_timeout`` (seconds, None/0: off) and ``kernel_env`` (variables added to the kernel's
    environment, for this execution only — safe with several executions in threads)."""

    @classmethod
    def execute_managed_notebook(cls, nb_man: Any, kernel_name: str, log_output: bool = False, stdout_file: Any = None,
                                 stderr_file: Any = None, start_timeout: int = 60, execution_timeout: int | None = None,
                                 stall_timeout: float | None = DEFAULT_STALL_TIMEOUT,
                                 kernel_env: dict[str, str] | None = None, **kwargs: Any) -> Any:
        kwargs = remove_args(["input_path"], **kwargs)
        safe_kwargs = remove_args(["timeout", "startup_timeout"], **kwargs)
        final_kwargs = merge_kwargs(
            safe_kwargs,
            timeout=execution_timeout if execution_timeout else kwargs.get("timeout"),
            startup_timeout=start_timeout,
            kernel_name=kernel_name,
            log=logger,
            log_output=log_output,
            stdout_file=stdout_file,
            stderr_file=stderr_file,
        )
        final_kwargs.setdefault("kernel_manager_class", IPCKernelManager)
        client = StallWatchingClient(nb_man, stall_timeout=stall_timeout, **final_kwargs)
        launch = {"env": {**os.environ, **kernel_env}} if kernel_env else {}
        try:
            return client.execute(**launch)
        except KernelStallError as exc:
            _mark_stalled(nb_man, exc)
            raise


def _mark_stalled(nb_man: Any, exc: KernelStallError) -> None:
    """Show the stall in the executed copy: an error output on the cell, papermill's failure markers."""
    import nbformat

    if exc.cell_index is None or exc.cell_index >= len(nb_man.nb.cells):
        return
    cell = nb_man.nb.cells[exc.cell_index]
    text = f"KernelStallError: {exc.describe()}"
    cell.setdefault("outputs", []).append(
        nbformat.v4.new_output("error", ename="KernelStallError", evalue=exc.describe(), traceback=[text]))
    nb_man.cell_exception(cell, cell_index=exc.cell_index, exception=exc)


def register_engine() -> str:
    """Register :class:`StallWatchingEngine` with papermill as ``"fda"`` (idempotent); returns the name."""
    papermill_engines.register(ENGINE_NAME, StallWatchingEngine)
    return ENGINE_NAME


register_engine()
