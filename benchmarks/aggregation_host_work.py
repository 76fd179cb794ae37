"""Host work of one layer-wise FedGP call on the GPU code path: torch operator calls and host time per call.

On a GPU, one ``fedgp(S, t, β, out=out, segments=lengths)`` call on ResNet-18-shaped updates takes 3.5–8× the copy
floor while its two Triton kernels take 1.5–2.4× (``benchmarks/segmented_kernels.py``, docs/performance.md § GPU): the rest is host
work — the call's Python and the torch operators it dispatches around the kernels. This script measures that host
work where no GPU is needed: on tiny tensors (ResNet-18's 62 segment lengths divided by ``--scale``) so that the
arithmetic itself costs next to nothing, it counts the torch (aten) operator calls of one call with a
``TorchDispatchMode`` and times calls with ``time.perf_counter``.

* ``--device cuda``: the library's own path, real kernels.
* ``--device cpu`` (no GPU): the same code path is forced (the segmented backend and the Triton wrappers of
  :mod:`fda_core.core.segmented_triton`), with the kernel launches replaced by stubs that zero their outputs, so
  every torch call the GPU path makes is made and counted here too. Missing: the kernels' own (device) time, and
  the copies of β, the weights (and the alignment) to the device, which on the CPU have nowhere to go (on CUDA:
  two or three pinned copies per call with ``torch`` coefficients, one with ``kernel``).

``--coefficients`` (default both): where the per-segment coefficients are formed, ``torch`` (operators between the
two kernels) or ``kernel`` (a third Triton kernel, ``LAYERWISE_COEFFICIENTS = "kernel"``, the library's default).
With ``kernel`` each rule is also timed ``prepared`` once for its buffers (:func:`fda_core.core.prepared.prepare`):
the buffers' checks done once, β and the weights packed in Python and copied into one device vector only when they
differ from the last call's (here, as in a fixed-β federated loop, they never do), the kernels replayed from a CUDA
graph; on the CPU the replay is stubbed as the kernels are (what remains is the call's own host work: the argument
key and the flag's read; on CUDA add the graph's launch).

Usage::

    python benchmarks/aggregation_host_work.py [--device cpu|cuda] [--sources 4] [--repeats 300]
                                               [--coefficients torch kernel] [--json OUT]
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import math
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from aggregation import BETA, benchmark_parser, environment, resnet18_shapes, resolve_device  # noqa: E402

import fda_core.core.aggregation as aggregation  # noqa: E402
import fda_core.core.segmented as segmented  # noqa: E402
from fda_core.common.files import atomic_write_json  # noqa: E402
from fda_core.core import segmented_triton  # noqa: E402
import fda_core.core.prepared as prepared_module  # noqa: E402
from fda_core.core.prepared import prepare  # noqa: E402

RULES = ("fedgp", "fedgp_cosine")
#: "call": the rule's call; "prepared": the same call prepared once for its buffers (fda_core.core.prepared; kernel
#: coefficients only), on CUDA its kernels replayed from a CUDA graph
FORMS = ("call", "prepared")
COEFFICIENTS = ("torch", "kernel")


class OperatorCount(TorchDispatchMode):
    """Counts the aten operators dispatched inside the ``with`` block."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[str(func)] += 1
        return func(*args, **(kwargs or {}))


class _StubKernel:
    """A Triton kernel stand-in: ``kernel[grid](*args)`` zero-fills the output arguments at ``outputs``."""

    def __init__(self, outputs: tuple[int, ...]) -> None:
        self.outputs = outputs

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            with _disable_current_modes():  # the stub's own fill is not the library's work: not counted
                for i in self.outputs:
                    args[i].fill_(0.0)
        return launch


@contextlib.contextmanager
def gpu_code_path_on_cpu() -> Iterator[None]:
    """Route layer-wise rules on CPU tensors through the GPU path, kernels stubbed (see the module docstring)."""
    stubs = {"_reduce_kernel": _StubKernel((4, 5)), "_combine_kernel": _StubKernel((2, 8)),
             "_reduce_tile_kernel": _StubKernel((4, 5)), "_combine_tile_kernel": _StubKernel((2, 8)),
             "_coef_kernel": _StubKernel((4, 5, 6))}
    with contextlib.ExitStack() as stack:
        for name, stub in stubs.items():
            stack.enter_context(mock.patch.object(segmented_triton, name, stub, create=True))
        stack.enter_context(mock.patch.object(segmented, "_triton", lambda sources: segmented_triton))
        stack.enter_context(mock.patch.object(aggregation, "_segmented", lambda device: True))
        # a prepared rule's CUDA graph: captured as the step's outputs, replayed as nothing (as the kernels are stubbed)
        stack.enter_context(mock.patch.object(prepared_module, "_graphs_on", lambda device: True))
        stack.enter_context(mock.patch.object(prepared_module, "_capture", lambda step: (lambda: None, step())))
        yield


def run(device: str = "cpu", sources: Sequence[int] = (4,), repeats: int = 300, scale: int = 1000,
        rules: Sequence[str] = RULES, coefficients: Sequence[str] = COEFFICIENTS) -> list[dict]:
    """One record per (coefficients, rule, N): ``operator_calls`` (total), ``operators`` (per aten operator),
    ``host_us`` (median per call) and ``path`` ("library" on CUDA, "GPU path on CPU, kernels stubbed" otherwise)."""
    dev = resolve_device(device)
    if scale < 1:
        raise ValueError(f"scale must be >= 1, got {scale}")
    bad = [c for c in coefficients if c not in COEFFICIENTS]
    if bad or not coefficients:
        raise ValueError(f"coefficients must be one or more of {COEFFICIENTS}, got {list(coefficients)}")
    lengths = [max(1, math.prod(s) // scale) for s in resnet18_shapes()]
    records = []
    path = contextlib.nullcontext() if dev.type == "cuda" else gpu_code_path_on_cpu()
    with path:
        for n in sources:
            gen = torch.Generator().manual_seed(0)
            S = torch.randn(int(n), sum(lengths), generator=gen).to(dev)
            t = torch.randn(sum(lengths), generator=gen).to(dev)
            out = torch.empty_like(t)
            for coefs, rule, form in itertools.product(coefficients, rules, FORMS):
                if form == "prepared" and coefs != "kernel":
                    continue
                fn = getattr(aggregation, rule)
                with mock.patch.object(aggregation, "LAYERWISE_COEFFICIENTS", coefs):
                    if form == "call":
                        call = lambda: fn(S, t, BETA, out=out, segments=lengths)  # noqa: E731
                    else:
                        call = functools.partial(prepare(rule, S, t, out=out, segments=lengths), BETA)
                    for _ in range(5):
                        call()
                    with OperatorCount() as counted:
                        call()
                    times = []
                    for _ in range(repeats):
                        if dev.type == "cuda":
                            torch.cuda.synchronize(dev)
                        t0 = time.perf_counter()
                        call()
                        times.append(time.perf_counter() - t0)
                records.append({
                    "coefficients": coefs, "rule": rule, "form": form, "n_sources": int(n), "n_segments": len(lengths),
                    "m": sum(lengths),
                    "operator_calls": sum(counted.counts.values()), "operators": dict(counted.counts.most_common()),
                    "host_us": statistics.median(times) * 1e6,
                    "path": "library" if dev.type == "cuda" else "GPU path on CPU, kernels stubbed (and graph replays)",
                })
    return records


def format_report(records: list[dict], env: dict) -> str:
    lines = [f"host work of one layer-wise call (segments+out), {records[0]['n_segments']} segments, m = "
             f"{records[0]['m']:,}; {env['device']} ({env['device_name']}), torch {env['torch']}; {records[0]['path']}",
             "", f"{'coefficients':<13} {'rule':<14} {'form':<9} {'N':>3} {'torch calls':>12} {'host us/call':>13}"]
    for r in records:
        lines.append(f"{r['coefficients']:<13} {r['rule']:<14} {r['form']:<9} {r['n_sources']:>3} "
                     f"{r['operator_calls']:>12} {r['host_us']:>13.1f}")
    lines.append("")
    for c in dict.fromkeys(r["coefficients"] for r in records):
        first = next(r for r in records if r["coefficients"] == c)
        top = ", ".join(f"{k.removeprefix('aten.')} {v}" for k, v in list(first["operators"].items())[:8])
        lines.append(f"most frequent in {first['rule']} ({c} coefficients): {top}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = benchmark_parser(__doc__, sources=(4,))
    p.add_argument("--repeats", type=int, default=300)
    p.add_argument("--scale", type=int, default=1000, help="divide ResNet-18's segment lengths by this (default 1000)")
    p.add_argument("--coefficients", nargs="+", choices=COEFFICIENTS, default=list(COEFFICIENTS),
                   help="where the coefficients are formed (default: both)")
    p.add_argument("--json", metavar="OUT", default=None)
    a = p.parse_args(argv)
    if a.repeats < 1:
        p.error("--repeats must be >= 1")
    dev = resolve_device(a.device)
    records = run(str(dev), a.sources, a.repeats, a.scale, coefficients=a.coefficients)
    env = environment(dev)
    print(format_report(records, env))
    if a.json:
        atomic_write_json(a.json, {"benchmark": "aggregation_host_work", "environment": env, "results": records})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
