"""The layer-wise kernels' forms and sizes on a GPU, and what one layer-wise FedGP call costs beyond them.

Issue 17's aggregation target is FedGP within 2× of the device's copy floor on ResNet-18-shaped updates (62 tensors,
11.7 M parameters). The rule makes two passes over the sources (:mod:`fda_core.core.segmented_triton`): ``reduce``
reads the N sources and the target for the per-segment dots and squared norms, ``combine`` reads them again and
writes the result, (2N + 3)·m floats against the copy's 2N·m, so 1.375× the floor at N = 4 and 1.15× at N = 10 is
the least two passes can cost. This script measures, in one run on one device, for every kernel configuration
(``--configs``, each ``form:block:num_warps``, see :class:`~fda_core.core.segmented_triton.KernelConfig`):

* ``reduce`` and ``combine`` alone (each checked first against a float64 reference on the same device);
* ``fedgp``: one whole call ``fedgp(S, t, 0.5, out=out, segments=lengths)`` with that configuration and the
  coefficients formed by torch operators between the two kernels (``LAYERWISE_COEFFICIENTS = "torch"``, the
  library's default until 2026-11-26), what the federated engine calls once per round
  (``benchmarks/aggregation.py``'s ``segments+out``);
* ``fedgp without check``: the same call with the finiteness check (one host synchronisation) switched off,
  to show what that synchronisation costs (the library always checks); the report also counts the host
  synchronisations of one call (torch's CUDA sync debug mode);
* ``arithmetic only``: the call's arithmetic without its argument handling (:func:`layerwise_fedgp_arithmetic`, the
  library's kernel configuration), eagerly and, on CUDA, replayed from a CUDA graph, each with the finiteness
  check's synchronisation: what a call would cost with its host work gone;
* with Triton, the same for the coefficients formed in a third kernel (``LAYERWISE_COEFFICIENTS = "kernel"``, the
  library's default, :func:`~fda_core.core.segmented_triton.project`, the library's kernel configuration): ``fedgp,
  kernel coefficients`` (the whole call; its result checked against the torch coefficients'), ``fedgp, kernel
  coefficients, early reduction`` (the same call with its first kernel launched before β and the weights are
  checked, ``LAYERWISE_REDUCTION_LAUNCH = "early"``: whether overlapping that host work pays), ``fedgp, kernel
  coefficients, β as a host tensor`` (β passed as a CPU tensor, which the call checks on the host and packs with
  torch operators, as every call did before the sixth session of 2026-11-26: what packing Python numbers in Python
  saves; until that session's end a CPU tensor was first copied to the device and checked there), ``fedgp, kernel
  coefficients, β and weights on the device`` (both as (N,) device tensors, as the engine passed them until then:
  each is checked with one read of the device, 3 before), ``fedgp, kernel coefficients, prepared`` (the call prepared
  once for its buffers, :func:`fda_core.core.prepared.prepare`: β and the weights packed in Python, one copy, the
  three kernels replayed from a CUDA graph and the flag read: what is left of a call once the buffers' checks and the
  launches are gone) and ``project only``, eagerly and replayed from a CUDA graph, each with the read of its
  finiteness flag;

and the copy floor ``dst.copy_(S)``. Times are medians of ``--repeats`` calls, timed in turns (one call of each per
round), each between two ``torch.cuda.synchronize()`` with ``time.perf_counter``, as in ``benchmarks/aggregation.py``.
Ratios are to the floor of the same run. Without CUDA and Triton (the CPU), only ``fedgp`` (the library's CPU
path), ``fedgp without check`` and the floor are timed.

Usage::

    python benchmarks/segmented_kernels.py [--device cuda] [--sources 4 10] [--repeats 30]
                                           [--configs loop:2048:8 tile:8192:8 ...] [--json OUT]
"""

from __future__ import annotations

import contextlib
import math
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from aggregation import (BETA, _as_named, benchmark_parser, environment, make_updates, resolve_device,  # noqa: E402
                         time_round_robin)

import fda_core.core.aggregation as aggregation_module  # noqa: E402
from fda_core.common.devices import host_synchronisations  # noqa: E402
from fda_core.common.files import atomic_write_json  # noqa: E402
from fda_core.core import segmented_triton  # noqa: E402
from fda_core.core.aggregation import fedgp  # noqa: E402
from fda_core.core.prepared import prepare  # noqa: E402
from fda_core.core.segmented import (layerwise_combine, layerwise_reductions,  # noqa: E402
                                     segment_combine, segment_dots, segment_plan, segment_sqnorms)
from fda_core.core.segmented_triton import KernelConfig  # noqa: E402

#: the forms measured by default: the library's (first), block sizes around it, and the tile form
DEFAULT_CONFIGS = ("loop:2048:8", "loop:1024:4", "loop:4096:8", "tile:8192:8", "tile:4096:4", "tile:16384:8")


#: ``form:block:num_warps`` ↔ :class:`KernelConfig` (names kept for the command line and the tests)
parse_config = KernelConfig.parse


def label(config: KernelConfig) -> str:
    return config.label


@contextlib.contextmanager
def _without_finiteness_check():
    """Switch the rules' finiteness check (and its host synchronisation) off: a measurement, never the library's."""
    saved = aggregation_module._check_finite
    aggregation_module._check_finite = lambda *args, **kwargs: None
    try:
        yield
    finally:
        aggregation_module._check_finite = saved


def _check_kernels(S: torch.Tensor, t: torch.Tensor, lengths: list[int], config: KernelConfig) -> float:
    """Largest relative error of ``config``'s kernels against a float64 reference on the same device."""
    plan = segment_plan(lengths, S.device, torch.float64)
    S64, t64 = S.double(), t.double()
    table = segmented_triton.table_for(lengths, S, config)
    dots, norms2, tnorms2 = segmented_triton.reduce(S, t, table, config)
    gen = torch.Generator().manual_seed(1)
    C = torch.randn(S.shape[0], len(lengths), generator=gen, dtype=torch.float64).to(S.device)
    out = torch.full_like(t, float("nan"))
    segmented_triton.combine(S, t, torch.tensor(0.3, device=S.device), C.float(), table, out, config)
    pairs = [(dots, segment_dots(S64, t64, plan)), (norms2, segment_sqnorms(S64, plan)),
             (tnorms2, segment_sqnorms(t64, plan)), (out, segment_combine(S64, t64, 0.3, C, plan))]
    worst = 0.0
    for got, ref in pairs:
        err = float(((got.double() - ref).abs() / (ref.abs() + 1e-3 * ref.abs().max())).max())
        if not err < 1e-3:
            raise AssertionError(f"config {label(config)}: relative error {err:.2e} against the float64 reference")
        worst = max(worst, err)
    return worst


def run(device: str = "cuda", sources: Sequence[int] = (4, 10), repeats: int = 30,
        configs: Sequence[KernelConfig] | None = None, shapes: Sequence[Any] | None = None, seed: int = 0) -> list[dict]:
    """One record per (N, row): ``n_sources``, ``row``, ``config`` (or None), ``median_ms``, ``times_ms``,
    ``ratio_to_floor``, ``two_pass_bound`` ((2N + 3) / 2N, the least a two-pass rule costs in floors) and, for kernel
    rows, ``max_rel_error`` against float64. ``shapes`` overrides ResNet-18's (see ``benchmarks/aggregation.py``)."""
    dev = resolve_device(device)
    named = _as_named(shapes)
    lengths = [math.prod(s) for _, s in named]
    kernels = segmented_triton.available(dev)
    configs = list(configs) if configs is not None else [parse_config(c) for c in DEFAULT_CONFIGS]
    if not kernels:
        configs = []
    records: list[dict] = []
    for n in sources:
        if int(n) < 1:
            raise ValueError(f"number of sources must be >= 1, got {n}")
        S, t = make_updates(named, int(n), dev, seed)[:2]
        out, dst = torch.empty_like(t), torch.empty_like(S)
        errors: dict[str, float] = {}
        fns: dict[str, Callable[[], Any]] = {"copy floor": lambda: dst.copy_(S)}
        a = torch.tensor(0.3, device=dev)
        for config in configs:
            name = label(config)
            errors[name] = _check_kernels(S, t, lengths, config)
            table = segmented_triton.table_for(lengths, S, config)
            C = torch.rand(int(n), len(lengths), device=dev)
            fns[f"{name} reduce"] = lambda c=config, tb=table: segmented_triton.reduce(S, t, tb, c)
            fns[f"{name} combine"] = lambda c=config, tb=table, C=C: segmented_triton.combine(S, t, a, C, tb, out, c)
            fns[f"{name} fedgp"] = lambda c=config: _with(c, False, lambda: fedgp(S, t, BETA, out=out, segments=lengths))
            fns[f"{name} fedgp without check"] = lambda c=config: _with(
                c, True, lambda: fedgp(S, t, BETA, out=out, segments=lengths))
        # the library's configuration: the call's arithmetic alone, eagerly and (CUDA) replayed from a CUDA graph, each
        # followed by the finiteness check's one synchronisation on the per-chunk sums
        wb = torch.full((int(n),), BETA / int(n), device=dev)
        arithmetic = lambda: layerwise_fedgp_arithmetic(S, t, wb, lengths, out)  # noqa: E731
        reference = _with(None, False, lambda: fedgp(S, t, BETA, segments=lengths))
        arithmetic()
        if not torch.allclose(out, reference, rtol=1e-4, atol=1e-5):
            raise AssertionError("the arithmetic alone does not reproduce fedgp(segments=...)")
        fns["arithmetic only, eager"] = lambda: bool(torch.isfinite(arithmetic()).all())
        if dev.type == "cuda":
            replay, sums = captured(arithmetic)
            fns["arithmetic only, CUDA graph replay"] = lambda: (replay(), bool(torch.isfinite(sums).all()))
        if kernels:
            fns.update(_kernel_coefficient_rows(S, t, lengths, out, reference))
        else:
            fns["fedgp"] = lambda: fedgp(S, t, BETA, out=out, segments=lengths)
            fns["fedgp without check"] = lambda: _with(None, True, lambda: fedgp(S, t, BETA, out=out, segments=lengths))
        times = time_round_robin(fns, dev, repeats, warmup=3)
        syncs = {row: host_synchronisations(fn, dev) for row, fn in fns.items()
                 if row.endswith("fedgp") or row.startswith(KERNEL_COEFS)}
        floor = statistics.median(times["copy floor"])
        for row, ts in times.items():
            med = statistics.median(ts)
            config = row.split(" ")[0] if row.split(" ")[0] in errors else None
            records.append({
                "n_sources": int(n), "row": row, "config": config, "median_ms": med * 1e3,
                "times_ms": [x * 1e3 for x in ts], "ratio_to_floor": med / floor if floor > 0 else float("inf"),
                "two_pass_bound": (2 * int(n) + 3) / (2 * int(n)), "n_params": sum(lengths), "n_tensors": len(lengths),
                "max_rel_error": errors.get(config) if config else None, "host_syncs": syncs.get(row),
            })
        del S, t, out, dst
    return records


#: the whole call with the coefficients formed in the third kernel (``LAYERWISE_COEFFICIENTS = "kernel"``)
KERNEL_COEFS = "fedgp, kernel coefficients"
#: the same call with β as a CPU tensor: checked on the host and packed by torch operators rather than in Python
HOST_TENSOR = "β as a host tensor"
#: the same call with its first kernel launched before β and the weights are checked (LAYERWISE_REDUCTION_LAUNCH)
EARLY = "early reduction"
#: the same call with β and the weights as (N,) device tensors, as the engine passed them before the sixth session
ON_DEVICE = "β and weights on the device"
#: the same call prepared once for its buffers (fda_core.core.prepared): on CUDA its kernels replayed from a CUDA graph
PREPARED = "prepared"


def _kernel_coefficient_rows(S: torch.Tensor, t: torch.Tensor, lengths: list[int], out: torch.Tensor,
                             reference: torch.Tensor) -> dict[str, Callable[[], Any]]:
    """The rows of the three-kernel path (library's kernel configuration), its result checked against ``reference``
    (the torch coefficients') first. The whole calls with the reduction launched late (the library's default) and
    early (``LAYERWISE_REDUCTION_LAUNCH``) enter the same patches, so their host work differs only in the order of
    the reduction's launch. The ``β as a host tensor`` row passes β as a CPU tensor, which the library checks on the
    host and packs with torch operators (as every call did before 2026-11-26's sixth session) instead of in Python:
    what the Python packing saves."""
    def whole_call(launch: str = "late", beta: Any = BETA, weights: Any = None) -> Callable[[], Any]:
        def run():
            with mock.patch.object(aggregation_module, "LAYERWISE_REDUCTION_LAUNCH", launch), \
                    mock.patch.object(aggregation_module, "LAYERWISE_COEFFICIENTS", "kernel"):
                return fedgp(S, t, beta, weights, out=out, segments=lengths)
        return run

    n = S.shape[0]
    call, early = whole_call(), whole_call("early")
    host_tensor = whole_call(beta=torch.tensor(BETA))
    on_device = whole_call(beta=torch.full((n,), BETA, device=S.device),
                           weights=torch.full((n,), 1.0 / n, device=S.device))
    for row in (host_tensor, on_device, call):
        row()
        if not torch.allclose(out, reference, rtol=1e-4, atol=1e-5):
            raise AssertionError("fedgp with kernel coefficients does not reproduce the torch coefficients")
    wb = torch.full((n,), BETA / n, device=S.device)
    params = torch.cat([wb, torch.ones_like(wb), (1.0 - wb.sum()).reshape(1)])
    table = segmented_triton.table_for(lengths, S)
    project = lambda: segmented_triton.project(S, t, params, table, out)[0]  # noqa: E731
    early_result = early().clone()
    if not torch.equal(early_result, call()):
        raise AssertionError("fedgp with its reduction launched early differs from the library's call")
    with mock.patch.object(aggregation_module, "LAYERWISE_COEFFICIENTS", "kernel"):
        step = prepare("fedgp", S, t, out=out, segments=lengths)
    for _ in range(2):  # the first call runs the kernels and captures them (CUDA), the second replays the graph
        if not torch.equal(step(BETA), early_result):
            raise AssertionError("the prepared fedgp differs from the library's call")
    rows = {KERNEL_COEFS: call, f"{KERNEL_COEFS}, {EARLY}": early, f"{KERNEL_COEFS}, {HOST_TENSOR}": host_tensor,
            f"{KERNEL_COEFS}, {ON_DEVICE}": on_device, f"{KERNEL_COEFS}, {PREPARED}": lambda: step(BETA),
            "project only, eager": lambda: float(project()) == 0.0}
    replay, flag = captured(project)
    rows["project only, CUDA graph replay"] = lambda: (replay(), float(flag) == 0.0)
    return rows


def layerwise_fedgp_arithmetic(S: torch.Tensor, t: torch.Tensor, wb: torch.Tensor, lengths: Sequence[int],
                               out: torch.Tensor) -> torch.Tensor:
    """The arithmetic of one layer-wise FedGP call and nothing else (docs/theory.md § Layer-wise application): the
    per-segment reductions, c_ik = wb_i·max(⟨t_k, s_ik⟩, 0)/‖s_ik‖² (0 for a zero segment), and the combination
    into ``out``; returns the per-chunk sums of ``out`` that the library's finiteness check reads. No argument checks,
    no host synchronisation: what a call would cost if its host work were gone (eagerly, or replayed from a CUDA
    graph). ``wb`` (N,) on the device: w_i·β_i (β weights the source part)."""
    dots, norms2, _ = layerwise_reductions(S, t, lengths)
    coefs = torch.where(norms2 > 0, dots.clamp_min(0) / norms2, 0.0) * wb.unsqueeze(1)
    return layerwise_combine(S, t, 1.0 - wb.sum(), coefs, lengths, out=out)


def captured(fn: Callable[[], Any]) -> tuple[Callable[[], Any], Any]:
    """``fn`` captured once in a CUDA graph (after warm-up calls on a side stream): (replay, the captured result)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = fn()
    return graph.replay, result


def _with(config: KernelConfig | None, no_check: bool, fn: Callable[[], Any]) -> Any:
    """``fn()`` with the torch coefficients (the rows per configuration), ``config`` and, with ``no_check``, no
    finiteness check."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(aggregation_module, "LAYERWISE_COEFFICIENTS", "torch"))
        if config is not None:
            stack.enter_context(segmented_triton.configured(config))
        if no_check:
            stack.enter_context(_without_finiteness_check())
        return fn()


def format_report(records: list[dict], env: dict) -> str:
    lines = [f"layer-wise FedGP kernels, float32, {records[0]['n_tensors']} tensors, {records[0]['n_params']:,} "
             f"parameters; device {env['device']} ({env['device_name']}), torch {env['torch']}", "",
             f"{'N':>3}  {'row':<34} {'median ms':>10} {'x floor':>8}", "-" * 60]
    for r in records:
        lines.append(f"{r['n_sources']:>3}  {r['row']:<34} {r['median_ms']:>10.3f} {r['ratio_to_floor']:>8.2f}")
    lines.append("")
    for n in sorted({r["n_sources"] for r in records}):
        rows = {r["row"]: r for r in records if r["n_sources"] == n}
        bound = (2 * n + 3) / (2 * n)
        cfgs = sorted({r["config"] for r in rows.values() if r["config"]})
        if cfgs:
            both = {c: rows[f"{c} reduce"]["median_ms"] + rows[f"{c} combine"]["median_ms"] for c in cfgs}
            best = min(both, key=both.get)
            call = {c: rows[f"{c} fedgp"]["median_ms"] for c in cfgs}
            best_call = min(call, key=call.get)
            floor = rows["copy floor"]["median_ms"]
            lines.append(f"  N={n}: host synchronisations per fedgp call: {rows[f'{cfgs[0]} fedgp']['host_syncs']}")
            lines.append(f"  N={n}: two passes cost at least {bound:.3f}x the floor by bytes; reduce+combine best "
                         f"{best} {both[best]:.3f} ms ({both[best] / floor:.2f}x), library default "
                         f"{label(segmented_triton.default_config())}; whole call best {best_call} "
                         f"{call[best_call]:.3f} ms ({call[best_call] / floor:.2f}x; without the check "
                         f"{rows[f'{best_call} fedgp without check']['median_ms']:.3f} ms)")
        if KERNEL_COEFS in rows:
            for row in (KERNEL_COEFS, f"{KERNEL_COEFS}, {ON_DEVICE}", f"{KERNEL_COEFS}, {PREPARED}"):
                lines.append(f"  N={n}: host synchronisations per {row} call: {rows[row]['host_syncs']}")
        for row in ("arithmetic only, eager", "arithmetic only, CUDA graph replay", KERNEL_COEFS,
                    f"{KERNEL_COEFS}, {EARLY}", f"{KERNEL_COEFS}, {HOST_TENSOR}", f"{KERNEL_COEFS}, {ON_DEVICE}",
                    f"{KERNEL_COEFS}, {PREPARED}", "project only, eager",
                    "project only, CUDA graph replay"):
            if row in rows:
                lines.append(f"  N={n}: {row} (library's configuration, with the check): {rows[row]['median_ms']:.3f} ms "
                             f"({rows[row]['ratio_to_floor']:.2f}x)")
        if not cfgs:
            lines.append(f"  N={n}: no Triton kernels on this device; fedgp {rows['fedgp']['ratio_to_floor']:.2f}x "
                         f"the floor, without the check {rows['fedgp without check']['ratio_to_floor']:.2f}x")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = benchmark_parser(__doc__)
    p.add_argument("--repeats", type=int, default=30, help="timed calls per row (default 30)")
    p.add_argument("--configs", nargs="+", default=list(DEFAULT_CONFIGS), metavar="FORM:BLOCK:WARPS",
                   help=f"kernel configurations (default {' '.join(DEFAULT_CONFIGS)})")
    p.add_argument("--json", metavar="OUT", default=None, help="write the records as JSON")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    try:
        configs = [parse_config(c) for c in args.configs]
    except ValueError as exc:
        p.error(str(exc))
    dev = resolve_device(args.device)
    env = environment(dev)
    records = run(str(dev), args.sources, args.repeats, configs)
    print(format_report(records, env))
    if args.json:
        atomic_write_json(args.json, {"benchmark": "segmented_kernels", "beta": BETA, "repeats": args.repeats,
                                      "configs": args.configs, "environment": env, "results": records})
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
