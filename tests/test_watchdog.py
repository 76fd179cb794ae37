"""The stall watchdog (fda_core.workbook.watchdog) against a real kernel that loses messages.

A kernelspec ``dropreply`` in a temporary JUPYTER_PATH starts an IPython kernel that swallows the
``execute_reply`` of any cell containing ``# drop-reply`` (the papermill/nbclient lost-reply hang: the
kernel ran the cell and went idle, the client waits forever) and every message of a cell containing
``# drop-all`` (a kernel that stays silent), the first $FDA_TEST_DROP_TIMES times. Every test that starts
a kernel has a hard timeout, and checks that no kernel process is left behind.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import nbformat
import pytest

from fda_core.workbook.cli import main
from fda_core.workbook.runner import execute

KERNEL_SCRIPT = '''\
"""IPython kernel that loses messages on purpose (see tests/test_watchdog.py)."""
import os
from pathlib import Path

from ipykernel.ipkernel import IPythonKernel
from ipykernel.kernelapp import IPKernelApp


def _should_drop():
    counter = os.environ.get("FDA_TEST_DROP_COUNT")
    times = int(os.environ.get("FDA_TEST_DROP_TIMES", "1000000"))
    if not counter:
        return True
    path = Path(counter)
    done = int(path.read_text() or 0) if path.exists() else 0
    if done >= times:
        return False
    path.write_text(str(done + 1))
    return True


class DropReplyKernel(IPythonKernel):
    _decided_msg_id = None
    _drop_msg_id = None
    _silent_msg_id = None

    def set_parent(self, ident, parent, channel="shell"):
        # called once per request, before the kernel announces "busy": decide here what to lose
        header = parent.get("header") or {}
        if channel == "shell" and header.get("msg_type") == "execute_request" and header.get("msg_id") != self._decided_msg_id:
            code = (parent.get("content") or {}).get("code", "")
            self._decided_msg_id = header.get("msg_id")
            drop = ("# drop-reply" in code or "# drop-all" in code) and _should_drop()
            self._drop_msg_id = header.get("msg_id") if drop else None
            self._silent_msg_id = self._drop_msg_id if "# drop-all" in code else None
        return super().set_parent(ident, parent, channel)

    def _silent(self, parent):
        return parent is not None and (parent.get("header") or {}).get("msg_id") == self._silent_msg_id

    def _publish_status(self, status, channel, parent=None):
        if not self._silent(parent or self.get_parent(channel)):
            super()._publish_status(status, channel, parent)

    def _publish_execute_input(self, code, parent, execution_count):
        if not self._silent(parent):
            super()._publish_execute_input(code, parent, execution_count)

    async def execute_request(self, stream, ident, parent):
        if (parent.get("header") or {}).get("msg_id") != self._drop_msg_id:
            return await super().execute_request(stream, ident, parent)
        real = self.session.send  # kernelbase.execute_request sends the reply with session.send(..., "execute_reply", ...)

        def send(stream_, msg_or_type, content=None, parent=None, *args, **kwargs):
            if msg_or_type == "execute_reply":
                return {"header": {}, "parent_header": {}, "content": dict(content or {})}
            return real(stream_, msg_or_type, content, parent, *args, **kwargs)

        self.session.send = send
        try:
            return await super().execute_request(stream, ident, parent)
        finally:
            self.session.send = real


if __name__ == "__main__":
    with open(os.environ["FDA_TEST_KERNEL_PIDS"], "a") as fh:
        fh.write(f"{os.getpid()}\\n")
    IPKernelApp.launch_instance(kernel_class=DropReplyKernel)
'''

KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}


@pytest.fixture
def dropping_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Install the ``dropreply`` kernel in a temporary JUPYTER_PATH; returns the file of kernel pids."""
    script = tmp_path / "drop_kernel.py"
    script.write_text(KERNEL_SCRIPT)
    spec_dir = tmp_path / "jupyter" / "kernels" / "dropreply"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, str(script), "-f", "{connection_file}"],
        "display_name": "Python 3 (drops replies)", "language": "python",
    }))
    pids = tmp_path / "kernel_pids.txt"
    pids.write_text("")
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("FDA_TEST_KERNEL_PIDS", str(pids))
    monkeypatch.setenv("FDA_TEST_DROP_COUNT", str(tmp_path / "dropped.txt"))
    return pids


def _drop_times(monkeypatch: pytest.MonkeyPatch, k: int) -> None:
    monkeypatch.setenv("FDA_TEST_DROP_TIMES", str(k))


def _notebook(path: Path, *cells: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = KERNELSPEC
    params = nbformat.v4.new_code_cell("k: int = 0  # a knob")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, *(nbformat.v4.new_code_cell(c) for c in cells)]
    nbformat.write(nb, path)
    return path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead too (only its exit status is left)
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _assert_kernels_gone(pids_file: Path, expected: int) -> None:
    pids = [int(x) for x in pids_file.read_text().split()]
    assert len(pids) == expected, pids
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in pids if _alive(p)], "kernel processes were left running"


@pytest.mark.timeout(120)
def test_lost_reply_is_retried_once_then_succeeds(tmp_path: Path, dropping_kernel: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    _drop_times(monkeypatch, 1)
    nb = _notebook(tmp_path / "nb.ipynb", "x = 41  # drop-reply", "print(x + 1)")
    res = execute(nb, tmp_path / "out" / "nb.ipynb", kernel_name="dropreply", stall_timeout=2, progress_bar=False)
    assert res.ok and res.status == "done", res.error_summary()
    assert res.retried is not None and "cell 1" in res.retried and "x = 41  # drop-reply" in res.retried
    assert "went idle" in res.retried
    executed = nbformat.read(res.output, as_version=4)
    assert executed.cells[2].outputs[0]["text"] == "42\n"
    _assert_kernels_gone(dropping_kernel, 2)


@pytest.mark.timeout(120)
def test_lost_reply_twice_fails_naming_the_cell(tmp_path: Path, dropping_kernel: Path,
                                                monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    _drop_times(monkeypatch, 2)
    nb = _notebook(tmp_path / "01_stall.ipynb", "a = 1", "b = a + 1  # drop-reply\nprint(b)", "print('never')")
    out_dir = tmp_path / "executed"
    start = time.monotonic()
    code = main(["run", str(nb), "--kernel", "dropreply", "--stall-timeout", "2", "--out", str(out_dir),
                 "--no-progress", "--cwd", str(tmp_path)])
    assert code == 1
    assert time.monotonic() - start < 90
    err = capsys.readouterr().err
    assert "FAILED 01_stall: cell 2 (In [3]): KernelStallError" in err
    assert "`b = a + 1  # drop-reply` stalled twice" in err and "went idle" in err
    assert "--stall-timeout SECONDS" in err
    failed = out_dir / "01_stall.failed.ipynb"
    assert failed.exists() and not (out_dir / "01_stall.ipynb").exists()
    cell = nbformat.read(failed, as_version=4).cells[2]
    assert cell.outputs[-1]["ename"] == "KernelStallError" and cell.metadata["papermill"]["status"] == "failed"
    _assert_kernels_gone(dropping_kernel, 2)


@pytest.mark.timeout(120)
def test_silent_kernel_is_a_stall(tmp_path: Path, dropping_kernel: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No IOPub message at all (not even 'busy') for the stall limit: a stall too."""
    _drop_times(monkeypatch, 1)
    nb = _notebook(tmp_path / "nb.ipynb", "x = 1  # drop-all", "print(x)")
    res = execute(nb, tmp_path / "nb.out.ipynb", kernel_name="dropreply", stall_timeout=2, progress_bar=False)
    assert res.ok, res.error_summary()
    assert res.retried is not None and "sent no message at all" in res.retried
    _assert_kernels_gone(dropping_kernel, 2)


@pytest.mark.timeout(120)
def test_long_silent_computation_is_not_a_stall(tmp_path: Path) -> None:
    nb = _notebook(tmp_path / "nb.ipynb", "import time\ntime.sleep(4)", "print('done')")
    res = execute(nb, tmp_path / "out.ipynb", stall_timeout=1.5, progress_bar=False)
    assert res.ok and res.retried is None, res.error_summary()


def test_stall_timeout_option(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "1", "--stall-timeout", "-1", "--dry-run"]) == 2
    assert "--stall-timeout" in capsys.readouterr().err
    assert main(["run", "1", "--stall-timeout", "soon", "--dry-run"]) == 2
    assert main(["sweep", "--help"]) == 0
    assert "--stall-timeout" in capsys.readouterr().out


@pytest.mark.skipif(os.name == "nt", reason="Windows has no ipc transport; kernels keep TCP there")
@pytest.mark.timeout(300)
def test_kernels_started_at_once_use_sockets_of_their_own(tmp_path):
    """The engine's kernels listen on Unix domain sockets under a prefix of their own (IPCKernelManager), not on
    TCP ports picked free and bound a moment later, which a concurrent socket can take first ("Address already
    in use", a CI failure of `fda sweep --jobs 2`): four started at once all run, each on its own prefix, and leave
    no socket file behind."""
    import glob
    import tempfile
    import threading

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        "import json, ipykernel.connect\n"
        "info = json.loads(open(ipykernel.connect.get_connection_file()).read())\n"
        "print(info['transport'], info['ip'])")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, tmp_path / "t.ipynb")
    pattern = os.path.join(tempfile.gettempdir(), "fda-kernel-*")
    before = set(glob.glob(pattern))
    results = {}

    def run(k: int) -> None:
        results[k] = execute(tmp_path / "t.ipynb", tmp_path / f"out{k}.ipynb", progress_bar=False, cwd=tmp_path,
                             stall_timeout=60)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    assert sorted(results) == [0, 1, 2, 3] and all(r.ok for r in results.values()), \
        [r.error_summary() for r in results.values() if not r.ok]
    seen = [nbformat.read(tmp_path / f"out{k}.ipynb", as_version=4).cells[-1].outputs[0]["text"].split()
            for k in range(4)]
    assert {transport for transport, _ in seen} == {"ipc"}
    assert len({prefix for _, prefix in seen}) == 4
    deadline = time.monotonic() + 10
    while set(glob.glob(pattern)) - before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not set(glob.glob(pattern)) - before, "socket files left behind"
