"""Benchmark of FedGP aggregation on ResNet-18-sized updates: naive per-layer loop vs fda_core vs copy floor.

What is measured
----------------
One FedGP aggregation step with the exact positive projection, β = 0.5 and uniform weights,

    ĝ = Σ_i w_i [(1 − β) g_T + β max(⟨g_T, g_i⟩, 0) g_i / ‖g_i‖²],

on random float32 updates with the parameter shapes of torchvision's ResNet-18 (ImageNet, 1000 classes:
62 tensors, 11,689,512 parameters; BatchNorm running statistics are buffers, not parameters, and are
left out). torchvision is not needed: the shapes are written out in :func:`resnet18_shapes`. For every
number of sources N (``--sources``, default 4 and 10) four things are timed in the same process, on the
same data:

(a) ``naive``: a per-layer Python loop in the style of the papers' reference code (FedGP / Auto-FedGP,
    ``update_global``): for each layer, for each source, a per-layer ``cosine_similarity`` on the
    flattened tensors pulled to the host with ``.item()``, ``if cos > 0:`` a projection length
    ``cos · ‖g_T‖ / ‖g_i‖`` (= ⟨g_T, g_i⟩ / ‖g_i‖², the exact projection, so the result can be compared)
    and an out-of-place accumulation into a new state dict. The script asserts it agrees with (b).
(b) ``per-tensor``: the library, layer-wise (dict) form, ``fedgp(list_of_dicts, target_dict, 0.5)``; ``views``:
    the same with dicts of views into one (N, m) buffer; ``segments``: the same layer-wise rule on that buffer
    with the tensors' lengths, ``fedgp(S, t, 0.5, segments=lengths)`` (no dicts; what the federated engine
    passes), equal bit for bit to the dict form on the same memory; ``prepared``: that call prepared once for
    these buffers (``fda_core.core.prepared.prepare``), its arguments checked once, and on a GPU its three
    kernels replayed from one CUDA graph (elsewhere the same call as ``segments``); the script asserts it
    gives the same bits.
(c) ``flat``: the library, flat form, ``fedgp(S, t, 0.5)`` with S a pre-built (N, m) tensor (one global
    projection over all m parameters, so its result differs from (a)/(b) by design).
(d) ``copy floor``: ``dst.copy_(S)`` into a preallocated dst: N·m·4 bytes read and written. Any FedGP
    implementation must read every source byte at least once, so this memory-bound copy, measured on
    the same machine in the same run, is the yardstick: the ratio ``library / floor`` says how far the
    library is from the memory bandwidth limit, independently of the hardware.

Each timing is the median of R repeats (``--repeats``, default 10) after warm-up runs, with
``time.perf_counter`` and ``torch.cuda.synchronize()`` before and after each call on CUDA. The forms are
timed in turns (one call of each per round) so that slow drifts of the machine hit all of them alike;
``--sequential`` times each form's repeats back to back instead. An informational line also gives the
time to allocate and first write a fresh (m,) float32 result, which every out-of-place aggregation
(library or naive) pays; on virtual machines the first-touch page faults can cost more than the copy.

Why
---
The papers report the aggregation cost as an overhead of FedGP: 0.023 s per FedGP call for N = 10
sources on a Fashion-MNIST CNN (TITAN Xp) and 0.068 s for ResNet-18 with N = 4. Those numbers come from
per-layer Python loops; the work itself is memory-bound. For scale: on an H100 the copy floor for
ResNet-18 with N = 4 is ≈ 0.10 ms, while a naive per-layer loop takes ≈ 14 ms (launch and host-sync bound).
The project's target: the library within 3× of the copy floor on CPU and within 2× on GPU.

Usage::

    python benchmarks/aggregation.py [--device auto|cpu|cuda] [--sources 4 10] [--repeats R]
                                     [--quick] [--seed 0] [--sequential] [--json OUT]

``--quick`` (smoke test) uses R = 3 and only N = 4. For tests, :func:`run` takes small ``shapes``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from unittest import mock

import torch
import torch.nn.functional as F

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:  # run from a checkout without installing the package
    sys.path.insert(0, str(_ROOT))

from fda_core.core.aggregation import fedgp, fedgp_cosine  # noqa: E402
from fda_core.core.prepared import prepare  # noqa: E402
from fda_core.common.files import atomic_write_json  # noqa: E402
from fda_core.core import segmented_triton  # noqa: E402
import fda_core.core.aggregation as aggregation_module  # noqa: E402

BETA = 0.5
TARGET_CPU = 3.0  # library within 3x of the copy floor on CPU (project brief)
TARGET_GPU = 2.0  # ... and within 2x on GPU
RESNET18_N_TENSORS = 62
RESNET18_N_PARAMS = 11_689_512

Shape = tuple[int, ...]


# ---------------------------------------------------------------------------------------------
# ResNet-18 parameter shapes (torchvision.models.resnet18(num_classes=1000).named_parameters())
# ---------------------------------------------------------------------------------------------
def resnet18_shapes(named: bool = False) -> list[Shape] | list[tuple[str, Shape]]:
    """The 62 parameter shapes of ResNet-18 (ImageNet, 1000 classes), in ``named_parameters()`` order.

    Returns a list of shapes (the form :func:`run` takes as ``shapes``), or ``(name, shape)`` pairs with
    ``named=True``. Conv layers have no bias; BatchNorm running stats are buffers and are not included.
    """
    params: list[tuple[str, Shape]] = [
        ("conv1.weight", (64, 3, 7, 7)),
        ("bn1.weight", (64,)),
        ("bn1.bias", (64,)),
        # layer1: 2 BasicBlocks, 64 -> 64
        ("layer1.0.conv1.weight", (64, 64, 3, 3)),
        ("layer1.0.bn1.weight", (64,)),
        ("layer1.0.bn1.bias", (64,)),
        ("layer1.0.conv2.weight", (64, 64, 3, 3)),
        ("layer1.0.bn2.weight", (64,)),
        ("layer1.0.bn2.bias", (64,)),
        ("layer1.1.conv1.weight", (64, 64, 3, 3)),
        ("layer1.1.bn1.weight", (64,)),
        ("layer1.1.bn1.bias", (64,)),
        ("layer1.1.conv2.weight", (64, 64, 3, 3)),
        ("layer1.1.bn2.weight", (64,)),
        ("layer1.1.bn2.bias", (64,)),
        # layer2: 64 -> 128, stride 2, downsample in block 0
        ("layer2.0.conv1.weight", (128, 64, 3, 3)),
        ("layer2.0.bn1.weight", (128,)),
        ("layer2.0.bn1.bias", (128,)),
        ("layer2.0.conv2.weight", (128, 128, 3, 3)),
        ("layer2.0.bn2.weight", (128,)),
        ("layer2.0.bn2.bias", (128,)),
        ("layer2.0.downsample.0.weight", (128, 64, 1, 1)),
        ("layer2.0.downsample.1.weight", (128,)),
        ("layer2.0.downsample.1.bias", (128,)),
        ("layer2.1.conv1.weight", (128, 128, 3, 3)),
        ("layer2.1.bn1.weight", (128,)),
        ("layer2.1.bn1.bias", (128,)),
        ("layer2.1.conv2.weight", (128, 128, 3, 3)),
        ("layer2.1.bn2.weight", (128,)),
        ("layer2.1.bn2.bias", (128,)),
        # layer3: 128 -> 256
        ("layer3.0.conv1.weight", (256, 128, 3, 3)),
        ("layer3.0.bn1.weight", (256,)),
        ("layer3.0.bn1.bias", (256,)),
        ("layer3.0.conv2.weight", (256, 256, 3, 3)),
        ("layer3.0.bn2.weight", (256,)),
        ("layer3.0.bn2.bias", (256,)),
        ("layer3.0.downsample.0.weight", (256, 128, 1, 1)),
        ("layer3.0.downsample.1.weight", (256,)),
        ("layer3.0.downsample.1.bias", (256,)),
        ("layer3.1.conv1.weight", (256, 256, 3, 3)),
        ("layer3.1.bn1.weight", (256,)),
        ("layer3.1.bn1.bias", (256,)),
        ("layer3.1.conv2.weight", (256, 256, 3, 3)),
        ("layer3.1.bn2.weight", (256,)),
        ("layer3.1.bn2.bias", (256,)),
        # layer4: 256 -> 512
        ("layer4.0.conv1.weight", (512, 256, 3, 3)),
        ("layer4.0.bn1.weight", (512,)),
        ("layer4.0.bn1.bias", (512,)),
        ("layer4.0.conv2.weight", (512, 512, 3, 3)),
        ("layer4.0.bn2.weight", (512,)),
        ("layer4.0.bn2.bias", (512,)),
        ("layer4.0.downsample.0.weight", (512, 256, 1, 1)),
        ("layer4.0.downsample.1.weight", (512,)),
        ("layer4.0.downsample.1.bias", (512,)),
        ("layer4.1.conv1.weight", (512, 512, 3, 3)),
        ("layer4.1.bn1.weight", (512,)),
        ("layer4.1.bn1.bias", (512,)),
        ("layer4.1.conv2.weight", (512, 512, 3, 3)),
        ("layer4.1.bn2.weight", (512,)),
        ("layer4.1.bn2.bias", (512,)),
        # classifier
        ("fc.weight", (1000, 512)),
        ("fc.bias", (1000,)),
    ]
    return params if named else [s for _, s in params]


def _check_resnet18_shapes() -> None:
    """The shape list must be exactly ResNet-18's: 62 distinct tensors, 11,689,512 parameters."""
    named = resnet18_shapes(named=True)
    total = sum(math.prod(s) for _, s in named)
    # explicit raises rather than bare asserts, so the check also runs under ``python -O``
    if len(named) != RESNET18_N_TENSORS or len({n for n, _ in named}) != RESNET18_N_TENSORS:
        raise AssertionError(f"resnet18_shapes(): expected {RESNET18_N_TENSORS} tensors, got {len(named)}")
    if total != RESNET18_N_PARAMS:
        raise AssertionError(f"resnet18_shapes(): expected {RESNET18_N_PARAMS:,} parameters, got {total:,}")


_check_resnet18_shapes()


def _as_named(shapes: Sequence[Any] | None) -> list[tuple[str, Shape]]:
    """``None`` → ResNet-18; a list of shapes (auto-named ``p0``, ``p1``, …) or of (name, shape) pairs."""
    if shapes is None:
        return resnet18_shapes(named=True)  # type: ignore[return-value]
    out = []
    for j, item in enumerate(shapes):
        if len(item) == 2 and isinstance(item[0], str):
            out.append((item[0], tuple(int(d) for d in item[1])))
        else:
            out.append((f"p{j}", tuple(int(d) for d in item)))
    if not out:
        raise ValueError("shapes must not be empty")
    return out


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------
def make_updates(named: list[tuple[str, Shape]], n_sources: int, device: torch.device, seed: int = 0):
    """Random N(0, 1) float32 updates: (S (N, m), t (m,), list of N source dicts, target dict).

    The dicts hold separate allocations (like real state dicts) with the same values as S / t.
    """
    m = sum(math.prod(s) for _, s in named)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    S = torch.randn(n_sources, m, generator=gen, dtype=torch.float32).to(device)
    t = torch.randn(m, generator=gen, dtype=torch.float32).to(device)

    separate = [{k: v.clone() for k, v in d.items()} for d in _views(named, torch.cat([S, t.unsqueeze(0)]))]
    return S, t, separate[:-1], separate[-1]


# ---------------------------------------------------------------------------------------------
# (a) Naive per-layer loop in the papers' style (exact projection version)
# ---------------------------------------------------------------------------------------------
def naive_fedgp(source_dicts: Sequence[dict[str, torch.Tensor]], target_dict: dict[str, torch.Tensor],
                beta: float = BETA) -> dict[str, torch.Tensor]:
    """Per-layer FedGP as the reference code writes it, with the exact projection length.

    Like ``update_global`` in the FedGP / Auto-FedGP reference code: per layer, per source, a cosine
    similarity of the flattened tensors extracted with ``.item()``, ``if cos > 0`` an out-of-place update
    of a new state dict. The projection length cos·‖g_T‖/‖g_i‖ equals ⟨g_T, g_i⟩/‖g_i‖², so the result
    matches ``fedgp(source_dicts, target_dict, beta)`` with uniform weights.
    """
    n = len(source_dicts)
    w = 1.0 / n
    ret: dict[str, torch.Tensor] = {}
    for key in target_dict.keys():
        target_grad = target_dict[key]
        t_flat = target_grad.reshape(1, -1)
        t_norm = torch.norm(target_grad).item()
        ret[key] = (1 - beta) * target_grad
        for idx in range(n):
            local_grad = source_dicts[idx][key]
            cur_sim = F.cosine_similarity(t_flat, local_grad.reshape(1, -1)).item()
            if cur_sim > 0:
                s_norm = torch.norm(local_grad).item()
                ret[key] = ret[key] + beta * w * (cur_sim * t_norm / s_norm) * local_grad
    return ret


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_fn(fn: Callable[[], Any], device: torch.device, repeats: int, warmup: int = 2) -> list[float]:
    """Wall times in seconds of ``repeats`` calls of ``fn`` after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return times


def time_round_robin(fns: dict[str, Callable[[], Any]], device: torch.device, repeats: int,
                     warmup: int = 2) -> dict[str, list[float]]:
    """Like :func:`time_fn` for several functions, timed in turns (one call of each per round).

    Slow drifts of the machine (other load, memory reclaim in a VM) then affect every form alike, which
    keeps the ratios to the copy floor meaningful.
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    _sync(device)
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            _sync(device)
            t0 = time.perf_counter()
            fn()
            _sync(device)
            times[k].append(time.perf_counter() - t0)
    return times


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda requested but torch.cuda.is_available() is False")
    return torch.device(device)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _views(named: list[tuple[str, Shape]], rows: torch.Tensor) -> list[dict[str, torch.Tensor]]:
    """Per-tensor dicts of views (no copy) into each row of ``rows`` (N, m), in ``named`` order."""
    out = []
    for row in rows:
        d, off = {}, 0
        for name, shape in named:
            k = math.prod(shape)
            d[name] = row[off:off + k].view(shape)
            off += k
        out.append(d)
    return out


def _check_agree(naive: dict[str, torch.Tensor], lib: dict[str, torch.Tensor]) -> float:
    """Assert the naive loop and the library agree (float32 tolerance); returns the max abs difference."""
    if not isinstance(lib, dict) or naive.keys() != lib.keys():
        raise AssertionError("naive loop and fda_core.fedgp results have different keys")
    worst = 0.0
    for k in naive:
        a, b = naive[k], lib[k]
        if a.shape != b.shape:
            raise AssertionError(f"{k!r}: naive shape {tuple(a.shape)} != library shape {tuple(b.shape)}")
        diff = float((a - b).abs().max()) if a.numel() else 0.0
        if not torch.allclose(a, b, rtol=1e-4, atol=1e-5):
            raise AssertionError(f"naive loop and fda_core.fedgp disagree on {k!r}: max |diff| {diff:.3e}")
        worst = max(worst, diff)
    return worst


FORMS = ("naive", "per-tensor", "per-tensor+out", "views", "views+out", "cosine views+out", "segments+out",
         "cosine segments+out", "prepared", "cosine prepared", "flat", "flat+out", "cosine flat+out", "copy floor")


def run(device: str = "cpu", sources: Sequence[int] = (4,), repeats: int = 3, shapes: Sequence[Any] | None = None,
        *, seed: int = 0, warmup: int | None = None, interleave: bool = True, verbose: bool = False) -> list[dict]:
    """Run the benchmark; one record per (N, form) with form in ``FORMS``.

    With ``interleave`` (default) the forms are timed in turns, one call of each per round (see
    :func:`time_round_robin`); otherwise each form's R repeats run back to back. ``shapes`` overrides
    :func:`resnet18_shapes` (a list of shapes or of (name, shape) pairs), e.g.
    ``run(shapes=[(8, 3, 3, 3), (8,), (10, 8)], repeats=2)`` for a smoke test. Each record has
    ``n_sources``, ``form``, ``median_ms``, ``times_ms``, ``ratio_to_floor`` (median / copy-floor median),
    ``speedup_vs_naive`` (naive median / median), ``bytes_sources`` (N·m·4), ``n_params`` (m),
    ``n_tensors``, ``device``, ``max_abs_diff_naive_vs_library`` and ``alloc_output_ms`` (time to allocate
    and first write a fresh (m,) float32 tensor, informational); the last two are the same for every form
    of one N.
    """
    dev = resolve_device(device)
    named = _as_named(shapes)
    m = sum(math.prod(s) for _, s in named)
    if warmup is None:
        warmup = 2 if repeats >= 5 else 1
    records: list[dict] = []
    for n in sources:
        n = int(n)
        if n < 1:
            raise ValueError(f"number of sources must be >= 1, got {n}")
        S, t, src_dicts, tgt_dict = make_updates(named, n, dev, seed)
        dst = torch.empty_like(S)
        out_flat = torch.empty_like(t)
        out_dict = {k: torch.empty_like(v) for k, v in tgt_dict.items()}
        # the per-tensor form as the federated engine passes it: dicts of views into the (N, m) update buffer and
        # the (m,) target (FlatModel.as_dicts), and an out dict of views into one flat buffer
        view_dicts, view_target = _views(named, S), _views(named, t.unsqueeze(0))[0]
        out_views = _views(named, torch.empty_like(t).unsqueeze(0))[0]
        # the same layer-wise rule without dicts: the flat buffers and the tensors' lengths (what the engine passes)
        lengths = [math.prod(shape) for _, shape in named]

        # correctness first: naive loop == library per-tensor form
        diff = _check_agree(naive_fedgp(src_dicts, tgt_dict, BETA), fedgp(src_dicts, tgt_dict, BETA))
        flat_out = fedgp(S, t, BETA)
        if flat_out.shape != t.shape or not bool(torch.isfinite(flat_out).all()):
            raise AssertionError(f"fedgp(S, t) returned shape {tuple(flat_out.shape)} or non-finite values")
        del flat_out

        # the segments+out call prepared once for these buffers (fda_core.core.prepared): on a GPU with the kernels
        # replayed from a CUDA graph from its second call on; elsewhere the same call as segments+out
        prepared = {rule: prepare(rule, S, t, out=out_flat, segments=lengths) for rule in ("fedgp", "fedgp_cosine")}
        for rule, step in prepared.items():
            expected = getattr(aggregation_module, rule)(S, t, BETA, segments=lengths)
            if not torch.equal(step(BETA), expected) or not torch.equal(step(BETA), expected):
                raise AssertionError(f"prepared {rule} differs from {rule} on the same buffers")
        fns: dict[str, Callable[[], Any]] = {
            "naive": lambda: naive_fedgp(src_dicts, tgt_dict, BETA),
            "per-tensor": lambda: fedgp(src_dicts, tgt_dict, BETA),
            "per-tensor+out": lambda: fedgp(src_dicts, tgt_dict, BETA, out=out_dict),
            "views": lambda: fedgp(view_dicts, view_target, BETA),
            "views+out": lambda: fedgp(view_dicts, view_target, BETA, out=out_views),
            "cosine views+out": lambda: fedgp_cosine(view_dicts, view_target, BETA, out=out_views),
            "segments+out": lambda: fedgp(S, t, BETA, out=out_flat, segments=lengths),
            "cosine segments+out": lambda: fedgp_cosine(S, t, BETA, out=out_flat, segments=lengths),
            "prepared": lambda: prepared["fedgp"](BETA),
            "cosine prepared": lambda: prepared["fedgp_cosine"](BETA),
            "cosine flat+out": lambda: fedgp_cosine(S, t, BETA, out=out_flat),
            "flat": lambda: fedgp(S, t, BETA),
            "flat+out": lambda: fedgp(S, t, BETA, out=out_flat),
            "copy floor": lambda: dst.copy_(S),
        }
        # Informational: a fresh (m,) float32 result, allocated and written once. Every out-of-place
        # aggregation pays this on top of reading the sources; on some machines (VMs, no transparent
        # huge pages) the first-touch page faults make it a large part of the total.
        fns["alloc"] = lambda: torch.empty_like(t).fill_(0.0)
        order = ["copy floor", "per-tensor", "per-tensor+out", "views", "views+out", "cosine views+out", "segments+out",
                 "cosine segments+out", "prepared", "cosine prepared", "flat", "flat+out", "cosine flat+out", "alloc",
                 "naive"]
        if interleave:
            times = time_round_robin({k: fns[k] for k in order}, dev, repeats, warmup)
        else:
            times = {k: time_fn(fns[k], dev, repeats, warmup) for k in order}
        medians = {k: statistics.median(v) for k, v in times.items()}
        alloc_ms = medians.pop("alloc") * 1e3
        if verbose:
            for form in order:
                if form in medians:
                    print(f"  N={n:<3d} {form:<11s} {medians[form] * 1e3:10.3f} ms", file=sys.stderr, flush=True)
        for form in FORMS:
            med = medians[form]
            records.append({
                "n_sources": n,
                "form": form,
                "median_ms": med * 1e3,
                "times_ms": [x * 1e3 for x in times[form]],
                "ratio_to_floor": med / medians["copy floor"] if medians["copy floor"] > 0 else float("inf"),
                "speedup_vs_naive": medians["naive"] / med if med > 0 else float("inf"),
                "bytes_sources": n * m * 4,
                "n_params": m,
                "n_tensors": len(named),
                "device": str(dev),
                "max_abs_diff_naive_vs_library": diff,
                "alloc_output_ms": alloc_ms,
            })
    return records


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------
def environment(dev: torch.device) -> dict:
    return {
        "device": str(dev),
        "device_name": device_name(dev),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "triton": _triton_version(),
    }


def _triton_version() -> str | None:
    """The importable Triton's version (the GPU kernels' compiler), None without one."""
    try:
        return importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        return None


def format_report(records: list[dict], env: dict) -> str:
    on_gpu = env["device"].startswith("cuda")
    target = TARGET_GPU if on_gpu else TARGET_CPU
    lines = [
        f"FedGP aggregation benchmark (exact projection, beta={BETA}, uniform weights, float32)",
        f"device: {env['device']} ({env['device_name']}), torch {env['torch']}, threads {env['threads']}"
        + (f", layer-wise Triton kernels {env['kernel_config']}" if on_gpu and env.get("kernel_config") else "")
        + (f", coefficients by {env['coefficients']}" if on_gpu and env.get("coefficients") else "")
        + (f", Triton {env['triton']}" if on_gpu and env.get("triton") else ""),
        f"model: {records[0]['n_tensors']} tensors, {records[0]['n_params']:,} parameters",
        "",
        f"{'N':>3}  {'form':<16} {'median ms':>11} {'x floor':>9} {'speed-up vs naive':>18}",
        "-" * 61,
    ]
    by_n: dict[int, dict[str, dict]] = {}
    for r in records:
        by_n.setdefault(r["n_sources"], {})[r["form"]] = r
    for n, forms in by_n.items():
        for form in FORMS:
            r = forms[form]
            lines.append(f"{n:>3}  {form:<16} {r['median_ms']:>11.3f} {r['ratio_to_floor']:>9.2f} "
                         f"{r['speedup_vs_naive']:>17.1f}x")
        lines.append(f"     (info: allocating + first write of a fresh ({forms['flat']['n_params']:,},) float32 "
                     f"result: {forms['flat']['alloc_output_ms']:.3f} ms = "
                     f"{forms['flat']['alloc_output_ms'] / forms['copy floor']['median_ms']:.2f}x floor)")
        lines.append("")
    lines.append("Ratios (library/floor; naive/library). The floor copies into a preallocated buffer, as the")
    lines.append("'+out' forms do (fedgp(..., out=buf), what a training loop reuses each round); the default forms")
    lines.append("also allocate a fresh m-sized result. The target is judged on the '+out' forms of the layer-wise rule")
    lines.append("(views: dicts of views into one (N, m) buffer; segments: that buffer and the tensors' lengths, what the")
    lines.append("federated engine passes) and of the flat form, FedGP and its cosine variant; 'per-tensor' dicts hold")
    lines.append("separate tensors (a state dict), which a GPU first copies into one buffer.")
    for n, forms in by_n.items():
        r = {f: forms[f]["ratio_to_floor"] for f in FORMS}
        sp = {f: forms[f]["speedup_vs_naive"] for f in FORMS}
        judged = ("views+out", "cosine views+out", "segments+out", "cosine segments+out", "flat+out", "cosine flat+out")
        lines.append(
            f"  N={n}: library/floor per-tensor = {r['per-tensor']:.2f} (out= {r['per-tensor+out']:.2f}), "
            f"views = {r['views']:.2f} (out= {r['views+out']:.2f}, cosine {r['cosine views+out']:.2f}), "
            f"segments+out = {r['segments+out']:.2f} (cosine {r['cosine segments+out']:.2f}; prepared "
            f"{r['prepared']:.2f}, cosine {r['cosine prepared']:.2f}), "
            f"flat = {r['flat']:.2f} (out= {r['flat+out']:.2f}, cosine {r['cosine flat+out']:.2f});  naive/library "
            f"per-tensor = {sp['per-tensor']:.1f}, views = {sp['views']:.1f}, flat = {sp['flat']:.1f}"
            f"   [{'ok' if max(r[f] for f in judged) <= target else 'ABOVE TARGET'}]"
        )
    lines.append("")
    lines.append(f"Target (project brief): library within {TARGET_CPU:g}x of the copy floor on CPU, "
                 f"within {TARGET_GPU:g}x on GPU (this run: {'GPU' if on_gpu else 'CPU'}, target {target:g}x).")
    lines.append("Papers: 0.023 s per FedGP call (N=10, Fashion-MNIST CNN, TITAN Xp); 0.068 s (ResNet-18, N=4).")
    return "\n".join(lines)


def benchmark_parser(doc: str, sources: Sequence[int] = (4, 10)) -> argparse.ArgumentParser:
    """An argument parser (described by ``doc``'s first paragraph) with the options the aggregation benchmarks share:
    ``--device`` and ``--sources`` (default ``sources``)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="auto: cuda if available")
    p.add_argument("--sources", type=int, nargs="+", default=list(sources), metavar="N", help="numbers of sources N")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    p = benchmark_parser(__doc__)
    p.add_argument("--repeats", type=int, default=None, help="timed repeats per measurement (default 10; 3 with --quick)")
    p.add_argument("--quick", action="store_true", help="smoke test: R=3 and only N=4")
    p.add_argument("--seed", type=int, default=0, help="seed of the random updates")
    p.add_argument("--sequential", action="store_true",
                   help="time each form's repeats back to back instead of in turns (round-robin)")
    p.add_argument("--json", metavar="OUT", default=None, help="write the results as JSON")
    p.add_argument("--kernel-config", metavar="FORM:BLOCK:WARPS", default=None,
                   help="the layer-wise Triton kernels' configuration on a GPU (default: the library's; "
                        "see benchmarks/segmented_kernels.py)")
    p.add_argument("--coefficients", choices=["torch", "kernel"], default=None,
                   help="where layer-wise FedGP forms its coefficients on a GPU (fda_core.core.aggregation."
                        "LAYERWISE_COEFFICIENTS; default: the library's)")
    args = p.parse_args(argv)
    kernel_config = None
    if args.kernel_config is not None:
        try:
            kernel_config = segmented_triton.KernelConfig.parse(args.kernel_config)
        except ValueError as exc:
            p.error(str(exc))

    repeats = args.repeats if args.repeats is not None else (3 if args.quick else 10)
    if repeats < 1:
        p.error("--repeats must be >= 1")
    sources = [4] if args.quick else args.sources
    dev = resolve_device(args.device)
    env = environment(dev)
    print(f"running on {env['device']} ({env['device_name']}), torch {env['torch']}, threads {env['threads']}, "
          f"N in {sources}, repeats {repeats} ...", file=sys.stderr, flush=True)
    coefficients = args.coefficients or aggregation_module.LAYERWISE_COEFFICIENTS
    env["coefficients"] = coefficients
    with mock.patch.object(aggregation_module, "LAYERWISE_COEFFICIENTS", coefficients), \
            segmented_triton.configured(kernel_config or segmented_triton.default_config()):
        env["kernel_config"] = segmented_triton.default_config().label
        records = run(str(dev), sources, repeats, seed=args.seed, interleave=not args.sequential, verbose=True)
    print(format_report(records, env))
    if args.json:
        atomic_write_json(args.json, {
            "benchmark": "fedgp_aggregation",
            "beta": BETA,
            "seed": args.seed,
            "repeats": repeats,
            "interleave": not args.sequential,
            "sources": sources,
            "targets": {"cpu": TARGET_CPU, "gpu": TARGET_GPU},
            "environment": env,
            "results": records,
        })
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
