"""``fda flower up / run / down``: a Flower federation on this machine (``docs/flower.md`` § Three ways to run).

``up`` starts a SuperLink and one SuperNode per environment of the dataset as separate processes on
127.0.0.1 (free ports; PIDs, ports and logs in ``--home``), ``run`` submits one experiment with ``flwr
run`` and waits for its result, ``down`` stops every process by its PID. Needs the optional extra
``flower``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, TextIO

import yaml

from .discovery import NotebookError, repo_root

__all__ = ["add_flower_parser", "cmd_flower"]


def _default_home() -> Path:
    return repo_root() / "executed" / "flower-federation"


def _key_value(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), yaml.safe_load(value) if value.strip() else ""


def add_flower_parser(sub: Any) -> None:
    """The ``flower`` sub-command and its ``up`` / ``run`` / ``down`` commands."""
    p = sub.add_parser(
        "flower", help="a Flower federation on this machine (SuperLink + SuperNodes on 127.0.0.1)",
        description="Start a Flower SuperLink and one SuperNode per environment as separate processes on "
        "127.0.0.1 (gRPC between them), submit experiments with `flwr run`, stop everything by PID. "
        "docs/flower.md explains the apps and how to deploy on several machines.",
        epilog="Examples:\n  fda flower up --dataset ColoredMNIST\n"
        "  fda flower run -c rule=fedgp_auto -c rounds=8 -c target=-90%\n  fda flower down",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    fsub = p.add_subparsers(dest="flower_command", metavar="ACTION")
    fsub.required = True
    home = {"type": Path, "default": None, "metavar": "DIR",
            "help": "the federation's folder (default: <repo>/executed/flower-federation)"}
    up = fsub.add_parser("up", help="start the SuperLink and the SuperNodes")
    up.add_argument("--home", **home)
    up.add_argument("--dataset", default="ColoredMNIST", help="registered dataset: one SuperNode per environment")
    up.add_argument("--nodes", type=int, default=None, help="number of SuperNodes (default: the dataset's environments)")
    up.add_argument("--fault", action="append", default=[], type=_key_value, metavar="PARTITION=SPEC",
                    help="inject faults into a node for a robustness drill, e.g. 0=nan@3 (docs/flower.md § Robustness)")
    run = fsub.add_parser("run", help="submit one experiment with `flwr run` and wait for its result")
    run.add_argument("--home", **home)
    run.add_argument("-c", "--config", action="append", default=[], type=_key_value, metavar="KEY=VALUE",
                     help="experiment config (keys of fda_core.experiments.federated.DEFAULT_CONFIG; values as YAML)")
    run.add_argument("--round-timeout", type=float, default=300.0, help="seconds a round waits for replies")
    run.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait for the result")
    down = fsub.add_parser("down", help="stop every process of the federation (by PID)")
    down.add_argument("--home", **home)


def cmd_flower(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Run ``fda flower ACTION``; returns the exit status."""
    try:
        from ..experiments.flower.deployment import LocalFederation
        from ..experiments.flower.simulation import num_environments
    except ImportError as exc:
        raise NotebookError(str(exc)) from None
    home = (args.home or _default_home()).resolve()
    if args.flower_command == "up":
        try:
            n = args.nodes if args.nodes is not None else num_environments({"dataset": args.dataset})
            faults = {int(k): {"fault": str(v)} for k, v in args.fault}
        except ValueError as exc:
            raise NotebookError(str(exc)) from None
        try:
            fed = LocalFederation(home, n, node_config=faults).up()
        except RuntimeError as exc:  # already running, or a process that would not start (its log is in the message)
            raise NotebookError(str(exc)) from None
        print(f"federation up in {home}: SuperLink (HTTP {fed.ports['superlink-http']}, Fleet gRPC "
              f"{fed.ports['fleet']}) and {n} SuperNodes, PIDs {fed.pids}", file=out)
        return 0
    try:
        fed = LocalFederation.attach(home)
    except FileNotFoundError as exc:
        raise NotebookError(str(exc)) from None
    if args.flower_command == "down":
        fed.down()
        print(f"federation in {home} stopped", file=out)
        return 0
    config = dict(args.config)
    res = fed.run(config, round_timeout=args.round_timeout, timeout=args.timeout)
    path = home / "runs" / f"result-{int(res['wall_seconds'] * 1000)}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=1))
    accs = ", ".join(f"{h['target_acc']:.3f}" for h in res["history"])
    print(f"{res['method']} on {res['target']}: final target accuracy {res['final_target_acc']:.4f} "
          f"(per round: {accs}); {len(res['flower']['events'])} events; {res['wall_seconds']:.1f} s; result {path}",
          file=out)
    return 0
