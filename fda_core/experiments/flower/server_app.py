"""The ServerApp: one experiment of the workbook as a Flower run (``docs/flower.md`` § Flower apps).

Its ``main`` asks every node which environment it holds (:meth:`FDAStrategy.discover`, which also brings
the initial model from the target node), then runs the rounds with Flower's own loop
(``Strategy.start``: ``configure_train`` → ``send_and_receive`` → ``aggregate_train`` →
``configure_evaluate`` → ``send_and_receive`` → ``aggregate_evaluate``) and returns the result in the
format of :func:`fda_core.experiments.federated.run_experiment`.

In a deployment the experiment comes from the Flower run config (``[tool.flwr.app.config]`` of the app,
overridden with ``flwr run --run-config``): ``experiment.<key>`` keys (see
:func:`.protocol.experiment_from_run_config`), ``round-timeout`` (seconds a round waits for replies),
``discovery-timeout``, ``num-threads`` and ``result-file`` (where the ServerApp writes the result JSON;
empty: nowhere).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from ...common.checks import check_number
from .protocol import experiment_from_run_config
from .strategy import FDAStrategy, strategy_for

__all__ = ["app", "make_server_app", "run_strategy", "DEFAULT_ROUND_TIMEOUT"]

#: Seconds a round waits for the nodes' replies before it goes on without the missing ones.
DEFAULT_ROUND_TIMEOUT = 300.0


def run_strategy(grid: Grid, strategy: FDAStrategy, *, round_timeout: float = DEFAULT_ROUND_TIMEOUT) -> dict[str, Any]:
    """Discover the nodes, run ``strategy`` for the experiment's rounds through Flower's ``Strategy.start``
    (each round waits at most ``round_timeout`` seconds for replies), and return :meth:`FDAStrategy.result`."""
    round_timeout = check_number(round_timeout, "round_timeout", 0.0, None, lo_open=True)
    start = time.perf_counter()
    strategy.discover(grid)
    strategy.start(grid=grid, initial_arrays=strategy.initial_arrays(), num_rounds=strategy.config["rounds"],
                   timeout=round_timeout)
    return strategy.result(time.perf_counter() - start)


def make_server_app(configs: Sequence[Mapping[str, Any]] | None = None, *, round_timeout: float | None = None,
                    discovery_timeout: float | None = None, sink: dict[str, Any] | None = None) -> ServerApp:
    """A ServerApp running experiments one after the other on the same nodes: ``configs`` (each with keys of
    :data:`fda_core.experiments.federated.DEFAULT_CONFIG`), or, when None, the one experiment of the
    ``experiment.*`` keys of the Flower run config. ``round_timeout`` / ``discovery_timeout``: seconds (None:
    the run config's ``round-timeout`` / ``discovery-timeout``, else the defaults). The results go into
    ``sink["results"]`` and the strategies into ``sink["strategies"]`` (when given: the simulation runs the
    ServerApp in this process), and into the run config's ``result-file`` (when set: the deployment's
    ServerApp is another process; one experiment: its result, several: the list)."""

    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        rc = context.run_config
        torch.set_num_threads(int(rc.get("num-threads", 1)))
        cfgs = [dict(c) for c in configs] if configs is not None else [experiment_from_run_config(rc)]
        timeout = round_timeout if round_timeout is not None else float(rc.get("round-timeout", DEFAULT_ROUND_TIMEOUT))
        disc = discovery_timeout if discovery_timeout is not None else float(rc.get("discovery-timeout", 120.0))
        strategies = [strategy_for(c, discovery_timeout=disc) for c in cfgs]  # every config checked first
        results = []
        if sink is not None:
            sink["strategies"], sink["results"] = strategies, results
        for strategy in strategies:
            results.append(run_strategy(grid, strategy, round_timeout=timeout))
        path = str(rc.get("result-file", "") or "")
        if path:
            from ...common.files import atomic_write_json

            atomic_write_json(path, results[0] if configs is None else results)

    return app


#: The ServerApp of the Flower app (``fda_core/experiments/flower/app/pyproject.toml``): the experiment
#: from the run config.
app = make_server_app()
