"""What callers of the ``fda`` papermill engine need without importing the engine: the default stall limit,
the engine's name and the error a stall raises.

The engine itself (:mod:`.watchdog`) imports papermill, nbclient and through them nbformat and jsonschema, about
3 s on the 2-core CPU (``docs/performance.md`` § Compiled bytecode); :func:`.runner.execute` imports it when it first
executes a notebook, so ``fda list``, ``fda --help`` and the other commands that execute nothing start without it.
"""

from __future__ import annotations

__all__ = ["DEFAULT_STALL_TIMEOUT", "ENGINE_NAME", "KernelStallError"]

#: Default stall limit in seconds. The clock only runs while the kernel is idle without having answered,
#: or silent from the very start of a request: a healthy kernel announces ``busy`` within milliseconds
#: and replies within milliseconds of going ``idle``, however long the cell computes. Two minutes is far
#: above any scheduling hiccup on a loaded machine (2 cores, ``fda sweep --jobs``, swapping), and a real
#: stall then costs at most about two minutes before the retry, instead of hanging forever.
DEFAULT_STALL_TIMEOUT = 120.0

#: The name under which the engine is registered with papermill.
ENGINE_NAME = "fda"


class KernelStallError(RuntimeError):
    """A cell stalled: no ``execute_reply`` and no kernel activity for ``stall_timeout`` seconds.

    ``cell_index`` is the cell's index in the executed notebook (None for a ``kernel_info`` request
    outside any cell), ``exec_count`` its ``In [n]`` number when known, ``source`` its code, ``reason``
    what was observed and ``stall_timeout`` the limit that was exceeded.
    """

    def __init__(self, reason: str, *, cell_index: int | None = None, exec_count: int | None = None,
                 source: str | None = None, stall_timeout: float | None = None):
        self.reason = reason
        self.cell_index = cell_index
        self.exec_count = exec_count
        self.source = source
        self.stall_timeout = stall_timeout
        super().__init__(self.describe())

    @property
    def first_line(self) -> str:
        """The first non-blank line of the cell's source ("" when unknown)."""
        for line in (self.source or "").splitlines():
            if line.strip():
                return line.strip()
        return ""

    def where(self) -> str:
        """``"cell 9 (In [8]) `w = slider(...)`"`` or ``"the kernel_info request"``."""
        if self.cell_index is None:
            return "the kernel_info request"
        text = f"cell {self.cell_index}"
        if self.exec_count is not None:
            text += f" (In [{self.exec_count}])"
        if self.first_line:
            line = self.first_line if len(self.first_line) <= 100 else self.first_line[:97] + "..."
            text += f" `{line}`"
        return text

    def describe(self) -> str:
        return f"{self.where()} stalled: {self.reason}"
