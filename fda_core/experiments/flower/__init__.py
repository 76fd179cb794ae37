"""The workbook's federated methods as Flower apps (``docs/flower.md``): one method object, three runtimes.

* :mod:`.strategy` — :class:`FDAStrategy`, a Flower message-API ``Strategy`` around any registered method
  of :mod:`fda_core.experiments.methods` (FedAvg / source only, FedDA, FedGP exact or cosine, FedDA_Auto,
  FedGP_Auto, Target only, Oracle), with one named subclass per paper method;
* :mod:`.client_app` — the ``ClientApp``: a node trains the environment its ``partition-id`` names, of any
  registered dataset, exactly as the in-process engine trains that client;
* :mod:`.server_app` — the ``ServerApp`` (discovery of the nodes, the rounds through ``Strategy.start``,
  the result in the in-process engine's format);
* :mod:`.simulation` — Flower's simulation engine (``run_simulation``, Ray);
* :mod:`.deployment` — a real federation on this machine: a SuperLink and one SuperNode per client as
  separate processes on 127.0.0.1, the run submitted with ``flwr run`` (``fda flower up / run / down``);
* :mod:`.protocol`, :mod:`.records`, :mod:`.faults` — what the messages hold, flat vectors ↔ Flower
  records (with the checks that keep a bad update out), and fault injection for robustness drills.

Needs the optional extra ``flower`` (``pip install -e ".[flower]"``: ``flwr[simulation]==1.39.0``).
Importing this package turns Flower's usage telemetry and update check and Ray's usage statistics off
unless the environment says otherwise (``FLWR_TELEMETRY_ENABLED``, ``FLWR_DISABLE_UPDATE_CHECK``,
``RAY_USAGE_STATS_ENABLED``), so that nothing of a run leaves the machine.
"""

from __future__ import annotations

import os

# Flower reads these when its modules are imported: set them before anything imports flwr
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # the simulation's Ray: no usage report either

try:
    import flwr  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("fda_core.experiments.flower needs Flower: pip install -e \".[flower]\" "
                      "(the optional extra 'flower', flwr[simulation]==1.39.0)") from exc

#: The Flower release the apps are written and tested against (pyproject.toml, extra ``flower``).
FLOWER_VERSION = "1.39.0"

__all__ = ["FLOWER_VERSION"]
