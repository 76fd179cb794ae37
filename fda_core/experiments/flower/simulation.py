"""One experiment in Flower's simulation engine (``flwr.simulation.run_simulation``, Ray backend;
``docs/flower.md`` § Three ways to run).

The ServerApp and the ClientApp are the deployment's (:mod:`.server_app`, :mod:`.client_app`); the
simulation runs one virtual SuperNode per environment of the dataset (``partition-id`` = environment
index) in Ray workers on this machine, with Flower's in-memory message transport.
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from ...common.checks import check_int
from ..federated import make_config
from .client_app import make_client_app
from .server_app import DEFAULT_ROUND_TIMEOUT, make_server_app

__all__ = ["run_flower_simulation", "simulate_many", "num_environments", "ray_failed_to_start", "RAY_START_RETRIES"]


#: How many times a simulation whose Ray node did not start is started again (before any experiment ran).
RAY_START_RETRIES = 1


def ray_failed_to_start(error: BaseException) -> bool:
    """Whether ``error`` (what ``run_simulation`` raised) comes from Ray's node not starting: Ray waits a fixed 30 s
    for its raylet to register, which a loaded 2-core machine can miss (it failed so beside three other busy
    processes); nothing ran then, so the simulation can start again."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if "timed out during startup" in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def _shutdown_ray() -> None:
    """Stop what a failed start left of Ray in this process (nothing when it holds none)."""
    import ray

    if ray.is_initialized():
        ray.shutdown()


def num_environments(config: Mapping[str, Any]) -> int:
    """Number of environments (= nodes) of the experiment's dataset."""
    from ...data.datasets import get_dataset

    c = make_config(**config)
    return len(get_dataset(c["dataset"], **c["dataset_options"]).ENVIRONMENTS)


def run_flower_simulation(*, faults: Mapping[int, str] | None = None, round_timeout: float = DEFAULT_ROUND_TIMEOUT,
                          discovery_timeout: float = 120.0, workers: int = 1, verbose: bool = False,
                          **config: Any) -> dict[str, Any]:
    """Run one experiment (``config``: keys of :data:`fda_core.experiments.federated.DEFAULT_CONFIG`) in
    Flower's simulation engine and return its result in the format of
    :func:`fda_core.experiments.federated.run_experiment`, plus ``"flower"`` (nodes, events, traffic)
    and ``"wall_seconds"`` (the whole call, the engine's start included).

    ``faults``: {partition-id: fault spec} for robustness drills (:mod:`.faults`); ``round_timeout``:
    seconds a round waits for replies; ``workers``: Ray workers (each runs virtual nodes one message at a
    time with one torch thread; one starts fastest on a small machine, but a node that sleeps then blocks the
    others: drills with slow nodes need two); ``verbose``: Flower's INFO log (default: errors only).
    """
    return simulate_many([config], faults=faults, round_timeout=round_timeout, discovery_timeout=discovery_timeout,
                         workers=workers, verbose=verbose)[0]


def simulate_many(configs: Sequence[Mapping[str, Any]], *, faults: Mapping[int, str] | None = None,
                  round_timeout: float = DEFAULT_ROUND_TIMEOUT, discovery_timeout: float = 120.0, workers: int = 1,
                  verbose: bool = False) -> list[dict[str, Any]]:
    """Several experiments on one dataset in one start of the simulation engine (Ray starts once; the
    ServerApp runs them one after the other on the same virtual nodes). Arguments as
    :func:`run_flower_simulation`; every result's ``"wall_seconds"`` is the whole call's."""
    workers = check_int(workers, "workers", 1)
    configs = [make_config(**c) for c in configs]  # every config checked before the engine starts
    if not configs:
        raise ValueError("configs must hold at least one experiment config")
    sizes = {num_environments(c) for c in configs}
    if len(sizes) != 1:
        raise ValueError(f"configs must share one number of environments (one node per environment), got {sorted(sizes)}")
    from flwr.simulation import run_simulation

    backend = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
               # Ray's processes on the loopback address only (ray.init's _node_ip_address), no dashboard
               "init_args": {"num_cpus": workers, "num_gpus": 0, "include_dashboard": False,
                             "_node_ip_address": "127.0.0.1",
                             "log_to_driver": verbose, "logging_level": logging.INFO if verbose else logging.ERROR}}
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # Ray workers inherit it: one thread per virtual node
    flwr_logger = logging.getLogger("flwr")
    level = flwr_logger.level
    if not verbose:  # Flower's errors only (e.g. not its notice that run_simulation is deprecated for `flwr run`);
        flwr_logger.setLevel(logging.ERROR)  # dropped updates are logged by the strategy's own logger
    start = time.perf_counter()
    n_nodes = sizes.pop()
    try:
        for attempt in range(1 + RAY_START_RETRIES):
            sink: dict[str, Any] = {}
            server = make_server_app(configs, round_timeout=round_timeout, discovery_timeout=discovery_timeout,
                                     sink=sink)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", FutureWarning)  # Ray's notice about accelerator variables
                    run_simulation(server_app=server, client_app=make_client_app(faults), num_supernodes=n_nodes,
                                   backend_config=backend)
                break
            except RuntimeError as error:
                if attempt == RAY_START_RETRIES or sink or not ray_failed_to_start(error):
                    raise
                print(f"Ray did not start within its 30 s (a loaded machine); starting the simulation again "
                      f"({attempt + 2} of {1 + RAY_START_RETRIES})", flush=True)
                _shutdown_ray()
    finally:
        flwr_logger.setLevel(level)
    results = sink.get("results", [])
    if len(results) != len(configs):
        raise RuntimeError("the Flower simulation ended without every result (see the log above for the ServerApp's "
                           "error)")
    wall = time.perf_counter() - start
    return [{**r, "wall_seconds": wall} for r in results]
