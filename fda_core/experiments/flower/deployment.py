"""A real Flower federation on this machine (``docs/flower.md`` § Three ways to run, § Deploy on your machines).

:class:`LocalFederation` starts a SuperLink and one SuperNode per environment as separate processes
listening on 127.0.0.1 only, on free ports; the SuperNodes talk to the SuperLink over gRPC (Flower's Fleet
API, grpc-rere); the run is submitted with ``flwr run`` (the app in :data:`APP_DIR`) and the ServerApp
writes its result to a file. Every process is started in its own session and stopped by its PID (its
process group: the SuperLink's and SuperNodes' own children, SuperExec and the App processes, go with it).
The federation's folder (``home``) holds Flower's config (``FLWR_HOME``: the SuperLink connection named
:data:`CONNECTION`), the logs, the run configs and results, and ``federation.json`` (PIDs and ports), so
that ``fda flower up`` / ``run`` / ``down`` can be separate commands.

Plain gRPC without TLS and without node authentication (``--insecure``), on the loopback address: for a
federation across machines see ``docs/flower.md`` § Security: TLS and node authentication.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...common.checks import check_int, check_number
from ...common.files import atomic_write_json, atomic_write_text
from ...common.ports import LOOPBACK, free_port, listening
from .protocol import EXPERIMENT_JSON
from .server_app import DEFAULT_ROUND_TIMEOUT

__all__ = ["APP_DIR", "CONNECTION", "LocalFederation", "run_flower_deployment", "free_port", "run_config_toml"]

#: The Flower app folder (``pyproject.toml`` naming the ServerApp and ClientApp of this package).
APP_DIR = Path(__file__).resolve().parent / "app"
#: Name of the SuperLink connection in the federation's Flower config (``flwr run APP_DIR fda-local``).
CONNECTION = "fda-local"


def _bin(name: str) -> str:
    """The Flower command ``name`` of this interpreter's environment."""
    path = Path(sys.executable).parent / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if not found:
        raise FileNotFoundError(f"the Flower command {name!r} was not found next to {sys.executable} nor on PATH: "
                                "pip install -e \".[flower]\"")
    return found


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a TOML basic string is a JSON string
    raise ValueError(f"a run config value must be a bool, number or string, got {value!r}")


def run_config_toml(experiment: Mapping[str, Any], **settings: Any) -> str:
    """A Flower run config (TOML, for ``flwr run --run-config FILE.toml``) holding ``experiment`` as the JSON
    object of ``experiment-json`` (Flower accepts overrides only for keys the app declares; the JSON may hold
    any setting: :func:`.protocol.experiment_from_run_config`) and ``settings`` (``round-timeout``,
    ``result-file``, ... written with dashes for underscores)."""
    lines = [f"{EXPERIMENT_JSON} = {_toml_value(json.dumps(dict(experiment), sort_keys=True))}"]
    for k, v in settings.items():
        lines.append(f"{k.replace('_', '-')} = {_toml_value(v)}")
    return "\n".join(lines) + "\n"


def _descendants(pid: int) -> list[int]:
    """PIDs of every process descended from ``pid`` (Linux ``/proc``; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


class LocalFederation:
    """A SuperLink and ``num_nodes`` SuperNodes on 127.0.0.1 (see the module docstring).

    Args:
        home: the federation's folder (created; Flower's config, logs, runs, PIDs).
        num_nodes: SuperNodes, one per environment of the dataset (``partition-id`` 0 … num_nodes − 1).
        node_config: extra node config per partition-id, e.g. ``{1: {"fault": "nan@3"}}`` (:mod:`.faults`).
        startup_timeout: seconds to wait for the SuperLink to listen.

    Use as a context manager (``with LocalFederation(...) as fed: fed.run(config)``: always stopped), or
    :meth:`up` / :meth:`down` (also from another process: :meth:`attach` reads ``federation.json``).
    """

    def __init__(self, home: str | os.PathLike, num_nodes: int, *, node_config: Mapping[int, Mapping[str, Any]] | None = None,
                 startup_timeout: float = 60.0) -> None:
        self.home = Path(home).resolve()
        self.num_nodes = check_int(num_nodes, "num_nodes", 1)
        self.node_config = {int(k): dict(v) for k, v in (node_config or {}).items()}
        bad = [k for k in self.node_config if not 0 <= k < self.num_nodes]
        if bad:
            raise ValueError(f"node_config keys must be partition-ids in [0, {self.num_nodes - 1}], got {bad}")
        self.startup_timeout = check_number(startup_timeout, "startup_timeout", 0.0, None, lo_open=True)
        self.pids: dict[str, int] = {}
        self.ports: dict[str, int] = {}

    # -- state -----------------------------------------------------------------------------------
    @property
    def state_file(self) -> Path:
        return self.home / "federation.json"

    def _save(self) -> None:
        atomic_write_json(self.state_file, {"num_nodes": self.num_nodes, "pids": self.pids, "ports": self.ports,
                                            "node_config": {str(k): v for k, v in self.node_config.items()}})

    @classmethod
    def attach(cls, home: str | os.PathLike) -> "LocalFederation":
        """The federation started in ``home`` (by another process): its PIDs and ports from ``federation.json``."""
        state_file = Path(home).resolve() / "federation.json"
        if not state_file.exists():
            raise FileNotFoundError(f"no federation in {state_file.parent} (no federation.json): start one with "
                                    "`fda flower up`")
        state = json.loads(state_file.read_text())
        fed = cls(home, state["num_nodes"], node_config={int(k): v for k, v in state.get("node_config", {}).items()})
        fed.pids, fed.ports = dict(state["pids"]), dict(state["ports"])
        return fed

    def env(self) -> dict[str, str]:
        """The environment of every Flower process: its own ``FLWR_HOME``, no telemetry or update check, one
        torch thread, a short SuperExec poll."""
        env = dict(os.environ)
        # the SuperLink and SuperNodes start `flower-superexec` and the App processes by name: this environment first
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        env.update({"FLWR_HOME": str(self.home / "flwr-home"), "FLWR_TELEMETRY_ENABLED": "0",
                    "FLWR_DISABLE_UPDATE_CHECK": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                    "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.2", "PYTHONUNBUFFERED": "1"})
        return env

    def _start(self, name: str, cmd: list[str]) -> None:
        logs = self.home / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / f"{name}.log", "ab") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=self.env(), cwd=self.home, start_new_session=True)
        self.pids[name] = proc.pid
        self._save()

    def alive(self, name: str) -> bool:
        """Whether process ``name`` ("superlink", "supernode-<i>") is running."""
        pid = self.pids.get(name)
        if pid is None:
            return False
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)  # reap it if it is our child and has exited
            if done == pid:
                return False
        except ChildProcessError:
            pass
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True

    # -- up / down -------------------------------------------------------------------------------
    def up(self) -> "LocalFederation":
        """Start the SuperLink, wait until it listens, write the Flower config, start the SuperNodes."""
        if self.state_file.exists():
            old = LocalFederation.attach(self.home)
            if any(old.alive(n) for n in old.pids):
                raise RuntimeError(f"a federation is already running in {self.home}: stop it with `fda flower down`")
        self.home.mkdir(parents=True, exist_ok=True)
        http, fleet = free_port(), free_port()
        self.ports = {"superlink-http": http, "fleet": fleet}
        try:
            self._start("superlink", [_bin("flower-superlink"), "--insecure", "--disable-runtime-dependency-installation",
                                      "--host", LOOPBACK, "--port", str(http),
                                      "--fleet-api-address", f"{LOOPBACK}:{fleet}"])
            deadline = time.monotonic() + self.startup_timeout
            while not (listening(http) and listening(fleet)):
                if not self.alive("superlink"):
                    raise RuntimeError(f"the SuperLink exited at start; log: {self.log_tail('superlink')}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the SuperLink did not listen within {self.startup_timeout:g} s; log: "
                                       f"{self.log_tail('superlink')}")
                time.sleep(0.3)
            flwr_home = self.home / "flwr-home"
            flwr_home.mkdir(parents=True, exist_ok=True)
            atomic_write_text(flwr_home / "config.toml",
                              f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
                              f'address = "{LOOPBACK}:{http}"\ninsecure = true\n')
            for i in range(self.num_nodes):
                port = free_port()
                self.ports[f"supernode-{i}"] = port
                cfg = {"partition-id": i, "num-partitions": self.num_nodes, "num-threads": 1, **self.node_config.get(i, {})}
                self._start(f"supernode-{i}", [_bin("flower-supernode"), "--insecure", "--superlink", f"{LOOPBACK}:{fleet}",
                                               "--host", LOOPBACK, "--port", str(port),
                                               "--node-config", " ".join(f"{k}={_toml_value(v)}" for k, v in cfg.items())])
        except BaseException:
            self.down()
            raise
        return self

    def kill_node(self, i: int) -> None:
        """Stop SuperNode ``i`` at once (SIGKILL to its process group): a client that disconnects."""
        self._stop(f"supernode-{i}", grace=0.0)

    def _stop(self, name: str, grace: float) -> None:
        pid = self.pids.get(name)
        if pid is None:
            return
        family = _descendants(pid)  # SuperExec runs in a session of its own: stop it (and its apps) by PID too
        if grace > 0:
            try:
                os.killpg(pid, signal.SIGTERM)  # the session leader's group: the process and what it started
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + grace
            while self.alive(name) and time.monotonic() < deadline:
                time.sleep(0.1)
        for p in [pid, *family]:
            for kill in (os.killpg, os.kill):  # what is left of the group, then each descendant by its PID
                try:
                    kill(p, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        deadline = time.monotonic() + 5.0
        while self.alive(name) and time.monotonic() < deadline:  # reaps our child: no zombie left
            time.sleep(0.05)

    def down(self, grace: float = 5.0) -> None:
        """Stop every process of the federation by its PID (SuperNodes first, then the SuperLink; SIGTERM,
        then SIGKILL after ``grace`` seconds) and remove ``federation.json``."""
        for name in sorted((n for n in self.pids if n != "superlink"), key=lambda n: int(n.split("-")[1])):
            self._stop(name, grace)
        self._stop("superlink", grace)
        self.pids = {}
        self.state_file.unlink(missing_ok=True)

    def __enter__(self) -> "LocalFederation":
        return self.up()

    def __exit__(self, *exc: Any) -> None:
        self.down()

    def log_tail(self, name: str, chars: int = 3000) -> str:
        path = self.home / "logs" / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"

    # -- a run ---------------------------------------------------------------------------------------
    def submit(self, experiment: Mapping[str, Any], *, round_timeout: float = DEFAULT_ROUND_TIMEOUT,
               discovery_timeout: float = 120.0, name: str | None = None) -> Path:
        """Submit one experiment with ``flwr run`` (the run config as a TOML file); returns the path where
        the ServerApp will write the result."""
        runs = self.home / "runs"
        runs.mkdir(parents=True, exist_ok=True)
        name = name or time.strftime("run-%Y%m%d-%H%M%S")
        result = runs / f"{name}.json"
        result.unlink(missing_ok=True)
        config = runs / f"{name}.toml"
        from ..federated import make_config

        # every key explicit: the app's pyproject.toml declares other defaults for some keys than DEFAULT_CONFIG
        atomic_write_text(config, run_config_toml(make_config(**experiment), round_timeout=float(round_timeout),
                                                  discovery_timeout=float(discovery_timeout), num_threads=1,
                                                  result_file=str(result)))
        cmd = [_bin("flwr"), "run", str(APP_DIR), CONNECTION, "--run-config", str(config)]
        out = subprocess.run(cmd, env=self.env(), cwd=self.home, capture_output=True, text=True, timeout=120)
        (self.home / "logs" / f"{name}.submit.log").write_text(out.stdout + out.stderr)
        if out.returncode != 0:
            raise RuntimeError(f"`flwr run` failed ({out.returncode}): {(out.stdout + out.stderr)[-2000:]}")
        return result

    def wait(self, result: Path, timeout: float) -> Any:
        """The result JSON the ServerApp writes to ``result``, waiting at most ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not result.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no result in {result} after {timeout:g} s; SuperLink log: "
                                   f"{self.log_tail('superlink')}")
            if not self.alive("superlink"):
                raise RuntimeError(f"the SuperLink has exited; log: {self.log_tail('superlink')}")
            time.sleep(0.5)
        return json.loads(result.read_text())

    def run(self, experiment: Mapping[str, Any], *, timeout: float = 600.0, **kwargs: Any) -> dict[str, Any]:
        """:meth:`submit` then :meth:`wait`; the result (``run_experiment``'s format plus ``"flower"``) with
        ``"wall_seconds"``, from the submission to the result file."""
        start = time.perf_counter()
        res = self.wait(self.submit(experiment, **kwargs), timeout)
        return {**res, "wall_seconds": time.perf_counter() - start}


def run_flower_deployment(*, home: str | os.PathLike, node_config: Mapping[int, Mapping[str, Any]] | None = None,
                          round_timeout: float = DEFAULT_ROUND_TIMEOUT, timeout: float = 900.0,
                          **config: Any) -> dict[str, Any]:
    """One experiment on a fresh loopback federation: up, run, down (always). ``home``: the federation's
    folder; ``node_config``: extra node config per partition-id (e.g. faults); ``timeout``: seconds for the
    run. Returns the result with ``"wall_seconds"`` covering the whole call (processes' start and stop
    included) and ``"run_seconds"`` (submission to result)."""
    from .simulation import num_environments

    start = time.perf_counter()
    with LocalFederation(home, num_environments(config), node_config=node_config) as fed:
        res = fed.run(config, round_timeout=round_timeout, timeout=timeout)
    return {**res, "run_seconds": res["wall_seconds"], "wall_seconds": time.perf_counter() - start}

