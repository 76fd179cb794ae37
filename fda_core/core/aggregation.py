"""Aggregation rules for federated domain adaptation (FDA).

A target client holds a few labelled samples and receives gradients (or model updates) from N source
clients. Each rule combines them into one update direction ĝ; the update is θ ← θ − μ·ĝ.

Convention (``docs/theory.md`` § Conventions): **β weights the SOURCE part**; β = 0 returns the target
gradient, β = 1 relies on the sources only.

Accepted forms of ``source_grads`` (and the matching ``target_grad``):

* a tensor of shape ``(N, m)`` with ``target_grad`` of shape ``(m,)``; leading batch dimensions are
  allowed: ``(*batch, N, m)`` with ``(*batch, m)`` aggregates every batch entry independently
  (used by Monte-Carlo checks and batched trainers);
* a sequence of N tensors of one shape, flattened, with ``target_grad`` of that shape; the result has
  the target's shape;
* a sequence of N parameter dicts (name → tensor) with ``target_grad`` a dict with the same keys and
  shapes: per-tensor (layer-wise) aggregation, the result is a dict. FedGP then projects each tensor
  separately (``docs/theory.md`` § Layer-wise application);
* the same layer-wise aggregation without dicts: a tensor ``(N, m)`` with ``target_grad`` ``(m,)`` and
  ``segments=(n_1, …, n_L)``, the lengths of the parameter tensors laid out back to back in each row
  (:func:`fedgp`, :func:`fedgp_nofilter`, :func:`fedgp_cosine`, :func:`fedgp_auto`). The result is the flat
  ``(m,)`` tensor whose segments equal the dict form's tensors, bit for bit on views of the same memory; on a GPU
  it skips the per-tensor Python work of the dict form (``benchmarks/aggregation.py``, form ``segments+out``).

``beta``: a float, or one float per source (shape ``(N,)``, or ``(*batch, N)`` for batched input).
``weights``: per-source weights w_i ≥ 0 (default uniform), normalised to sum to 1.

Every public rule raises :class:`ValueError` naming the argument on bad input: β outside [0, 1],
NaN/inf values, shape or key mismatch, an empty source list, negative weights.
"""

from __future__ import annotations

import math
import operator
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Union

import torch
from torch import Tensor

from .segmented import (layerwise_combine, layerwise_project, layerwise_reductions, layerwise_start,
                        projection_kernels)

if TYPE_CHECKING:
    from .segmented_triton import Reduction

__all__ = [
    "source_only",
    "target_only",
    "fedda",
    "fedgp",
    "fedgp_cosine",
    "fedgp_nofilter",
    "fedda_auto",
    "fedgp_auto",
    "magnitude_alignment",
    "Rule",
    "get_rule",
    "list_rules",
    "register_rule",
    "RULES",
]

GradDict = Mapping[str, Tensor]
SourceGrads = Union[Tensor, Sequence[Tensor], Sequence[GradDict]]
TargetGrad = Union[Tensor, GradDict]
BetaLike = Union[float, Sequence[float], Tensor]


# ---------------------------------------------------------------------------------------------
# Input normalisation and validation
# ---------------------------------------------------------------------------------------------
@dataclass
class _FlatLayout:
    """Per-tensor (dict) input seen as flat buffers: sources (N, m), target (m,), segment lengths (L,) in key order.

    The rows are views when the dicts' tensors already lie back to back in one buffer (as the federated engine
    keeps them, :class:`fda_core.experiments.flat.FlatModel`), else one copy. The layer-wise reductions and the
    combination then run in a fixed handful of kernels (:mod:`fda_core.core.segmented`) instead of ~3·N·L.
    """

    sources: Tensor
    target: Tensor
    lengths: tuple[int, ...]


#: how per-tensor (dict) input is aggregated: "auto" (segmented on CUDA devices, a per-tensor loop elsewhere),
#: "loop" (always per tensor) or "segmented" (always on flat buffers). The two agree to float rounding; the CPU
#: default stays the loop (docs/theory.md § Layer-wise application, benchmarks/aggregation_variants.py).
LAYERWISE_BACKEND = "auto"


def _segmented(device: torch.device) -> bool:
    if LAYERWISE_BACKEND not in ("auto", "loop", "segmented"):
        raise ValueError(f"LAYERWISE_BACKEND must be 'auto', 'loop' or 'segmented', got {LAYERWISE_BACKEND!r}")
    return LAYERWISE_BACKEND == "segmented" or (LAYERWISE_BACKEND == "auto" and device.type == "cuda")


#: where layer-wise FedGP (:func:`fedgp`, :func:`fedgp_nofilter`, :func:`fedgp_cosine` on dicts or ``segments``) forms
#: its per-segment coefficients when the Triton kernels run (CUDA, segmented backend): "torch" (torch operators
#: between the reduction and the combination kernel: some 20 small kernel launches per call) or "kernel" (one more
#: Triton kernel, which also forms the finiteness flag: three kernels, one small copy and one flag read per call;
#: :func:`fda_core.core.segmented_triton.project`). Same arithmetic; the per-segment sums are added in another order,
#: so the two agree to float rounding. Elsewhere (the CPU) the setting changes nothing. Default "kernel": on an H200
#: (2026-11-26, ``benchmarks/segmented_kernels.py``, same run) a whole call took 0.51 instead of 0.65 ms at N = 4 and
#: 0.61–0.64 instead of 0.69–0.76 ms at N = 10, its CUDA tests passing there (docs/performance.md § GPU).
LAYERWISE_COEFFICIENTS = "kernel"


#: when a layer-wise call on the kernel path (``LAYERWISE_COEFFICIENTS = "kernel"``) launches its first kernel, the
#: reduction: "late" (with the other two, after β and the weights are checked and packed) or "early" (first, so that
#: this host work overlaps the kernel on the GPU; :func:`~fda_core.core.segmented.layerwise_start`). Same results,
#: bit for bit. Default "late": on an H200 (2026-11-26, ``benchmarks/segmented_kernels.py``, two runs, rows in
#: turns) the early launch made a whole call slower, 0.439–0.575 instead of 0.368–0.531 ms at N = 4 and 0.494–0.528
#: instead of 0.469–0.483 ms at N = 10 (docs/performance.md § GPU); why is not established.
LAYERWISE_REDUCTION_LAUNCH = "late"


class _KernelPath(NamedTuple):
    """A layer-wise call on the three-kernel path; ``reduction``: its first kernel, launched early, or None (launched
    with the others, by :func:`~fda_core.core.segmented.layerwise_project`)."""

    reduction: Reduction | None


def _kernel_layout(blocks: _Blocks) -> _FlatLayout | None:
    """The flat layout on which this FedGP call forms its coefficients in the Triton kernels
    (``LAYERWISE_COEFFICIENTS = "kernel"`` and the kernels can run here), else None: the torch path. Flat input, one
    (N, m) buffer and its (m,) target, takes that path too, as the layer-wise rule with a single segment of length m,
    which is the flat rule (docs/theory.md § Layer-wise application), on the segmented backend only (CUDA by
    default), so that the CPU keeps its own flat path. ``blocks`` is not changed."""
    if LAYERWISE_COEFFICIENTS not in ("torch", "kernel"):
        raise ValueError(f"LAYERWISE_COEFFICIENTS must be 'torch' or 'kernel', got {LAYERWISE_COEFFICIENTS!r}")
    if LAYERWISE_REDUCTION_LAUNCH not in ("late", "early"):
        raise ValueError(f"LAYERWISE_REDUCTION_LAUNCH must be 'late' or 'early', got {LAYERWISE_REDUCTION_LAUNCH!r}")
    if LAYERWISE_COEFFICIENTS != "kernel":
        return None
    flat = blocks.flat
    if flat is None:
        if blocks.kind not in ("tensor", "sequence") or blocks.sources[0].ndim != 2:  # type: ignore[index]
            return None
        src, tgt = blocks.sources[0], blocks.target[0]  # type: ignore[index]
        if src.shape[-1] == 0 or not _segmented(tgt.device):
            return None
        flat = _FlatLayout(src, tgt, (src.shape[-1],))
    return flat if projection_kernels(flat.sources, flat.target) else None


def _fused(blocks: _Blocks) -> _KernelPath | None:
    """Whether this FedGP call forms its coefficients in the Triton kernels (:func:`_kernel_layout`; None: the torch
    path), with the reduction launched now where ``LAYERWISE_REDUCTION_LAUNCH = "early"``. On that path
    ``blocks.flat`` is set to the layout (for flat input: one segment of length m)."""
    flat = _kernel_layout(blocks)
    if flat is None:
        return None
    reduction = None
    if LAYERWISE_REDUCTION_LAUNCH == "early":
        reduction = layerwise_start(flat.sources, flat.target, flat.lengths)
    blocks.flat = flat
    return _KernelPath(reduction)


def _laid_out(tensors: list[list[Tensor]]) -> Tensor | None:
    """``tensors[i][k]`` (flat (m_k,) views) as one strided (N, m) view of their storage when every row lies back to
    back in key order with a common row stride; None otherwise."""
    first = tensors[0][0]
    n = len(tensors)
    sizes = [x.numel() for x in tensors[0]]
    m = sum(sizes)
    item = first.element_size()
    base = first.data_ptr()
    row_stride = (tensors[1][0].data_ptr() - base) // item if n > 1 else m
    if not (row_stride >= m or n == 1) or any(x.dtype != first.dtype for x in tensors[0]):
        return None
    for i, row in enumerate(tensors):
        ptr = base + i * row_stride * item
        for x, size in zip(row, sizes):
            if x.data_ptr() != ptr or (size > 1 and x.stride(0) != 1):
                return None
            ptr += size * item
    return first.as_strided((n, m), (row_stride, 1), first.storage_offset())


def _flat_rows(tensors: list[list[Tensor]]) -> Tensor:
    """``tensors[i][k]`` as one (N, m) tensor: the view of :func:`_laid_out` when there is one, else a copy."""
    view = _laid_out(tensors)
    if view is not None:
        return view
    first = tensors[0][0]
    out = torch.empty(len(tensors), sum(x.numel() for x in tensors[0]), dtype=first.dtype, device=first.device)
    for i, row in enumerate(tensors):
        torch.cat(row, out=out[i])
    return out


@dataclass
class _Blocks:
    """Sources and target normalised to blocks of flat tensors.

    ``sources[k]`` has shape (*batch, N, m_k) and ``target[k]`` shape (*batch, m_k). A flat input is
    one block; a dict input has one block per key (``keys``), each a list of N per-source tensors
    (``per_source``) because stacking them would copy every byte once more.
    """

    kind: str  # "tensor" | "sequence" | "dict" | "segments"
    n_sources: int
    target: list[Tensor]
    sources: list[Tensor] | None = None  # flat kinds: [(*batch, N, m)]
    per_source: list[list[Tensor]] | None = None  # dict kind: per_source[k][i] (m_k,)
    keys: list[str] | None = None
    shapes: list[torch.Size] | None = None
    target_shape: torch.Size | None = None
    flat: _FlatLayout | None = None  # dict/segments kind, segmented backend: the same numbers as one (N, m) buffer
    result: Tensor | None = None  # segments kind, loop backend: the flat (m,) result the per-segment outputs view

    @property
    def batch_shape(self) -> torch.Size:
        return self.target[0].shape[:-1]

    @property
    def n_blocks(self) -> int:
        """L: the number of blocks the coefficients are computed for (segments, keys, or 1 for flat input)."""
        return len(self.flat.lengths) if self.flat is not None else len(self.target)

    def where(self, k: int) -> str:
        """How error messages name block k: ``[key]`` for dicts, `` (segment k)`` for segments, else nothing."""
        if self.keys:
            return f"[{self.keys[k]!r}]"
        return f" (segment {k})" if self.kind == "segments" else ""


def _as_float_tensor(x: Any, name: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not (x.is_floating_point() or x.is_complex()):
        x = x.to(torch.get_default_dtype())
    return x


def _normalise(source_grads: SourceGrads, target_grad: TargetGrad | None,
               segments: Sequence[int] | None = None) -> _Blocks:
    """Validate the gradient arguments and bring them to the internal block form."""
    if segments is not None:
        return _normalise_segments(source_grads, target_grad, segments)
    if isinstance(source_grads, Tensor):
        src = _as_float_tensor(source_grads, "source_grads")
        if src.ndim < 2:
            raise ValueError(
                "source_grads as a tensor must have shape (N, m) (or (*batch, N, m)), "
                f"got shape {tuple(src.shape)}"
            )
        if src.shape[-2] == 0:
            raise ValueError("source_grads must contain at least one source (N >= 1), got N = 0")
        if target_grad is None:
            tgt = src.new_zeros(src.shape[:-2] + src.shape[-1:])
        else:
            if isinstance(target_grad, Mapping):
                raise ValueError("target_grad is a dict but source_grads is a tensor; pass both flat or both as dicts")
            tgt = _as_float_tensor(target_grad, "target_grad")
            expected = src.shape[:-2] + src.shape[-1:]
            if tgt.shape != expected:
                raise ValueError(
                    f"target_grad has shape {tuple(tgt.shape)} but source_grads has shape {tuple(src.shape)}; "
                    f"expected target_grad of shape {tuple(expected)}"
                )
            if tgt.device != src.device:
                raise ValueError(f"target_grad is on {tgt.device} but source_grads on {src.device}")
        return _Blocks("tensor", src.shape[-2], [tgt], sources=[src])

    if isinstance(source_grads, (str, bytes)) or not isinstance(source_grads, Sequence):
        raise ValueError(
            "source_grads must be a tensor (N, m), a sequence of tensors or a sequence of parameter dicts, "
            f"got {type(source_grads).__name__}"
        )
    n = len(source_grads)
    if n == 0:
        raise ValueError("source_grads must contain at least one source, got an empty sequence")

    if all(isinstance(s, Mapping) for s in source_grads):
        return _normalise_dicts(source_grads, target_grad)  # type: ignore[arg-type]
    if not all(isinstance(s, Tensor) for s in source_grads):
        raise ValueError("source_grads must hold only tensors or only parameter dicts (name -> tensor)")

    shape = source_grads[0].shape
    for i, s in enumerate(source_grads):
        if s.shape != shape:
            raise ValueError(
                f"source_grads[{i}] has shape {tuple(s.shape)} but source_grads[0] has shape {tuple(shape)}"
            )
    if target_grad is not None:
        if isinstance(target_grad, Mapping):
            raise ValueError("target_grad is a dict but source_grads holds tensors; pass both as dicts")
        tgt = _as_float_tensor(target_grad, "target_grad")
        if tgt.shape != shape:
            raise ValueError(f"target_grad has shape {tuple(tgt.shape)} but each source gradient has shape {tuple(shape)}")
    else:
        tgt = torch.zeros(shape, dtype=source_grads[0].dtype, device=source_grads[0].device)
    src = torch.stack([_as_float_tensor(s, f"source_grads[{i}]").reshape(-1) for i, s in enumerate(source_grads)])
    return _Blocks("sequence", n, [tgt.reshape(-1)], sources=[src], target_shape=shape)


def _check_keys(d: Mapping[str, Any], keyset: set[str], what: str) -> None:
    """ValueError ``"<what>: missing [...], extra [...]"`` unless ``d`` has exactly the keys ``keyset``."""
    if set(d.keys()) != keyset:
        raise ValueError(f"{what}: missing {sorted(keyset - set(d.keys()))}, extra {sorted(set(d.keys()) - keyset)}")


def _normalise_dicts(source_grads: Sequence[GradDict], target_grad: TargetGrad | None) -> _Blocks:
    keys = list(source_grads[0].keys())
    if not keys:
        raise ValueError("source_grads[0] is an empty parameter dict")
    keyset = set(keys)
    for i, s in enumerate(source_grads):
        _check_keys(s, keyset, f"source_grads[{i}] keys differ from source_grads[0]")
    if target_grad is not None:
        if not isinstance(target_grad, Mapping):
            raise ValueError("source_grads holds parameter dicts, so target_grad must be a dict with the same keys")
        _check_keys(target_grad, keyset, "target_grad keys differ from source_grads")
    shapes, targets, per_source = [], [], []
    for k in keys:
        shape = source_grads[0][k].shape
        for i, s in enumerate(source_grads):
            if s[k].shape != shape:
                raise ValueError(
                    f"source_grads[{i}][{k!r}] has shape {tuple(s[k].shape)}, source_grads[0][{k!r}] {tuple(shape)}"
                )
        if target_grad is not None:
            t = _as_float_tensor(target_grad[k], f"target_grad[{k!r}]")
            if t.shape != shape:
                raise ValueError(f"target_grad[{k!r}] has shape {tuple(t.shape)} but the sources have {tuple(shape)}")
        else:
            t = torch.zeros(shape, dtype=source_grads[0][k].dtype, device=source_grads[0][k].device)
        shapes.append(shape)
        targets.append(t.reshape(-1))
        per_source.append([(x if isinstance(x, Tensor) and x.is_floating_point()  # the name is formatted on error only
                            else _as_float_tensor(x, f"source_grads[{i}][{k!r}]")).reshape(-1)
                           for i, x in enumerate(s[k] for s in source_grads)])
    flat = None
    if _segmented(targets[0].device) and all(x.numel() for x in targets) and len(
            {(x.dtype, x.device) for x in targets} | {(x.dtype, x.device) for row in per_source for x in row}) == 1:
        rows = [[per_source[k][i] for k in range(len(keys))] for i in range(len(source_grads))]
        flat = _FlatLayout(_flat_rows(rows), _flat_rows([targets])[0], tuple(x.numel() for x in targets))
    return _Blocks("dict", len(source_grads), targets, per_source=per_source, keys=keys, shapes=shapes, flat=flat)


def _check_segments(segments: Any, m: int) -> tuple[int, ...]:
    """``segments`` as a tuple of positive ints summing to ``m`` (a ValueError naming it otherwise)."""
    if isinstance(segments, (str, bytes, Mapping)) or not hasattr(segments, "__iter__"):
        raise ValueError(f"segments must be a sequence of positive segment lengths, got {type(segments).__name__}")
    raw = segments.tolist() if hasattr(segments, "tolist") else list(segments)  # tensors and numpy arrays too
    if set(map(type, raw)) == {int}:  # plain ints (the engine's form), checked at C speed: a few µs less per call
        values = raw
    else:
        try:
            values = [operator.index(n) for n in raw if not isinstance(n, bool)]
        except TypeError:
            values = []
    if not values or len(values) != len(raw) or min(values) < 1:
        raise ValueError(f"segments must be one or more positive integers (segment lengths), got {raw[:8]}")
    if sum(values) != m:
        raise ValueError(f"segments must sum to m = {m} (the length of each row of source_grads), got {sum(values)}")
    return tuple(values)


def _normalise_segments(source_grads: SourceGrads, target_grad: TargetGrad | None, segments: Any) -> _Blocks:
    """The segments form: sources (N, m), target (m,) and segment lengths, as the blocks of a layer-wise rule.

    Segmented backend: the buffers themselves (no per-segment Python work). Loop backend: per-segment views of
    them, exactly the blocks the dict form builds from views of the same rows, so both give the same bits.
    """
    if not isinstance(source_grads, Tensor) or source_grads.ndim != 2:
        shape = tuple(source_grads.shape) if isinstance(source_grads, Tensor) else type(source_grads).__name__
        raise ValueError(f"segments needs source_grads as one (N, m) tensor, got {shape}")
    if target_grad is not None and (not isinstance(target_grad, Tensor) or target_grad.ndim != 1):
        shape = tuple(target_grad.shape) if isinstance(target_grad, Tensor) else type(target_grad).__name__
        raise ValueError(f"segments needs target_grad as one (m,) tensor, got {shape}")
    blocks = _normalise(source_grads, target_grad)  # shapes, devices, N >= 1
    src, tgt = blocks.sources[0], blocks.target[0]  # type: ignore[index]
    lengths = _check_segments(segments, src.shape[-1])
    if _segmented(tgt.device) and src.dtype == tgt.dtype:
        return _Blocks("segments", blocks.n_sources, [tgt], sources=[src], flat=_FlatLayout(src, tgt, lengths))
    columns = src.split(lengths, dim=1)
    return _Blocks("segments", blocks.n_sources, list(tgt.split(lengths)),
                   per_source=[list(c.unbind(0)) for c in columns], shapes=[torch.Size([n]) for n in lengths])


def _per_source(value: BetaLike | None, blocks: _Blocks, name: str, *, default: float | None = None) -> Tensor:
    """β or weights as a tensor broadcastable to (*batch, N) in the target's dtype, its shape checked (its values are
    checked by :func:`_checked_per_source`): Python numbers and host tensors on the host, where checking them reads no
    device (the caller then copies them asynchronously, :func:`_to_target_device`); other tensors on the target's
    device."""
    ref = blocks.target[0]
    n = blocks.n_sources
    if value is None:
        if default is None:
            raise ValueError(f"{name} is required")
        return torch.full((n,), default, dtype=ref.dtype)  # on the host, like a Python value
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number or one number per source, got a bool")
    host = not isinstance(value, Tensor) or value.device.type == "cpu"
    where = torch.device("cpu") if host else ref.device
    if isinstance(value, (int, float)):
        t = torch.tensor(float(value), dtype=ref.dtype, device=where)
    else:
        try:
            t = torch.as_tensor(value, dtype=ref.dtype, device=where)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{name} must be a number or one number per source: {exc}") from None
    if t.ndim == 0:
        t = t.expand(n)
    if t.shape[-1] != n:
        raise ValueError(f"{name} has {t.shape[-1]} entries but there are {n} sources (shape {tuple(t.shape)})")
    try:
        torch.broadcast_shapes(t.shape, blocks.batch_shape + (n,))
    except RuntimeError:
        raise ValueError(
            f"{name} of shape {tuple(t.shape)} does not broadcast to (*batch, N) = {tuple(blocks.batch_shape + (n,))}"
        ) from None
    return t


def _round_float32(x: float) -> float:
    """``x`` rounded to the nearest float32 (as ``torch.tensor(x, dtype=torch.float32)`` does), as a Python float."""
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:  # beyond float32's range: torch gives ±inf
        return math.copysign(math.inf, x)


_ROUND_TO = {torch.float64: float, torch.float32: _round_float32}


def _python_values(value: Any, blocks: _Blocks) -> list[float] | None:
    """``value`` as one Python float per source, each rounded to the target's dtype as the tensor path would, when it
    is a Python number or a list/tuple of N Python numbers and the dtype is float32/64; None otherwise (the tensor
    path then converts and checks it). Checking these in Python spares a dozen tiny torch operators per call."""
    round_to = _ROUND_TO.get(blocks.target[0].dtype)
    n = blocks.n_sources
    if round_to is None:
        return None
    if type(value) in (int, float):
        items = [value] * n
    elif type(value) in (list, tuple) and len(value) == n and all(type(v) in (int, float) for v in value):
        items = value
    else:
        return None
    try:
        return [round_to(float(v)) for v in items]
    except OverflowError:  # an int too large for a float: let the tensor path report it
        return None


_BETA_BOUNDS = "lie in [0, 1] (β weights the source part)"


def _checked_python(value: Any, blocks: _Blocks, name: str, bounds: str, *, upper: float | None = None,
                    default: float | None = None, positive_sum: bool = False) -> list[float] | None:
    """``value`` (``default`` where None) as one checked Python float per source (:func:`_python_values`): finite,
    ≥ 0, with ``upper`` ≤ ``upper`` and with ``positive_sum`` of positive sum (a ValueError "{name} must be finite",
    "{name} must {bounds}" or "{name} must have a positive sum" otherwise); None, checking nothing, when it is not
    Python numbers (a tensor, or a dtype other than float32/64)."""
    values = _python_values(default if value is None else value, blocks)
    if values is None:
        return None
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if not all(0.0 <= v and (upper is None or v <= upper) for v in values):
        raise ValueError(f"{name} must {bounds}, got {value!r}")
    if positive_sum and not any(v > 0 for v in values):  # non-negative values: their sum is > 0 iff one of them is
        raise ValueError(f"{name} must have a positive sum, got {value!r}")
    return values


def _checked_per_source(value: BetaLike | None, blocks: _Blocks, name: str, bounds: str, *, upper: float | None = None,
                        default: float | None = None, positive_sum: bool = False) -> tuple[Tensor, list[float] | None]:
    """``value`` per source (:func:`_per_source`) checked finite, ≥ 0, with ``upper`` ≤ ``upper`` and with
    ``positive_sum`` of positive sum (a ValueError "{name} must be finite", "{name} must {bounds}" or "{name} must
    have a positive sum" otherwise): the tensor and its Python values, or None for the values when it came as a
    tensor. Python numbers are checked in Python (:func:`_checked_python`); a tensor where it is, with one read of
    the result (on a GPU one host synchronisation per argument, whatever is checked), and more only to name what
    failed."""
    values = _checked_python(value, blocks, name, bounds, upper=upper, default=default, positive_sum=positive_sum)
    if values is not None:
        return torch.tensor(values, dtype=blocks.target[0].dtype), values
    t = _per_source(value, blocks, name, default=default)
    finite = torch.isfinite(t)
    inside = t >= 0 if upper is None else (t >= 0) & (t <= upper)
    ok = (finite & inside).all()
    if positive_sum:
        ok = ok & (t.sum(-1) > 0).all()
    if not bool(ok):
        if not bool(finite.all()):
            raise ValueError(f"{name} must be finite, got {value!r}")
        if not bool(inside.all()):
            raise ValueError(f"{name} must {bounds}, got {value!r}")
        raise ValueError(f"{name} must have a positive sum, got {value!r}")
    return t, None


def _check_beta(beta: BetaLike, blocks: _Blocks) -> Tensor:
    """β checked (on the host for Python values) and on the target's device."""
    return _to_target_device(_checked_per_source(beta, blocks, "beta", _BETA_BOUNDS, upper=1.0)[0], blocks)


def _check_weights(weights: BetaLike | None, blocks: _Blocks, move: bool = True) -> Tensor:
    """The weights checked and normalised to sum 1, on the target's device (where they were checked unless ``move``)."""
    w, _ = _checked_per_source(weights, blocks, "weights", "be non-negative", default=1.0, positive_sum=True)
    w = w / w.sum(-1, keepdim=True)
    return _to_target_device(w, blocks) if move else w


def _check_alignment(alignment: BetaLike | None, blocks: _Blocks) -> Tensor:
    """The cosine form's alignment factors (default 1) checked non-negative, where they were given (the host for
    Python values)."""
    return _checked_per_source(alignment, blocks, "alignment", "be non-negative", default=1.0)[0]


def _to_target_device(x: Tensor, blocks: _Blocks) -> Tensor:
    """A host-checked per-source tensor on the target's device (no-op when it is there).

    To CUDA through pinned memory and an asynchronous copy: a blocking copy from pageable memory makes the host wait
    for the stream (a synchronisation per call); torch's caching host allocator keeps the pinned block alive until
    the copy has run."""
    ref = blocks.target[0]
    if x.device == ref.device:
        return x
    if ref.device.type == "cuda" and x.device.type == "cpu":
        return x.contiguous().pin_memory().to(ref.device, non_blocking=True)
    return x.to(ref.device)


def _raise_non_finite(blocks: _Blocks) -> None:
    """Slow path, only after a non-finite result: find and name the offending argument. The sources are looked at
    first: where ``out`` is the target itself, the target already holds the non-finite result, so a NaN in a source
    would otherwise be blamed on the target."""
    for k in range(len(blocks.target)):
        if blocks.sources is not None:
            bad = ~torch.isfinite(blocks.sources[k]).flatten(0, -3).all(-1).all(0) if blocks.sources[k].ndim > 2 \
                else ~torch.isfinite(blocks.sources[k]).all(-1)
            idx = [int(i) for i in torch.nonzero(bad).flatten()]
            if idx:
                raise ValueError(f"source_grads[{idx[0]}] contains NaN or inf")
        else:
            for i, s in enumerate(blocks.per_source[k]):  # type: ignore[index]
                if not bool(torch.isfinite(s).all()):
                    raise ValueError(f"source_grads[{i}]{blocks.where(k)} contains NaN or inf")
    for k, t in enumerate(blocks.target):
        if not bool(torch.isfinite(t).all()):
            where = blocks.where(k) if blocks.per_source is not None else ""  # one flat target: no segment
            raise ValueError(f"target_grad{where} contains NaN or inf")
    raise ValueError(
        "the aggregated gradient is not finite although every input is: values too large for "
        f"{blocks.target[0].dtype} (squared norms overflow); rescale the gradients"
    )


def _check_finite(blocks: _Blocks, sums: Tensor, outs: list[Tensor], checks: Tensor | None) -> None:
    """Raise a ValueError naming the offending argument unless ``sums`` (sums of parts of the outputs ``outs``)
    and ``checks`` are finite; one host synchronisation when they are."""
    if checks is not None:
        sums = torch.cat([sums, checks.reshape(-1).to(sums.dtype)])
    # Σ 0·x is 0 when every x is finite and NaN otherwise (0·inf = NaN), and cannot overflow: two operators and one
    # scalar instead of isfinite(x).all()'s five (abs, ne, eq, mul, all) — fewer kernel launches per call on a GPU
    if float(torch.mul(sums, 0).sum()) != 0.0:
        _recheck_finite(blocks, outs, checks)


def _check_flag(blocks: _Blocks, flag: Tensor, outs: list[Tensor], checks: Tensor) -> None:
    """As :func:`_check_finite` for the fused kernels' flag (0 when the outputs' chunk sums and ``checks`` are
    finite, NaN otherwise): one host synchronisation, the exact re-check only after a non-zero flag."""
    if float(flag) != 0.0:
        _recheck_finite(blocks, outs, checks)


def _recheck_finite(blocks: _Blocks, outs: list[Tensor], checks: Tensor | None) -> None:
    """After a cheap check failed: raise (naming the argument) unless the outputs and ``checks`` are finite element by
    element (a sum of finite values can overflow)."""
    exact = all(bool(torch.isfinite(o).all()) for o in outs)
    if not (exact and (checks is None or bool(torch.isfinite(checks).all()))):
        _raise_non_finite(blocks)


def _finish(blocks: _Blocks, outs: list[Tensor], checks: Tensor | None = None) -> Tensor | dict[str, Tensor]:
    """Check finiteness cheaply and restore the input's form.

    A NaN/inf anywhere in an input reaches the outputs or the small reductions ``checks`` (dot products,
    norms), and any NaN/inf element of an output makes its sum non-finite: one reduction per output
    instead of ``isfinite(o).all()`` (which materialises several m-sized temporaries, half the cost of a
    call on ResNet-18-sized updates). A finite output whose sum merely overflows is re-checked exactly.
    """
    _check_finite(blocks, torch.stack([o.sum() for o in outs]).reshape(-1), outs, checks)
    if blocks.kind == "segments":
        return blocks.result  # type: ignore[return-value]
    if blocks.kind == "dict":
        return {k: o.reshape(s) for k, o, s in zip(blocks.keys, outs, blocks.shapes)}  # type: ignore[arg-type]
    if blocks.kind == "sequence":
        return outs[0].reshape(blocks.target_shape)  # type: ignore[arg-type]
    return outs[0]


# ---------------------------------------------------------------------------------------------
# Core arithmetic on blocks. For one block with sources S (*batch, N, m) and target t (*batch, m):
#   ĝ = (1 − Σ_i w_i β_i) t + Σ_i c_i s_i                       (docs/theory.md § Rules)
# where the per-source coefficient c_i depends on the rule. Each rule computes c (*batch, N) per block,
# then one fused multiply-add per block forms ĝ, so the sources are read a small constant number of
# times and never copied (dict input) — see benchmarks/aggregation.py.
# ---------------------------------------------------------------------------------------------
def _reductions(blocks: _Blocks, with_target_norm: bool) -> tuple[Tensor, Tensor, Tensor | None]:
    """⟨t, s_i⟩, ‖s_i‖² of shape (L, *batch, N) and, if asked, ‖t‖ of shape (L, *batch, 1).

    L is the number of blocks (1 for flat input). For dict input the L·N·2 scalars come from one
    ``torch.stack``, with ‖s_i‖² computed right after ⟨t, s_i⟩ while s_i is (partly) still in cache.
    """
    if blocks.flat is not None:
        dots, norms2, tnorm2 = layerwise_reductions(blocks.flat.sources, blocks.flat.target, blocks.flat.lengths)
        return dots.T, norms2.T, tnorm2.sqrt().unsqueeze(-1) if with_target_norm else None
    if blocks.sources is not None:
        s, t = blocks.sources[0], blocks.target[0]
        dots = torch.matmul(s, t.unsqueeze(-1)).squeeze(-1)
        norms2 = torch.linalg.vector_norm(s, dim=-1).square()
        tnorm = torch.linalg.vector_norm(t, dim=-1, keepdim=True).unsqueeze(0) if with_target_norm else None
        return dots.unsqueeze(0), norms2.unsqueeze(0), tnorm
    n, n_blocks = blocks.n_sources, len(blocks.target)
    vals: list[Tensor] = []
    for k in range(n_blocks):
        t = blocks.target[k]
        for src in blocks.per_source[k]:  # type: ignore[index]
            vals.append(torch.dot(src, t))
            vals.append(torch.dot(src, src))
    both = torch.stack(vals).view(n_blocks, n, 2)
    tnorm = None
    if with_target_norm:
        tnorm = torch.stack([torch.linalg.vector_norm(t) for t in blocks.target]).view(n_blocks, 1)
    return both[..., 0], both[..., 1], tnorm


def _combine(blocks: _Blocks, k: int, target_coef: Tensor, coef: Tensor, coef_list: list[float] | None = None,
             out: Tensor | None = None) -> Tensor:
    """target_coef·t + Σ_i coef_i·s_i for block k (target_coef (*batch,), coef (*batch, N)), written
    into ``out`` (a flat (m_k,) buffer) when given."""
    t = blocks.target[k]
    if blocks.sources is not None:
        s = blocks.sources[k]
        coef = coef.to(s.dtype)
        if s.ndim == 2:  # one fused BLAS call, no (m,) temporaries: target_coef·t + Sᵀ coef
            return torch.addmv(t, s.mT, coef, beta=float(target_coef), out=out)
        mixed = torch.matmul(coef.unsqueeze(-2), s).squeeze(-2)
        return mixed.addcmul_(t, target_coef.unsqueeze(-1).to(s.dtype))
    # dict input: axpy per source, no stacking copy. coef_list holds the same numbers as Python floats
    # (one device sync per call, made by the caller for all blocks at once).
    out = torch.mul(t, float(target_coef), out=out)
    for c, s in zip(coef_list, blocks.per_source[k]):  # type: ignore[arg-type]
        if c != 0.0:
            out.add_(s, alpha=c)
    return out


def _out_buffers(out: Tensor | GradDict | None, blocks: _Blocks) -> list[Tensor] | None:
    """Validate ``out`` and return one flat view per block (None when no buffer is given).

    ``out`` receives the result in place (a federated loop reuses it every round, which avoids
    allocating, and page-faulting, an m-sized result per call). It must have the result's form, shape,
    dtype and device, be contiguous and not share memory with a source (it may be the target itself).
    """
    if out is None:
        return None
    if blocks.kind == "dict":
        if not isinstance(out, Mapping) or set(out.keys()) != set(blocks.keys):  # type: ignore[arg-type]
            raise ValueError("out must be a dict with the same keys as target_grad for per-tensor input")
        items = [(f"out[{k!r}]", out[k], shape) for k, shape in zip(blocks.keys, blocks.shapes)]  # type: ignore[arg-type]
    elif blocks.kind == "segments":
        if not isinstance(out, Tensor):
            raise ValueError(f"out must be a tensor of shape (m,) for the segments form, got {type(out).__name__}")
        ref = blocks.flat.target if blocks.flat is not None else blocks.target[0]
        m = sum(blocks.flat.lengths) if blocks.flat is not None else sum(t.numel() for t in blocks.target)
        if out.shape != (m,) or out.dtype != ref.dtype or out.device != ref.device or not out.is_contiguous():
            raise ValueError(f"out must be a contiguous tensor of shape ({m},), dtype {ref.dtype} and device "
                             f"{ref.device}; got {tuple(out.shape)}, {out.dtype}, {out.device}")
        rows = blocks.flat.sources if blocks.flat is not None else blocks.per_source[0][0]  # type: ignore[index]
        if rows.untyped_storage().data_ptr() == out.untyped_storage().data_ptr():
            raise ValueError("out shares memory with source_grads; it would be overwritten while being read")
        return [out]
    else:
        if blocks.sources[0].ndim != 2:  # type: ignore[index]
            raise ValueError("out is only supported for unbatched input (source_grads of shape (N, m))")
        if not isinstance(out, Tensor):
            raise ValueError(f"out must be a tensor, got {type(out).__name__}")
        shape = blocks.target_shape if blocks.kind == "sequence" else blocks.target[0].shape
        items = [("out", out, shape)]
    views = []
    for k, (name, buf, shape) in enumerate(items):
        ref = blocks.target[k]
        if buf.shape != shape or buf.dtype != ref.dtype or buf.device != ref.device:
            raise ValueError(
                f"{name} must have shape {tuple(shape)}, dtype {ref.dtype} and device {ref.device}; got "
                f"{tuple(buf.shape)}, {buf.dtype}, {buf.device}"
            )
        if not buf.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
        if blocks.flat is not None:  # what is read is the flat buffer (views of the sources, or their copy)
            sources = [blocks.flat.sources]
        else:
            sources = blocks.sources[k] if blocks.sources is not None else blocks.per_source[k]  # type: ignore[index]
        storage = buf.untyped_storage().data_ptr()
        if any(src.untyped_storage().data_ptr() == storage for src in sources):
            raise ValueError(f"{name} shares memory with source_grads; it would be overwritten while being read")
        views.append(buf.view(-1))
    return views


def _aggregate(blocks: _Blocks, target_coef: Tensor, coefs: Tensor, checks: Tensor | None = None,
               out: Tensor | GradDict | None = None):
    """ĝ from the target coefficient (*batch,) and the per-block, per-source coefficients ``coefs`` (L, *batch, N)."""
    if blocks.flat is not None:
        return _aggregate_flat(blocks, target_coef, coefs, checks, out)
    buffers = _out_buffers(out, blocks)
    if blocks.kind == "segments":  # one flat (m,) result (``out`` or a new one); its segments are the blocks' outputs
        sizes = [t.numel() for t in blocks.target]
        ref = blocks.target[0]
        blocks.result = buffers[0] if buffers else torch.empty(sum(sizes), dtype=ref.dtype, device=ref.device)
        buffers = list(blocks.result.split(sizes))
    buffers = buffers or [None] * len(coefs)
    if blocks.per_source is not None:
        # one host transfer for every coefficient of every block
        all_coefs = coefs.tolist()  # (L, N)
        outs = [_combine(blocks, k, target_coef, coefs[k], all_coefs[k], buffers[k]) for k in range(len(coefs))]
    else:
        outs = [_combine(blocks, k, target_coef, coefs[k], out=buffers[k]) for k in range(len(coefs))]
    result = _finish(blocks, outs, checks)
    return result if out is None else out


def _aggregate_flat(blocks: _Blocks, target_coef: Tensor | None, coefs: Tensor | None, checks: Tensor | None,
                    out: Tensor | GradDict | None,
                    projection: tuple[Tensor, str, bool, Reduction | None] | None = None):
    """Dict or segments input on the segmented backend: one combination over the flat buffers. The result is one
    flat (m,) tensor (segments), or per-key views of it (dicts; written into ``out``: directly when its tensors lie
    back to back, else copied). With ``projection`` = (params, "exact" | "cosine", filter_negative, the reduction
    :func:`_fused` launched early, or None) the coefficients are formed in the Triton kernels instead
    (``LAYERWISE_COEFFICIENTS = "kernel"``; ``target_coef``, ``coefs`` and ``checks`` are then None)."""
    flat = blocks.flat
    buffers = _out_buffers(out, blocks)
    target = flat.target
    if blocks.kind != "dict" and buffers is not None:  # one flat view of out itself (checked contiguous)
        laid_out = buffers
    else:
        laid_out = _laid_out([buffers]) if buffers is not None else None
    result = laid_out[0] if laid_out is not None else torch.empty_like(target)
    if projection is None:
        sums = layerwise_combine(flat.sources, target, target_coef, coefs.T, flat.lengths, out=result)
        check = lambda: _check_finite(blocks, sums, [result], checks)  # noqa: E731
    else:
        params, mode, filter_negative, reduction = projection
        flag, kernel_checks = layerwise_project(flat.sources, target, flat.lengths, params, result, projection=mode,
                                                filter_negative=filter_negative, reduction=reduction)
        check = lambda: _check_flag(blocks, flag, [result], kernel_checks)  # noqa: E731
    if blocks.kind in ("segments", "tensor", "sequence"):  # one flat result: (m,), or the sources' shape (sequence)
        check()
        if out is not None:
            return out
        return result.view(blocks.target_shape) if blocks.kind == "sequence" else result
    views = list(torch.split(result, list(flat.lengths)))
    if buffers is not None and laid_out is None:  # out's tensors lie apart: copy the result into them
        torch._foreach_copy_(buffers, views)
        views = buffers
    check()
    if out is not None:
        return out
    return {k: v.view(shape) for k, v, shape in zip(blocks.keys, views, blocks.shapes)}  # type: ignore[arg-type]


def _python_params_host(beta: Any, weights: Any, alignment: Any, blocks: _Blocks) -> Tensor | None:
    """:func:`_project_fused`'s (2N + 1,) vector [w_i β_i, scale_i, a = 1 − Σ_i w_i β_i] (docs/theory.md § Rules) as
    a host tensor (pinned where the target is on a GPU) when β, the weights and the alignment (default 1) are Python
    numbers: checked and formed in Python — in double precision, the sums by ``math.fsum``, rounded once to the
    dtype — instead of a dozen tiny torch operators (each some 10 µs of host time on a GPU machine). The torch
    construction rounds at every step, so the two agree to rounding. None where one of them is a tensor (or the
    weights' sum leaves the dtype's range): the caller then checks and forms them with tensors
    (:func:`_tensor_params`)."""
    bv = _checked_python(beta, blocks, "beta", _BETA_BOUNDS, upper=1.0)
    wv = None if bv is None else _checked_python(weights, blocks, "weights", "be non-negative", default=1.0,
                                                 positive_sum=True)
    if wv is None:
        return None
    scale = _checked_python(alignment, blocks, "alignment", "be non-negative", default=1.0)
    ref = blocks.target[0]
    try:
        total = math.fsum(wv)
    except OverflowError:
        return None
    if scale is None or not math.isfinite(_ROUND_TO[ref.dtype](total)):
        return None
    wb = [w / total * b for w, b in zip(wv, bv)]
    return torch.tensor(wb + scale + [1.0 - math.fsum(wb)], dtype=ref.dtype, pin_memory=ref.device.type == "cuda")


def _python_params(beta: Any, weights: Any, alignment: Any, blocks: _Blocks) -> Tensor | None:
    """:func:`_python_params_host`'s vector on the target's device, in one asynchronous copy (None where it is)."""
    host = _python_params_host(beta, weights, alignment, blocks)
    return None if host is None else host.to(blocks.target[0].device, non_blocking=True)


def _tensor_params(blocks: _Blocks, beta: BetaLike, weights: BetaLike | None, alignment: BetaLike | None) -> Tensor:
    """The same (2N + 1,) vector as :func:`_python_params`, checked and formed with torch operators, on the target's
    device: where β, the weights or the alignment is a tensor (or the weights' sum overflows in Python)."""
    n = blocks.n_sources
    b = _checked_per_source(beta, blocks, "beta", _BETA_BOUNDS, upper=1.0)[0]
    w = _check_weights(weights, blocks, move=False)
    scale = _check_alignment(alignment, blocks)
    parts = [b, w, scale]
    if len({x.device for x in parts}) > 1:
        parts = [_to_target_device(x, blocks) for x in parts]
    b, w, scale = parts
    wb = (w * b).expand(blocks.batch_shape + (n,))
    return _to_target_device(torch.cat([wb, scale.expand(n), (1.0 - wb.sum(-1)).reshape(1)]), blocks)


def _project_fused(blocks: _Blocks, beta: BetaLike, weights: BetaLike | None, alignment: BetaLike | None, mode: str,
                   filter_negative: bool, out: Tensor | GradDict | None, path: _KernelPath):
    """Layer-wise FedGP with its coefficients formed in the Triton kernels (``LAYERWISE_COEFFICIENTS = "kernel"``;
    ``path`` from :func:`_fused`, with the reduction if it was launched early). β, the weights and the cosine form's
    alignment (None for the exact form: 1) are checked and packed with a = 1 − Σ_i w_i β_i (docs/theory.md § Rules)
    into one (2N + 1,) vector, copied to the device once: in Python where they are Python numbers
    (:func:`_python_params`), else as tensors where they were given (:func:`_tensor_params`)."""
    params = _python_params(beta, weights, alignment, blocks)
    if params is None:
        params = _tensor_params(blocks, beta, weights, alignment)
    return _aggregate_flat(blocks, None, None, None, out, projection=(params, mode, filter_negative, path.reduction))


# ---------------------------------------------------------------------------------------------
# Public rules
# ---------------------------------------------------------------------------------------------
def target_only(target_grad: TargetGrad) -> TargetGrad:
    """Target only: ĝ = g_T (docs/theory.md § Rules; Δ² = σ²).

    Returns ``target_grad`` unchanged after checking it is finite (a tensor of any shape or a dict).
    """
    if isinstance(target_grad, Mapping):
        for k, v in target_grad.items():
            if not bool(torch.isfinite(_as_float_tensor(v, f"target_grad[{k!r}]")).all()):
                raise ValueError(f"target_grad[{k!r}] contains NaN or inf")
        return target_grad
    t = _as_float_tensor(target_grad, "target_grad")
    if not bool(torch.isfinite(t).all()):
        raise ValueError("target_grad contains NaN or inf")
    return target_grad


def source_only(source_grads: SourceGrads, weights: BetaLike | None = None, *,
                out: Tensor | GradDict | None = None) -> TargetGrad:
    """Source only (FedAvg of the sources): ĝ = Σ_i w_i g_i (docs/theory.md § Rules; Δ² = d²).

    Args:
        source_grads: (N, m) tensor, N tensors of one shape, or N parameter dicts.
        weights: (N,) non-negative per-source weights, default uniform; normalised to sum 1.
        out: optional buffer for the result (see :func:`fedgp`).
    Returns:
        (m,) tensor (the sources' shape for a sequence, a dict for dict input).
    """
    blocks = _normalise(source_grads, None)
    w = _check_weights(weights, blocks)
    zero = torch.zeros(blocks.batch_shape, dtype=w.dtype, device=w.device)
    coef = w.expand((blocks.n_blocks,) + blocks.batch_shape + (blocks.n_sources,))
    return _aggregate(blocks, zero, coef, out=out)


def fedda(source_grads: SourceGrads, target_grad: TargetGrad, beta: BetaLike, weights: BetaLike | None = None, *,
          out: Tensor | GradDict | None = None) -> TargetGrad:
    """FedDA: ĝ = Σ_i w_i [(1 − β_i) g_T + β_i g_i] (docs/theory.md § Rules; FedGP paper Eq. for FedDA).

    With one β this is (1 − β) g_T + β Σ_i w_i g_i. β weights the SOURCE part: β = 0 → g_T,
    β = 1 → the weighted source mean.

    Args:
        source_grads: (N, m) tensor, N tensors of one shape, or N parameter dicts.
        target_grad: (m,) tensor (or the matching shape / dict).
        beta: float in [0, 1] or (N,) per-source values.
        weights: (N,) non-negative per-source weights, default uniform; normalised to sum 1.
        out: optional buffer for the result (see :func:`fedgp`).
    """
    blocks = _normalise(source_grads, target_grad)
    b = _check_beta(beta, blocks)
    w = _check_weights(weights, blocks)
    wb = (w * b).expand(blocks.batch_shape + (blocks.n_sources,))
    target_coef = 1.0 - wb.sum(-1)
    return _aggregate(blocks, target_coef, wb.expand((blocks.n_blocks,) + wb.shape), out=out)


def _projection_coefs(blocks: _Blocks, wb: Tensor, mode: str, scale: Tensor | None,
                      filter_negative: bool = True) -> tuple[Tensor, Tensor]:
    """Per-block coefficients c_i = w_i β_i · factor_i (L, *batch, N) of FedGP (exact) or its cosine variant.
    ``filter_negative=False`` keeps negative projections (the "FedGP w/o filter" ablation, FedGP paper Table 4)."""
    dots, norms2, tnorm = _reductions(blocks, with_target_norm=mode != "exact")
    if mode == "exact":
        # Proj₊(g_T | g_i) = max(⟨g_T, g_i⟩, 0) g_i / ‖g_i‖²; a zero source contributes 0 (docs/theory.md § Rules).
        denom = norms2
    else:
        # Papers' implementation (FedGP paper App. B.2, Eq. B.2; healthcare paper Eq. 4-6): per-layer
        # cosine with threshold 0, times a magnitude-alignment factor a_i instead of ‖g_T‖/‖g_i‖.
        denom = norms2.sqrt() * tnorm
    # where the denominator is 0 (a zero source, or ‖g_T‖ = 0) the factor is 0; the division's inf/NaN there is not
    # selected, and where it is selected it divides by denom itself, so the bits are those of dividing by a safe copy
    factor = torch.where(denom > 0, (dots.clamp_min(0) if filter_negative else dots) / denom, 0.0)
    if scale is not None:
        factor = factor * scale
    return wb * factor, torch.stack([dots, norms2])


def fedgp(
    source_grads: SourceGrads,
    target_grad: TargetGrad,
    beta: BetaLike,
    weights: BetaLike | None = None,
    *,
    out: Tensor | GradDict | None = None,
    segments: Sequence[int] | None = None,
) -> TargetGrad:
    """FedGP (gradient projection): ĝ = Σ_i w_i [(1 − β_i) g_T + β_i Proj₊(g_T | g_i)].

    Proj₊(g_T | g_i) = max(⟨g_T, g_i⟩, 0) g_i / ‖g_i‖² is the exact positive projection of the target
    gradient on the source direction (docs/theory.md § Rules; FedGP paper Definition 3.1; its Delta error:
    Theorem 4.6 and App. A.3).
    A zero source vector contributes nothing (its projection is defined as 0, no NaN). For dict input
    the projection is applied per tensor (layer-wise), the flat form is what the theory analyses.
    β weights the SOURCE (projected) part: β = 0 → g_T.

    Args:
        source_grads: (N, m) tensor ((*batch, N, m) batched), N tensors of one shape, or N dicts.
        target_grad: (m,) tensor ((*batch, m)), the matching shape, or dict.
        beta: float in [0, 1] or (N,) per-source values.
        weights: (N,) non-negative per-source weights, default uniform; normalised to sum 1.
        out: optional buffer that receives the result in place (same form, shape, dtype and device as the
            result, contiguous, sharing no memory with a source; it may be the target gradient itself).
            Reusing one buffer across rounds avoids allocating an m-sized result per call.
        segments: (L,) lengths of the parameter tensors laid out back to back in each row of a (N, m)
            ``source_grads`` (and in the (m,) ``target_grad``), summing to m: the layer-wise rule, as for dicts of
            those tensors, on the flat buffers; the result is (m,).
    """
    return _fedgp_exact(source_grads, target_grad, beta, weights, out, segments, filter_negative=True)


def _fedgp_exact(source_grads: SourceGrads, target_grad: TargetGrad, beta: BetaLike, weights: BetaLike | None,
                 out: Tensor | GradDict | None, segments: Sequence[int] | None, *,
                 filter_negative: bool) -> TargetGrad:
    """Shared body of :func:`fedgp` and :func:`fedgp_nofilter` (exact projection, with or without the filter)."""
    blocks = _normalise(source_grads, target_grad, segments)
    fused = _fused(blocks)
    if fused is not None:
        return _project_fused(blocks, beta, weights, None, "exact", filter_negative, out, fused)
    b = _check_beta(beta, blocks)
    w = _check_weights(weights, blocks)
    wb = (w * b).expand(blocks.batch_shape + (blocks.n_sources,))
    coefs, checks = _projection_coefs(blocks, wb, "exact", None, filter_negative=filter_negative)
    return _aggregate(blocks, 1.0 - wb.sum(-1), coefs, checks, out=out)


def fedgp_nofilter(
    source_grads: SourceGrads,
    target_grad: TargetGrad,
    beta: BetaLike,
    weights: BetaLike | None = None,
    *,
    out: Tensor | GradDict | None = None,
    segments: Sequence[int] | None = None,
) -> TargetGrad:
    """FedGP without the filter (the ablation of FedGP paper Table 4): ĝ = Σ_i w_i [(1 − β_i) g_T + β_i
    ⟨g_T, g_i⟩ g_i / ‖g_i‖²], i.e. the signed projection, so a source pointing against the target pulls
    the update along its own direction with a negative coefficient. Same forms and arguments as :func:`fedgp`."""
    return _fedgp_exact(source_grads, target_grad, beta, weights, out, segments, filter_negative=False)


def magnitude_alignment(
    lr_target: float,
    lr_source: float,
    n_target: int,
    batch_size_target: int,
    n_sources: Sequence[int] | int,
    batch_size_source: int,
    local_epochs_source: int = 1,
) -> list[float]:
    """Magnitude-alignment factors a_i of the papers' implementation (FedGP paper App. B.2, Eq. B.2).

    a_i = (lr_T / lr_S) · (n_T / bs_T) / (n_i / bs_S) · (1 / r_S): rescales a source model update
    (lr_S, n_i/bs_S steps per epoch, r_S local epochs) to the magnitude of the target's update.
    Returns one factor per source.
    """
    ns = [n_sources] if isinstance(n_sources, int) else list(n_sources)
    for name, v in [("lr_target", lr_target), ("lr_source", lr_source), ("n_target", n_target),
                    ("batch_size_target", batch_size_target), ("batch_size_source", batch_size_source),
                    ("local_epochs_source", local_epochs_source)] + [(f"n_sources[{i}]", v) for i, v in enumerate(ns)]:
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be a positive finite number, got {v!r}")
    return [
        (lr_target / lr_source) * (n_target / batch_size_target) / (n_i / batch_size_source) / local_epochs_source
        for n_i in ns
    ]


def fedgp_cosine(
    source_updates: SourceGrads,
    target_update: TargetGrad,
    beta: BetaLike,
    weights: BetaLike | None = None,
    alignment: BetaLike | None = None,
    *,
    out: Tensor | GradDict | None = None,
    segments: Sequence[int] | None = None,
    filter_negative: bool = True,
) -> TargetGrad:
    """The papers' implementation of FedGP on model updates: cosine filter with magnitude alignment.

    ĝ = Σ_i w_i [(1 − β_i) G_T + β_i a_i max(cos(G_T, G_i), 0) G_i], per tensor for dict input
    (FedGP paper App. B.2 Eq. B.2; auto-weighted paper App. C; healthcare paper Eq. 4-6). It differs
    from :func:`fedgp` by using the cosine times the alignment factor a_i (see
    :func:`magnitude_alignment`) in place of the exact projection length ⟨G_T, G_i⟩/‖G_i‖². Note: the
    papers' appendix writes h_T += (1 − β) P_GP + β G_T (β on the target); this library keeps β on the
    source part everywhere, so their β corresponds to 1 − β here.

    ``filter_negative=False`` is the filter's ablation in this rule (FedGP paper Table 4, "w/o filter";
    ``docs/theory.md`` § Rules): the signed cosine cos(G_T, G_i) replaces max(cos, 0), so a layer whose source
    update points against the target's enters with a negative coefficient. It is the papers' code without its
    test ``cos > 0``; alignment and layers stay as they are, so the filter is the only change.

    Args:
        source_updates: (N, m) tensor, N tensors, or N parameter dicts of model updates Δθ.
        target_update: the target's update in the matching form.
        beta: float in [0, 1] or (N,) per-source values (weights the source part).
        weights: (N,) per-source weights (the papers use n_i / Σ n_i), default uniform.
        alignment: (N,) magnitude factors a_i ≥ 0, default 1.
        out: optional buffer for the result (see :func:`fedgp`).
        segments: (L,) parameter-tensor lengths of a flat (N, m) input: the per-tensor rule on flat buffers
            (see :func:`fedgp`).
    """
    if not isinstance(filter_negative, bool):
        raise ValueError(f"filter_negative must be True or False, got {filter_negative!r}")
    blocks = _normalise(source_updates, target_update, segments)
    fused = _fused(blocks)
    if fused is not None:
        return _project_fused(blocks, beta, weights, alignment, "cosine", filter_negative, out, fused)
    b = _check_beta(beta, blocks)
    w = _check_weights(weights, blocks)
    a = _to_target_device(_check_alignment(alignment, blocks), blocks)
    wb = (w * b).expand(blocks.batch_shape + (blocks.n_sources,))
    coefs, checks = _projection_coefs(blocks, wb, "cosine", a, filter_negative=filter_negative)
    return _aggregate(blocks, 1.0 - wb.sum(-1), coefs, checks, out=out)


# ---------------------------------------------------------------------------------------------
# Auto-weighted rules (auto-weighted FDA paper § 4.2; docs/theory.md § Optimal weights)
# ---------------------------------------------------------------------------------------------
def _flatten_form(x: Tensor | GradDict, keys: list[str] | None) -> Tensor:
    if isinstance(x, Mapping):
        return torch.cat([x[k].reshape(-1) for k in keys])  # type: ignore[union-attr]
    return x.reshape(-1)


def _parts_and_mean(source_grads: SourceGrads, target_part_grads: Any) -> tuple[Tensor, Tensor, TargetGrad]:
    """Flat (B, m) parts, flat sources (N, m) for the estimators, and the target gradient (mean of parts)."""
    if isinstance(target_part_grads, Tensor):
        parts = _as_float_tensor(target_part_grads, "target_part_grads")
        if parts.ndim < 2:
            raise ValueError(f"target_part_grads must have shape (B, m), got {tuple(parts.shape)}")
        target = parts.mean(dim=-2)
    else:
        if isinstance(target_part_grads, (str, bytes)) or not isinstance(target_part_grads, Sequence):
            raise ValueError("target_part_grads must be a (B, m) tensor or a sequence of B tensors or dicts")
        if len(target_part_grads) < 2:
            raise ValueError(f"target_part_grads needs B >= 2 parts, got {len(target_part_grads)}")
        if all(isinstance(p, Mapping) for p in target_part_grads):
            keys = list(target_part_grads[0].keys())
            for j, p in enumerate(target_part_grads):
                _check_keys(p, set(keys), f"target_part_grads[{j}] keys differ from target_part_grads[0]")
            target = {k: torch.stack([p[k] for p in target_part_grads]).mean(0) for k in keys}
            parts = None  # flattened below, in the sources' key order (the estimators compare coordinates)
        else:
            parts = torch.stack([_as_float_tensor(p, f"target_part_grads[{j}]").reshape(-1) for j, p in enumerate(target_part_grads)])
            target = torch.stack(list(target_part_grads)).mean(0)
    try:
        blocks = _normalise(source_grads, target)
    except ValueError as exc:
        if "target_grad" not in str(exc):
            raise
        raise ValueError(
            f"target_part_grads do not match source_grads (the mean of the parts is the target gradient): {exc}"
        ) from None
    if blocks.kind == "dict":
        flat_sources = torch.stack([
            torch.cat([blocks.per_source[k][i] for k in range(len(blocks.keys))])  # type: ignore[index]
            for i in range(blocks.n_sources)
        ])
        if parts is None:  # the parts in the same key order as the sources, whatever order their dicts have
            parts = torch.stack([_flatten_form(p, list(blocks.keys)) for p in target_part_grads])
    else:
        flat_sources = blocks.sources[0]  # type: ignore[index]
    return parts, flat_sources, target


def _auto(rule: str, source_grads, target_part_grads, weights, return_beta: bool, fallback: float, out=None,
          segments=None):
    from .estimators import auto_beta  # local import: estimators does not depend on aggregation

    parts, flat_sources, target = _parts_and_mean(source_grads, target_part_grads)
    if parts.shape[-1] != flat_sources.shape[-1]:
        raise ValueError(
            f"target_part_grads have {parts.shape[-1]} parameters per part but the sources have {flat_sources.shape[-1]}"
        )
    beta = auto_beta(parts, flat_sources, rule=rule, fallback=fallback)
    if rule == "fedgp":
        result = fedgp(source_grads, target, beta, weights, out=out, segments=segments)
    else:
        result = fedda(source_grads, target, beta, weights, out=out)
    return (result, beta) if return_beta else result


def fedda_auto(
    source_grads: SourceGrads,
    target_part_grads: Tensor | Sequence[Tensor] | Sequence[GradDict],
    weights: BetaLike | None = None,
    *,
    return_beta: bool = False,
    fallback: float = 0.5,
    out: Tensor | GradDict | None = None,
):
    """Auto-weighted FedDA: FedDA with β_i = σ̂² / (σ̂² + d̂_i²) per source (docs/theory.md § Optimal weights).

    ``target_part_grads``: gradients on B ≥ 2 disjoint equal parts of the target data, a (B, m) tensor
    (or B tensors / B dicts matching the sources' form). The target gradient is their mean. The
    estimates come from :func:`fda_core.core.estimators.auto_beta` on the flattened gradients (clamped; 0/0
    gives ``fallback``). With ``return_beta=True`` returns ``(ĝ, beta)`` with beta of shape (N,).
    """
    return _auto("fedda", source_grads, target_part_grads, weights, return_beta, fallback, out)


def fedgp_auto(
    source_grads: SourceGrads,
    target_part_grads: Tensor | Sequence[Tensor] | Sequence[GradDict],
    weights: BetaLike | None = None,
    *,
    return_beta: bool = False,
    fallback: float = 0.5,
    out: Tensor | GradDict | None = None,
    segments: Sequence[int] | None = None,
):
    """Auto-weighted FedGP: FedGP with β_i = σ̂² / (σ̂² + (τ²d²)^_i) per source (docs/theory.md § Optimal weights).

    Same arguments as :func:`fedda_auto`; ``segments`` (with a flat (N, m) input) makes the projection layer-wise,
    as dict input does (see :func:`fedgp`), while β is estimated on the whole flat gradients either way.
    """
    return _auto("fedgp", source_grads, target_part_grads, weights, return_beta, fallback, out, segments)


# ---------------------------------------------------------------------------------------------
# Registry (DomainBed style: a notebook or papermill parameter names a rule, e.g. rule="fedgp_auto")
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rule:
    """A registered aggregation rule.

    ``fn`` is the plain function; calling the rule calls it. :meth:`apply` is a uniform entry point for
    generic code (Monte-Carlo helpers, the federated loop) that passes everything it has.
    """

    name: str
    fn: Callable[..., Any]
    uses_beta: bool
    uses_target_parts: bool
    description: str

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def apply(
        self,
        source_grads: SourceGrads,
        target_grad: TargetGrad | None = None,
        *,
        beta: BetaLike | None = None,
        weights: BetaLike | None = None,
        target_part_grads: Any = None,
        **options: Any,
    ) -> Any:
        """Call the rule with the arguments it needs and ignore the rest.

        Auto rules need ``target_part_grads``; β-rules need ``beta``; target only needs ``target_grad``.
        """
        if self.uses_target_parts:
            if target_part_grads is None:
                raise ValueError(f"rule {self.name!r} needs target_part_grads (B >= 2 part gradients)")
            return self.fn(source_grads, target_part_grads, weights, **options)
        if self.name == "target_only" or self.fn is target_only:
            if target_grad is None:
                raise ValueError("rule 'target_only' needs target_grad")
            return self.fn(target_grad)
        if self.uses_beta:
            if beta is None:
                raise ValueError(f"rule {self.name!r} needs beta in [0, 1]")
            if target_grad is None:
                raise ValueError(f"rule {self.name!r} needs target_grad")
            return self.fn(source_grads, target_grad, beta, weights, **options)
        return self.fn(source_grads, weights, **options)


RULES: dict[str, Rule] = {}


def register_rule(name: str, fn: Callable[..., Any], *, uses_beta: bool, uses_target_parts: bool = False,
                  description: str = "") -> Rule:
    """Register ``fn`` under ``name`` (lower-case identifier); returns the :class:`Rule`."""
    if not name.isidentifier() or name != name.lower():
        raise ValueError(f"rule name must be a lower-case identifier, got {name!r}")
    rule = Rule(name, fn, uses_beta, uses_target_parts, description or ((fn.__doc__ or "").strip().splitlines() or [name])[0])
    RULES[name] = rule
    return rule


register_rule("source_only", source_only, uses_beta=False)
register_rule("target_only", target_only, uses_beta=False)
register_rule("fedda", fedda, uses_beta=True)
register_rule("fedgp", fedgp, uses_beta=True)
register_rule("fedgp_cosine", fedgp_cosine, uses_beta=True)
register_rule("fedgp_nofilter", fedgp_nofilter, uses_beta=True)
register_rule("fedda_auto", fedda_auto, uses_beta=False, uses_target_parts=True)
register_rule("fedgp_auto", fedgp_auto, uses_beta=False, uses_target_parts=True)


def get_rule(name: str) -> Rule:
    """The registered rule called ``name`` (see :func:`list_rules`)."""
    if not isinstance(name, str) or name not in RULES:
        raise ValueError(f"unknown rule {name!r}; rule must be one of {sorted(RULES)}")
    return RULES[name]


def list_rules() -> list[str]:
    """Names of the registered rules."""
    return sorted(RULES)
