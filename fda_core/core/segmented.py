"""Per-segment (layer-wise) dot products, squared norms and combinations on one flat buffer, in a few kernels.

A model's parameters (or an update of them) laid out back to back in one flat vector of length m form L
segments (one per parameter tensor) with lengths n_1, …, n_L. Layer-wise FedGP needs, for N sources
S (N, m) and the target t (m,), the L·N numbers ⟨t_k, s_ik⟩ and ‖s_ik‖² (k a segment) and then the
combination  out_k = a·t_k + Σ_i C[i, k]·s_ik  (docs/theory.md § Layer-wise application). Done per tensor,
that is 2·N·L reductions and N·L axpy's: thousands of tiny kernels on a GPU, where a launch (~5 µs) costs
more than reading a small tensor. Here the same arithmetic takes a fixed handful of kernels, whatever L:

* the flat range [0, K·c) is cut into K chunks of ``chunk`` elements (c), whatever the segments;
* per-chunk partial dots and squared norms come from two batched reductions over the (N, K, c) view
  (each reads S once);
* a chunk lying inside one segment (an *interior* chunk) adds its partial to that segment; the chunks
  that straddle a boundary, and the tail [K·c, m), are gathered element by element (a few c·L elements,
  a small fraction of m for real models) and summed per segment exactly;
* the per-segment sums are one matrix product with a fixed 0/1 chunk-to-segment matrix, so the result
  is deterministic (no atomic adds) on every device;
* the combination is one batched matrix product over the chunk view, after which the gathered elements
  are recomputed with their own segment's coefficients.

The summation order differs from a per-tensor loop, so results agree with it to float rounding, not bit
for bit. The layout (a :class:`SegmentPlan`) depends only on the segment lengths, the chunk size and
the device, and is cached.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from .segmented_triton import Reduction

__all__ = ["SegmentPlan", "segment_plan", "segment_dots", "segment_sqnorms", "segment_combine",
           "layerwise_reductions", "layerwise_combine", "projection_kernels", "layerwise_start",
           "layerwise_project", "DEFAULT_CHUNK"]

#: chunk length c: long enough that a chunk's reduction is not launch-bound, short enough that the
#: gathered boundary elements (about c per segment boundary) stay a small fraction of m
DEFAULT_CHUNK = 1024


@dataclass(frozen=True)
class SegmentPlan:
    """Where the segments of a flat vector lie relative to its chunks.

    Attributes:
        lengths: (L,) segment lengths n_k (all ≥ 1); m = Σ n_k.
        chunk: chunk length c; K = m // c full chunks cover [0, K·c).
        chunk_to_segment: (K, L) 0/1 matrix, row j = one-hot of chunk j's segment, all-zero for a
            straddling chunk (its elements are gathered instead).
        gathered: (E,) positions of the gathered elements (straddling chunks and the tail), ascending.
        gathered_to_segment: (E, L) 0/1 matrix, one-hot of each gathered element's segment.
        gathered_segment: (E,) segment index of each gathered element.
        chunk_segment: (K,) segment of each chunk's first element (used by the combination).
    """

    lengths: tuple[int, ...]
    chunk: int
    n_chunks: int
    chunk_to_segment: Tensor
    chunk_segment: Tensor
    gathered: Tensor
    gathered_segment: Tensor
    gathered_to_segment: Tensor

    @property
    def m(self) -> int:
        return sum(self.lengths)

    @property
    def n_segments(self) -> int:
        return len(self.lengths)


def segment_plan(lengths: Sequence[int], device: torch.device | str, dtype: torch.dtype = torch.float32,
                 chunk: int = DEFAULT_CHUNK) -> SegmentPlan:
    """The (cached) :class:`SegmentPlan` of segments ``lengths`` on ``device``; matrices in ``dtype``."""
    lengths = tuple(int(n) for n in lengths)
    if not lengths or any(n < 1 for n in lengths):
        raise ValueError(f"lengths must be one or more positive segment lengths, got {lengths[:8]}")
    if not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be a positive integer, got {chunk!r}")
    return _plan(lengths, torch.device(device), dtype, chunk)


@lru_cache(maxsize=32)
def _plan(lengths: tuple[int, ...], device: torch.device, dtype: torch.dtype, chunk: int) -> SegmentPlan:
    n_seg, m = len(lengths), sum(lengths)
    n_chunks = m // chunk
    ends = torch.tensor(lengths, dtype=torch.int64).cumsum(0)  # segment k covers [ends[k-1], ends[k])
    first = torch.arange(n_chunks, dtype=torch.int64) * chunk
    seg_first = torch.searchsorted(ends, first, right=True)  # segment of a chunk's first element
    seg_last = torch.searchsorted(ends, first + chunk - 1, right=True)
    interior = seg_first == seg_last
    chunk_to_segment = torch.zeros(n_chunks, n_seg, dtype=dtype)
    chunk_to_segment[interior.nonzero().squeeze(1), seg_first[interior]] = 1
    straddling = (~interior).nonzero().squeeze(1)
    positions = (straddling.unsqueeze(1) * chunk + torch.arange(chunk)).reshape(-1)
    gathered = torch.cat([positions, torch.arange(n_chunks * chunk, m, dtype=torch.int64)])
    gathered_segment = torch.searchsorted(ends, gathered, right=True)
    gathered_to_segment = torch.zeros(gathered.numel(), n_seg, dtype=dtype)
    gathered_to_segment[torch.arange(gathered.numel()), gathered_segment] = 1
    return SegmentPlan(lengths, chunk, n_chunks, chunk_to_segment.to(device), seg_first.to(device),
                       gathered.to(device), gathered_segment.to(device), gathered_to_segment.to(device))


def _chunks(x: Tensor, plan: SegmentPlan) -> Tensor:
    """(…, m) → (…, K, c) view of the chunked range [0, K·c) (no copy)."""
    return x[..., :plan.n_chunks * plan.chunk].unflatten(-1, (plan.n_chunks, plan.chunk))


def _check(sources: Tensor, plan: SegmentPlan, name: str = "sources") -> None:
    if sources.shape[-1] != plan.m:
        raise ValueError(f"{name} has {sources.shape[-1]} elements per row but the segments sum to m = {plan.m}")


def segment_dots(sources: Tensor, target: Tensor, plan: SegmentPlan) -> Tensor:
    """⟨t_k, s_ik⟩ for every source i and segment k: (N, L), from sources (N, m) and target (m,)."""
    _check(sources, plan)
    _check(target, plan, "target")
    out = sources.new_zeros(sources.shape[0], plan.n_segments)
    if plan.n_chunks:
        # (K, N, c) @ (K, c, 1): one batched product reads S once; partials (N, K)
        partial = torch.bmm(_chunks(sources, plan).transpose(0, 1), _chunks(target, plan).unsqueeze(-1)).squeeze(-1).T
        out = torch.mm(partial, plan.chunk_to_segment.to(partial.dtype))
    if plan.gathered.numel():
        g = sources.index_select(-1, plan.gathered) * target.index_select(0, plan.gathered)
        out = torch.addmm(out, g, plan.gathered_to_segment.to(g.dtype))
    return out


def segment_sqnorms(sources: Tensor, plan: SegmentPlan) -> Tensor:
    """‖s_ik‖² for every row i of ``sources`` (N, m) (or one vector (m,)) and segment k: (N, L) (or (L,))."""
    _check(sources, plan)
    rows = sources.unsqueeze(0) if sources.ndim == 1 else sources
    out = rows.new_zeros(rows.shape[0], plan.n_segments)
    if plan.n_chunks:
        partial = torch.linalg.vector_norm(_chunks(rows, plan), dim=-1).square()  # (N, K), one reduction
        out = torch.mm(partial, plan.chunk_to_segment.to(partial.dtype))
    if plan.gathered.numel():
        g = rows.index_select(-1, plan.gathered)
        out = torch.addmm(out, g * g, plan.gathered_to_segment.to(g.dtype))
    return out.squeeze(0) if sources.ndim == 1 else out


def segment_combine(sources: Tensor, target: Tensor, target_coef: Tensor | float, coefs: Tensor, plan: SegmentPlan,
                    out: Tensor | None = None) -> Tensor:
    """a·t + Σ_i C[i, seg(j)]·s_i[j] for every position j: (m,), from sources (N, m), target (m,), the
    target coefficient a (a number or a 0-d tensor) and per-source, per-segment coefficients C (N, L).
    Written into ``out`` (m,) when given (it may be ``target`` itself, not a row of ``sources``)."""
    _check(sources, plan)
    _check(target, plan, "target")
    if coefs.shape != (sources.shape[0], plan.n_segments):
        raise ValueError(f"coefs must have shape (N, L) = {(sources.shape[0], plan.n_segments)}, got {tuple(coefs.shape)}")
    coefs = coefs.to(sources.dtype)
    a = torch.as_tensor(target_coef, dtype=sources.dtype, device=sources.device)
    gathered = None
    if plan.gathered.numel():  # read before ``out`` (possibly the target) is overwritten
        gs = sources.index_select(-1, plan.gathered)  # (N, E)
        gathered = (coefs.index_select(1, plan.gathered_segment) * gs).sum(0).addcmul_(
            target.index_select(0, plan.gathered), a)
    if out is None:
        out = torch.empty_like(target)
    if plan.n_chunks:
        per_chunk = coefs.index_select(1, plan.chunk_segment).T.unsqueeze(1)  # (K, 1, N)
        body = _chunks(out, plan).unsqueeze(1)  # (K, 1, c) view of out
        torch.mul(_chunks(target, plan).unsqueeze(1), a, out=body)
        body.baddbmm_(per_chunk, _chunks(sources, plan).transpose(0, 1))  # += C_chunk · S_chunk
    if gathered is not None:
        out.index_copy_(0, plan.gathered, gathered)
    return out


def _triton(sources: Tensor):
    """The Triton kernels' module when they can run on ``sources`` (CUDA, Triton importable, float32/64), else None."""
    if sources.device.type != "cuda" or sources.dtype not in (torch.float32, torch.float64):
        return None
    from . import segmented_triton

    return segmented_triton if segmented_triton.available(sources.device) else None


def layerwise_reductions(sources: Tensor, target: Tensor, lengths: Sequence[int]) -> tuple[Tensor, Tensor, Tensor]:
    """(⟨t_k, s_ik⟩ (N, L), ‖s_ik‖² (N, L), ‖t_k‖² (L,)) for sources (N, m), target (m,) and segment ``lengths``:
    the Triton kernels on a GPU that has them (one pass over S), else the chunked torch functions above."""
    kernels = _triton(sources)
    if kernels is not None and sources.stride(-1) == 1 and target.stride(-1) == 1:
        return kernels.reduce(sources, target, kernels.table_for(lengths, sources))
    plan = segment_plan(lengths, sources.device, sources.dtype)
    return segment_dots(sources, target, plan), segment_sqnorms(sources, plan), segment_sqnorms(target, plan)


def layerwise_combine(sources: Tensor, target: Tensor, target_coef: Tensor | float, coefs: Tensor,
                      lengths: Sequence[int], out: Tensor) -> Tensor:
    """Write a·t + Σ_i C[i, seg(j)]·s_i[j] into ``out`` (m,) (see :func:`segment_combine`); returns sums of parts of
    ``out`` (a 1-D tensor) whose finiteness says whether ``out`` is finite."""
    kernels = _triton(sources)
    if kernels is not None and sources.stride(-1) == 1 and target.stride(-1) == 1 and out.is_contiguous():
        a = torch.as_tensor(target_coef, dtype=sources.dtype, device=sources.device)
        return kernels.combine(sources, target, a, coefs, kernels.table_for(lengths, sources), out)
    segment_combine(sources, target, target_coef, coefs, segment_plan(lengths, sources.device, sources.dtype), out=out)
    return out.sum().reshape(1)


def projection_kernels(sources: Tensor, target: Tensor) -> bool:
    """True when :func:`layerwise_project` can run on sources (N, m) and target (m,): the Triton kernels are there
    (a CUDA device, Triton importable, float32/64) and both have rows of unit stride."""
    return _projection_module(sources, target) is not None


def _projection_module(sources: Tensor, target: Tensor):
    kernels = _triton(sources)
    if kernels is None or sources.stride(-1) != 1 or target.stride(-1) != 1 or target.dtype != sources.dtype:
        return None
    return kernels


def layerwise_start(sources: Tensor, target: Tensor, lengths: Sequence[int]) -> Reduction | None:
    """Launches the first kernel of :func:`layerwise_project` (the reduction over sources (N, m) and target (m,),
    segment ``lengths``) and returns at once, so that the caller's host work before :func:`layerwise_project` (given
    the result as ``reduction``) overlaps it on the GPU. None, launching nothing, where :func:`projection_kernels`
    does not hold."""
    kernels = _projection_module(sources, target)
    return None if kernels is None else kernels.start_projection(sources, target, kernels.table_for(lengths, sources))


def _kernels_for_projection(sources: Tensor, target: Tensor, out: Tensor):
    kernels = _projection_module(sources, target)
    if kernels is None or not out.is_contiguous():
        raise ValueError("layerwise_project needs the Triton kernels (a CUDA device with Triton, float32/64), rows of "
                         "unit stride and a contiguous out; check projection_kernels(sources, target) first")
    return kernels


def layerwise_project(sources: Tensor, target: Tensor, lengths: Sequence[int], params: Tensor, out: Tensor, *,
                      projection: str, filter_negative: bool,
                      reduction: Reduction | None = None) -> tuple[Tensor, Tensor]:
    """Layer-wise FedGP's reductions, coefficients and combination in three Triton kernels, written into ``out`` (m,)
    (contiguous; it may be ``target``): see :func:`fda_core.core.segmented_triton.project` for ``params`` (2N + 1,)
    = [w_i β_i, scale_i, a] and the returned (finiteness flag (1,), dot products and squared norms (2, N, L)).
    Only where :func:`projection_kernels` holds; elsewhere the rules use :func:`layerwise_reductions` and
    :func:`layerwise_combine` with the coefficients computed by torch operators. ``reduction``: the first kernel,
    already launched by :func:`layerwise_start` on the same arguments."""
    kernels = _kernels_for_projection(sources, target, out)
    table = kernels.table_for(lengths, sources) if reduction is None else reduction.table
    return kernels.project(sources, target, params, table, out, projection=projection,
                           filter_negative=filter_negative, reduction=reduction)
