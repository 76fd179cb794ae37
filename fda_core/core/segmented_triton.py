"""Triton kernels for :mod:`fda_core.core.segmented` on a GPU: layer-wise reductions and combination in two passes.

Same arithmetic as the pure-torch functions of :mod:`fda_core.core.segmented` (docs/theory.md § Layer-wise
application), with the work cut differently: every segment (parameter tensor) is split into its own chunks of
``BLOCK`` elements (the last one of a segment shorter), so no chunk straddles a boundary and nothing is gathered.
One program per chunk:

* ``_reduce``: loads the target's chunk once and, for each source i, writes the chunk's partial ⟨t, s_i⟩ and
  ‖s_i‖² (and ‖t‖² once): one pass over S. The partials are summed per segment by one product with a fixed
  0/1 matrix (deterministic, no atomic adds).
* ``_combine``: out = a·t + Σ_i C[i, k]·s_i on its chunk (k the chunk's segment): one more pass over S, one write
  of out, and the chunk's sum of out (the caller's finiteness check).

Between the two, the rules form the coefficients C (N, L) from the per-segment sums with a few torch operators
(``fda_core.core.aggregation.LAYERWISE_COEFFICIENTS = "torch"``) — or, by default, :func:`project` does the whole
rule in three kernels (``"kernel"``): ``_coef_kernel``, one program per segment, sums the segment's chunk partials
(its chunks are consecutive, ``ChunkTable.segment_chunks``) and forms C and a finiteness flag, and ``_combine``
adds 0 · each chunk's sum to that flag instead of writing the sums. Every term added to the flag is 0 or NaN, so the
atomic adds give the same flag in any order: one host read per call, nothing else on the host between the kernels.

Two forms of each kernel (:class:`KernelConfig`), same arithmetic: ``loop`` visits the sources one after another
(one chunk of one source in flight per program, and for ``_reduce`` a block-wide reduction after each), ``tile``
loads the chunk of every source at once as one (N_pad, BLOCK) tile (N_pad the next power of two ≥ N) and reduces
it along one axis, so all N loads are in flight together; its BLOCK shrinks as N grows to keep the tile's registers
bounded. Which is faster is a property of the device, measured by ``benchmarks/segmented_kernels.py``: on an H200
(2026-11) the loop forms of 1,024–4,096 elements were within 7% of each other and at 1.5–1.7× the copy floor for
N = 10 sources, and the tile form's reduction was 1.3–1.8× slower there (its (16, 512) tile spills registers).

Used only on CUDA devices when Triton is importable (:func:`available`); the CPU (and any device without Triton)
uses the pure-torch functions. Float32 and float64 inputs; partial sums accumulate in the input's dtype. Without a
GPU the kernels are still checked: Triton's CPU interpreter runs them, and :func:`compile_kernels` compiles every
variant for a Hopper GPU (``tests/triton_checks.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import torch
from torch import Tensor

try:  # Triton ships with CUDA builds of torch; the CPU wheel has none
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised where Triton is missing
    triton = None

__all__ = ["available", "ChunkTable", "chunk_table", "reduce", "combine", "project", "Reduction",
           "start_projection", "BLOCK", "KernelConfig",
           "default_config", "table_for", "configured", "compile_kernels", "compile_variant", "kernel_variants",
           "KernelVariant", "FORMS", "PROJECTIONS"]

#: elements per program of the ``loop`` form: 2,048 float32 = 8 KB per source and program, 16-byte loads with 8 warps
BLOCK = 2048
#: the kernels' forms (see the module docstring)
FORMS = ("loop", "tile")


@dataclass(frozen=True)
class KernelConfig:
    """How the kernels cut the work: ``form`` (``loop`` or ``tile``), ``block`` (elements per program; for ``tile``
    the tile's elements, N_pad·BLOCK, so that BLOCK = block // N_pad) and ``num_warps``."""

    form: str = "loop"
    block: int = BLOCK
    num_warps: int = 8

    def __post_init__(self) -> None:
        if self.form not in FORMS:
            raise ValueError(f"form must be one of {FORMS}, got {self.form!r}")
        if not (isinstance(self.block, int) and self.block >= 16 and self.block & (self.block - 1) == 0):
            raise ValueError(f"block must be a power of two >= 16, got {self.block!r}")
        if self.num_warps not in (1, 2, 4, 8, 16, 32):
            raise ValueError(f"num_warps must be a power of two from 1 to 32, got {self.num_warps!r}")

    @classmethod
    def parse(cls, text: str) -> KernelConfig:
        """``form:block:num_warps`` (e.g. ``tile:8192:8``, the form :attr:`label` writes) as a config; a ValueError
        naming the problem otherwise."""
        parts = str(text).split(":")
        if len(parts) != 3:
            raise ValueError(f"a kernel configuration is form:block:num_warps (e.g. tile:8192:8), got {text!r}")
        try:
            block, warps = int(parts[1]), int(parts[2])
        except ValueError:
            raise ValueError(f"kernel configuration {text!r}: block and num_warps must be integers") from None
        return cls(parts[0], block, warps)

    @property
    def label(self) -> str:
        """``form:block:num_warps``, what :meth:`parse` reads."""
        return f"{self.form}:{self.block}:{self.num_warps}"

    def chunk(self, n_sources: int) -> int:
        """Elements per program (the chunk length) for ``n_sources`` sources."""
        if self.form == "loop":
            return self.block
        return max(16, self.block // _pad(n_sources))


#: the configuration the library uses (``loop``, 2,048 elements, 8 warps: the form its tests and the H100 runs used)
_DEFAULT = KernelConfig()


def default_config() -> KernelConfig:
    """The :class:`KernelConfig` that :func:`reduce` and :func:`combine` use when given none."""
    return _DEFAULT


@contextmanager
def configured(config: KernelConfig) -> Iterator[KernelConfig]:
    """Use ``config`` as the default inside a ``with`` block (benchmarks compare the forms this way)."""
    global _DEFAULT
    if not isinstance(config, KernelConfig):
        raise ValueError(f"config must be a KernelConfig, got {type(config).__name__}")
    before, _DEFAULT = _DEFAULT, config
    try:
        yield config
    finally:
        _DEFAULT = before


def _pad(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def available(device: torch.device | str) -> bool:
    """True when the Triton kernels can run on ``device`` (a CUDA device and an importable Triton)."""
    return triton is not None and torch.device(device).type == "cuda"


@dataclass(frozen=True)
class ChunkTable:
    """Chunks of at most ``block`` elements that never straddle a segment: start (P,), length (P,), segment (P,) as
    int32 on the device, the (L, P) 0/1 matrix that sums per-chunk partials into per-segment sums, and
    ``segment_chunks`` (L + 1,) int32: segment k's chunks are the consecutive range [segment_chunks[k],
    segment_chunks[k + 1]) (what the coefficient kernel of :func:`project` sums over), at most
    ``max_segment_chunks`` long."""

    block: int
    starts: Tensor
    lengths: Tensor
    segments: Tensor
    chunk_to_segment: Tensor
    segment_chunks: Tensor
    max_segment_chunks: int

    @property
    def n_chunks(self) -> int:
        return self.starts.numel()


def chunk_table(lengths: tuple[int, ...], device: torch.device, dtype: torch.dtype, block: int = BLOCK) -> ChunkTable:
    """Chunks of at most ``block`` elements that never straddle one of the segments ``lengths`` (cached)."""
    if type(lengths) is not tuple:  # the rules pass their checked tuple of ints: no per-segment work per call
        lengths = tuple(int(n) for n in lengths)
    return _table(lengths, torch.device(device), dtype, int(block))


@lru_cache(maxsize=32)
def _table(lengths: tuple[int, ...], device: torch.device, dtype: torch.dtype, block: int) -> ChunkTable:
    starts, lens, segs, firsts = [], [], [], []
    offset = 0
    for k, n in enumerate(lengths):
        firsts.append(len(starts))
        for s in range(0, n, block):
            starts.append(offset + s)
            lens.append(min(block, n - s))
            segs.append(k)
        offset += n
    firsts.append(len(starts))
    seg = torch.tensor(segs, dtype=torch.int64)
    onehot = torch.zeros(len(lengths), len(segs), dtype=dtype)
    onehot[seg, torch.arange(len(segs))] = 1
    as32 = lambda v: torch.tensor(v, dtype=torch.int32, device=device)  # noqa: E731
    return ChunkTable(block, as32(starts), as32(lens), seg.to(torch.int32).to(device), onehot.to(device), as32(firsts),
                      max(b - a for a, b in zip(firsts, firsts[1:])))


if triton is not None:

    @triton.jit
    def _reduce_kernel(S, T, starts, lens, partial, tpartial, stride_s, n_sources: tl.constexpr, BLOCK: tl.constexpr):
        p = tl.program_id(0)
        start = tl.load(starts + p)
        n = tl.load(lens + p)
        offs = tl.arange(0, BLOCK)
        mask = offs < n
        t = tl.load(T + start + offs, mask=mask, other=0.0)
        tl.store(tpartial + p, tl.sum(t * t, axis=0))
        s_ptr = S + start + offs  # pointer arithmetic in 64 bits: rows advance by stride_s
        out = partial + p * 2 * n_sources
        for i in range(n_sources):
            s = tl.load(s_ptr, mask=mask, other=0.0)
            tl.store(out + 2 * i, tl.sum(s * t, axis=0))
            tl.store(out + 2 * i + 1, tl.sum(s * s, axis=0))
            s_ptr += stride_s

    @triton.jit
    def _combine_kernel(S, T, OUT, starts, lens, segs, coefs, target_coef, sums, n_segments, stride_s,
                        n_sources: tl.constexpr, BLOCK: tl.constexpr, FLAG: tl.constexpr = False):
        p = tl.program_id(0)
        start = tl.load(starts + p)
        n = tl.load(lens + p)
        k = tl.load(segs + p)
        offs = tl.arange(0, BLOCK)
        mask = offs < n
        a = tl.load(target_coef)
        acc = tl.load(T + start + offs, mask=mask, other=0.0) * a
        s_ptr = S + start + offs
        for i in range(n_sources):
            c = tl.load(coefs + i * n_segments + k)
            acc += c * tl.load(s_ptr, mask=mask, other=0.0)
            s_ptr += stride_s
        tl.store(OUT + start + offs, acc, mask=mask)
        _chunk_sum(sums, p, acc, FLAG)

    @triton.jit
    def _reduce_tile_kernel(S, T, starts, lens, partial, tpartial, stride_s, n_sources,
                            N_PAD: tl.constexpr, BLOCK: tl.constexpr):
        p = tl.program_id(0)
        start = tl.load(starts + p)
        n = tl.load(lens + p)
        offs = tl.arange(0, BLOCK)
        mask = offs < n
        rows = tl.arange(0, N_PAD)
        row_mask = rows < n_sources
        t = tl.load(T + start + offs, mask=mask, other=0.0)
        s_ptr = S + rows.to(tl.int64)[:, None] * stride_s + (start + offs)[None, :]  # (N_PAD, BLOCK), all in flight
        s = tl.load(s_ptr, mask=row_mask[:, None] & mask[None, :], other=0.0)
        tl.store(tpartial + p, tl.sum(t * t, axis=0))
        out = partial + p * 2 * n_sources + 2 * rows
        tl.store(out, tl.sum(s * t[None, :], axis=1), mask=row_mask)
        tl.store(out + 1, tl.sum(s * s, axis=1), mask=row_mask)

    @triton.jit
    def _combine_tile_kernel(S, T, OUT, starts, lens, segs, coefs, target_coef, sums, n_segments, stride_s,
                             n_sources, N_PAD: tl.constexpr, BLOCK: tl.constexpr, FLAG: tl.constexpr = False):
        p = tl.program_id(0)
        start = tl.load(starts + p)
        n = tl.load(lens + p)
        k = tl.load(segs + p)
        offs = tl.arange(0, BLOCK)
        mask = offs < n
        rows = tl.arange(0, N_PAD)
        row_mask = rows < n_sources
        c = tl.load(coefs + rows * n_segments + k, mask=row_mask, other=0.0)
        s_ptr = S + rows.to(tl.int64)[:, None] * stride_s + (start + offs)[None, :]
        s = tl.load(s_ptr, mask=row_mask[:, None] & mask[None, :], other=0.0)
        acc = tl.load(T + start + offs, mask=mask, other=0.0) * tl.load(target_coef) + tl.sum(c[:, None] * s, axis=0)
        tl.store(OUT + start + offs, acc, mask=mask)
        _chunk_sum(sums, p, acc, FLAG)

    @triton.jit
    def _chunk_sum(sums, p, acc, FLAG: tl.constexpr):
        """Without FLAG: the chunk's sum of out into sums[p]. With FLAG: 0 · that sum added to the one-element
        flag ``sums`` (0 when it is finite, NaN otherwise; every term is 0 or NaN, so the order of the atomic adds
        cannot change the result)."""
        if FLAG:
            tl.atomic_add(sums, tl.sum(acc, axis=0) * 0.0)
        else:
            tl.store(sums + p, tl.sum(acc, axis=0))

    @triton.jit
    def _coef_kernel(partial, tpartial, segment_chunks, rule_values, coefs, checks, flag, n_segments,
                     n_sources: tl.constexpr, N_STEPS: tl.constexpr, COSINE: tl.constexpr, FILTER: tl.constexpr,
                     IEEE_F32: tl.constexpr, CBLOCK: tl.constexpr):
        """One program per segment k: sums its chunks' partials (in chunk order, CBLOCK at a time, in N_STEPS
        steps: enough for the longest segment; the trip count is a constant, not the loaded chunk range, which
        Triton's CPU interpreter cannot iterate over) into ⟨t_k, s_ik⟩,
        ‖s_ik‖² and ‖t_k‖², writes them to ``checks`` (2, N, L), and the coefficient C[i, k] = w_i β_i · factor_ik
        (docs/theory.md § Rules: factor = max(⟨t, s⟩, 0) / ‖s‖², or with COSINE max(⟨t, s⟩, 0) / (‖s‖ ‖t‖) · scale_i;
        0 where the denominator is 0; without FILTER the dot product is not clamped) to ``coefs`` (N, L).
        ``rule_values`` = [w_i β_i (N), scale_i (N), a] (not named ``params``: Triton's launch binder has a local
        of that name, which such an argument shadows, and the launch fails; :func:`check_launch_binders`). Adds
        0 · (dots and norms) to ``flag``. IEEE_F32: the float32
        division and square roots rounded as torch's (IEEE, subnormals kept): Triton's ``/`` and ``sqrt`` are
        approximate and its ``div_rn``/``sqrt_rn`` flush subnormals to zero, so they are done in float64 (IEEE there)
        and rounded to float32, which gives the correctly rounded float32 result (53 ≥ 2·24 + 2 bits: rounding twice
        cannot differ from rounding once for a quotient or a square root)."""
        k = tl.program_id(0)
        c0 = tl.load(segment_chunks + k)
        c1 = tl.load(segment_chunks + k + 1)
        offs = tl.arange(0, CBLOCK)
        zero = tl.zeros([CBLOCK], dtype=tpartial.dtype.element_ty)
        tacc = zero
        for step in range(N_STEPS):
            j = c0 + step * CBLOCK
            tacc += tl.load(tpartial + j + offs, mask=j + offs < c1, other=0.0)
        tnorm2 = tl.sum(tacc, axis=0)
        bad = tl.sum(zero, axis=0)  # a 0 of the partials' dtype (a NaN or inf target reaches the dot products)
        for i in tl.static_range(n_sources):
            dacc = zero
            nacc = zero
            for step in range(N_STEPS):
                j = c0 + step * CBLOCK
                at = partial + (j + offs) * (2 * n_sources) + 2 * i
                dacc += tl.load(at, mask=j + offs < c1, other=0.0)
                nacc += tl.load(at + 1, mask=j + offs < c1, other=0.0)
            dot = tl.sum(dacc, axis=0)
            norm2 = tl.sum(nacc, axis=0)
            tl.store(checks + i * n_segments + k, dot)
            tl.store(checks + (n_sources + i) * n_segments + k, norm2)
            if FILTER:
                num = tl.maximum(dot, 0.0)
            else:
                num = dot
            if COSINE:
                if IEEE_F32:
                    denom = tl.sqrt(norm2.to(tl.float64)).to(tl.float32) * tl.sqrt(tnorm2.to(tl.float64)).to(tl.float32)
                else:
                    denom = tl.sqrt(norm2) * tl.sqrt(tnorm2)
            else:
                denom = norm2
            safe = tl.where(denom > 0, denom, 1.0)
            if IEEE_F32:
                quotient = (num.to(tl.float64) / safe.to(tl.float64)).to(tl.float32)
            else:
                quotient = num / safe
            factor = tl.where(denom > 0, quotient, 0.0)
            if COSINE:
                factor = factor * tl.load(rule_values + n_sources + i)
            tl.store(coefs + i * n_segments + k, tl.load(rule_values + i) * factor)
            bad += dot * 0.0 + norm2 * 0.0
        tl.atomic_add(flag, bad)


def _check(sources: Tensor, target: Tensor) -> None:
    if sources.dtype not in (torch.float32, torch.float64) or target.dtype != sources.dtype:
        raise ValueError(f"the Triton path takes float32 or float64 sources and target of one dtype, got "
                         f"{sources.dtype} and {target.dtype}")
    if sources.stride(-1) != 1 or target.stride(-1) != 1:
        raise ValueError("the Triton path needs rows with unit stride")


def table_for(lengths, sources: Tensor, config: KernelConfig | None = None) -> ChunkTable:
    """The chunk table of segments ``lengths`` for ``sources`` (N, m) under ``config`` (default: the library's)."""
    config = config or _DEFAULT
    return chunk_table(tuple(lengths), sources.device, sources.dtype, config.chunk(sources.shape[0]))


def reduce(sources: Tensor, target: Tensor, table: ChunkTable,
           config: KernelConfig | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """(⟨t_k, s_ik⟩ (N, L), ‖s_ik‖² (N, L), ‖t_k‖² (L,)) from sources (N, m) and target (m,): one pass over S.
    ``table`` must have been cut for ``config`` (:func:`table_for`)."""
    _check(sources, target)
    config = _checked_config(config, table, sources.shape[0])
    n, p = sources.shape[0], table.n_chunks
    partial, tpartial = _launch_reduce(sources, target, table, config)
    per_segment = torch.mm(table.chunk_to_segment.to(sources.dtype), torch.cat([partial.view(p, 2 * n), tpartial], 1))
    both = per_segment[:, :2 * n].view(-1, n, 2)  # (L, N, 2)
    return both[..., 0].T, both[..., 1].T, per_segment[:, 2 * n]


def combine(sources: Tensor, target: Tensor, target_coef: Tensor, coefs: Tensor, table: ChunkTable,
            out: Tensor, config: KernelConfig | None = None) -> Tensor:
    """out = a·t + Σ_i C[i, seg(j)]·s_i[j] for sources (N, m), target (m,), a 0-d ``target_coef`` and C (N, L)
    (contiguous); returns the per-chunk sums of out (P,) for a finiteness check. ``out`` may be ``target``.
    ``table`` must have been cut for ``config`` (:func:`table_for`)."""
    _check(sources, target)
    config = _checked_config(config, table, sources.shape[0])
    sums = torch.empty(table.n_chunks, dtype=sources.dtype, device=sources.device)
    coefs = coefs.to(sources.dtype).contiguous()
    a = target_coef.to(device=sources.device, dtype=sources.dtype).reshape(1)
    _launch_combine(sources, target, a, coefs, table, out, sums, config, flag=False)
    return sums


#: how the projection factor is formed in :func:`project` (docs/theory.md § Rules)
PROJECTIONS = ("exact", "cosine")
#: chunk partials the coefficient kernel sums per step (ResNet-18's longest segment, 2.36 M elements, is 1,152 chunks
#: of 2,048: five steps)
_COEF_BLOCK = 256


class Reduction(NamedTuple):
    """The first pass of :func:`project` in flight (:func:`start_projection`): its chunk table and configuration, and
    the per-chunk partials (P, N, 2) and (P, 1) the reduction kernel writes."""

    table: ChunkTable
    config: KernelConfig
    partial: Tensor
    tpartial: Tensor


def start_projection(sources: Tensor, target: Tensor, table: ChunkTable,
                     config: KernelConfig | None = None) -> Reduction:
    """Launches :func:`project`'s first pass, the reduction kernel over sources (N, m) and target (m,), and returns
    at once: the caller's host work until :func:`project` (given the result as ``reduction``) then overlaps it on
    the GPU. Nothing is read back; the partials are only valid for the same sources and target, unchanged."""
    _check(sources, target)
    config = _checked_config(config, table, sources.shape[0])
    partial, tpartial = _launch_reduce(sources, target, table, config)
    return Reduction(table, config, partial, tpartial)


def project(sources: Tensor, target: Tensor, params: Tensor, table: ChunkTable, out: Tensor, *,
            projection: str = "exact", filter_negative: bool = True,
            config: KernelConfig | None = None, reduction: Reduction | None = None) -> tuple[Tensor, Tensor]:
    """Layer-wise FedGP (exact or cosine) in three kernels, with no torch arithmetic between them: the reduction
    (as :func:`reduce`), one program per segment forming the coefficients C (N, L) from its chunks' partials, and
    the combination (as :func:`combine`) writing out = a·t + Σ_i C[i, seg(j)]·s_i[j] into ``out`` (m,).

    ``params`` (2N + 1,) on the device, in the sources' dtype: [w_i β_i for each source (β weights the source
    part), scale_i for each source (the cosine form's alignment factors; unused by ``exact``), a = 1 − Σ_i w_i β_i].
    Returns ``flag`` (1,), 0 when every dot product, squared norm and chunk sum of out is finite and NaN otherwise
    (its one read is the caller's single host synchronisation), and ``checks`` (2, N, L): the dot products and
    squared norms, for the caller's exact re-check after a non-zero flag. ``reduction``: the first pass, already
    launched by :func:`start_projection` on the same sources, target and ``table`` (else it is launched here)."""
    _check(sources, target)
    if projection not in PROJECTIONS:
        raise ValueError(f"projection must be one of {PROJECTIONS}, got {projection!r}")
    n = sources.shape[0]
    if params.shape != (2 * n + 1,) or params.dtype != sources.dtype or params.device != sources.device:
        raise ValueError(f"params must be a ({2 * n + 1},) tensor of dtype {sources.dtype} on {sources.device} "
                         f"([w·β (N), scale (N), a]); got {tuple(params.shape)}, {params.dtype}, {params.device}")
    if reduction is None:
        reduction = start_projection(sources, target, table, config)
    elif reduction.table is not table or reduction.partial.shape[1] != n or config not in (None, reduction.config):
        raise ValueError("reduction was started for another chunk table, number of sources or kernel configuration "
                         "than this call's")
    config, partial, tpartial = reduction.config, reduction.partial, reduction.tpartial
    n_segments = table.segment_chunks.numel() - 1
    coefs = torch.empty(n, n_segments, dtype=sources.dtype, device=sources.device)
    checks = torch.empty(2, n, n_segments, dtype=sources.dtype, device=sources.device)
    flag = torch.zeros(1, dtype=sources.dtype, device=sources.device)
    _coef_kernel[(n_segments,)](partial, tpartial, table.segment_chunks, params, coefs, checks, flag, n_segments,
                                n_sources=n, N_STEPS=-(-table.max_segment_chunks // _COEF_BLOCK),
                                COSINE=projection == "cosine", FILTER=bool(filter_negative),
                                IEEE_F32=sources.dtype == torch.float32, CBLOCK=_COEF_BLOCK, num_warps=4)
    _launch_combine(sources, target, params[2 * n:], coefs, table, out, flag, config, flag=True)
    return flag, checks


def _launch_reduce(sources: Tensor, target: Tensor, table: ChunkTable, config: KernelConfig) -> tuple[Tensor, Tensor]:
    """The reduction kernel: per-chunk partials (P, N, 2) (⟨t, s_i⟩, ‖s_i‖²) and (P, 1) (‖t‖²)."""
    n, p = sources.shape[0], table.n_chunks
    partial = torch.empty(p, n, 2, dtype=sources.dtype, device=sources.device)
    tpartial = torch.empty(p, 1, dtype=sources.dtype, device=sources.device)
    if config.form == "loop":
        _reduce_kernel[(p,)](sources, target, table.starts, table.lengths, partial, tpartial, sources.stride(0),
                             n_sources=n, BLOCK=table.block, num_warps=config.num_warps)
    else:
        _reduce_tile_kernel[(p,)](sources, target, table.starts, table.lengths, partial, tpartial, sources.stride(0),
                                  n, N_PAD=_pad(n), BLOCK=table.block, num_warps=config.num_warps)
    return partial, tpartial


def _launch_combine(sources: Tensor, target: Tensor, a: Tensor, coefs: Tensor, table: ChunkTable, out: Tensor,
                    sums: Tensor, config: KernelConfig, *, flag: bool) -> None:
    """The combination kernel with a (1,) and C (N, L) contiguous on the device; ``sums`` (P,) per-chunk sums of
    out, or with ``flag`` the (1,) finiteness flag it adds 0 · each chunk sum to."""
    n, p = sources.shape[0], table.n_chunks
    if config.form == "loop":
        _combine_kernel[(p,)](sources, target, out, table.starts, table.lengths, table.segments, coefs, a, sums,
                              coefs.shape[1], sources.stride(0), n_sources=n, BLOCK=table.block, FLAG=flag,
                              num_warps=config.num_warps)
    else:
        _combine_tile_kernel[(p,)](sources, target, out, table.starts, table.lengths, table.segments, coefs, a, sums,
                                   coefs.shape[1], sources.stride(0), n, N_PAD=_pad(n), BLOCK=table.block, FLAG=flag,
                                   num_warps=config.num_warps)


@dataclass(frozen=True)
class KernelVariant:
    """One compiled form of a kernel: its ``name`` in reports, the module attribute ``kernel``, the run-time ``args``
    (name → Triton type, e.g. ``*fp32``), the ``constexprs`` and ``num_warps``."""

    name: str
    kernel: str
    args: dict
    constexprs: dict
    num_warps: int


def kernel_variants(n_sources: int = 4) -> list[KernelVariant]:
    """Every kernel variant the library launches for ``n_sources`` sources: both forms of :func:`reduce` and
    :func:`combine` (the latter with and without the flag) and the coefficient kernel of :func:`project` for each
    projection and filter, in float32 and float64."""
    n, pad = int(n_sources), _pad(n_sources)
    variants = []
    for ty in ("fp32", "fp64"):
        ptr = "*" + ty
        reduce_args = {"S": ptr, "T": ptr, "starts": "*i32", "lens": "*i32", "partial": ptr, "tpartial": ptr,
                       "stride_s": "i64"}
        combine_args = {"S": ptr, "T": ptr, "OUT": ptr, "starts": "*i32", "lens": "*i32", "segs": "*i32",
                        "coefs": ptr, "target_coef": ptr, "sums": ptr, "n_segments": "i32", "stride_s": "i64"}
        variants.append(KernelVariant(f"reduce loop {ty}", "_reduce_kernel", reduce_args,
                                      {"n_sources": n, "BLOCK": BLOCK}, 8))
        variants.append(KernelVariant(f"reduce tile {ty}", "_reduce_tile_kernel", {**reduce_args, "n_sources": "i32"},
                                      {"N_PAD": pad, "BLOCK": 8192 // pad}, 8))
        for flag in (False, True):
            variants.append(KernelVariant(f"combine loop {ty} flag={flag}", "_combine_kernel", combine_args,
                                          {"n_sources": n, "BLOCK": BLOCK, "FLAG": flag}, 8))
            variants.append(KernelVariant(f"combine tile {ty} flag={flag}", "_combine_tile_kernel",
                                          {**combine_args, "n_sources": "i32"},
                                          {"N_PAD": pad, "BLOCK": 8192 // pad, "FLAG": flag}, 8))
        coef_args = {"partial": ptr, "tpartial": ptr, "segment_chunks": "*i32", "rule_values": ptr, "coefs": ptr,
                     "checks": ptr, "flag": ptr, "n_segments": "i32"}
        for cosine in (False, True):
            for filter_negative in (True, False):
                variants.append(KernelVariant(
                    f"coefficients {ty} cosine={cosine} filter={filter_negative}", "_coef_kernel", coef_args,
                    {"n_sources": n, "N_STEPS": 5, "COSINE": cosine, "FILTER": filter_negative,
                     "IEEE_F32": ty == "fp32", "CBLOCK": _COEF_BLOCK}, 4))
    return variants


def compile_variant(variant: KernelVariant, capability: int = 90, kernel=None) -> str:
    """The PTX of ``variant`` compiled for a CUDA device of compute ``capability`` (90: Hopper) without a GPU: Triton's
    compiler and the ptxas it ships run on the CPU. ``kernel`` overrides the JIT function (another version's): its
    run-time arguments take ``variant.args``' types in order, whatever they are named there."""
    if triton is None:
        raise RuntimeError("compiling the kernels needs Triton (pip install triton), which the CPU torch wheel lacks")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = kernel if kernel is not None else globals()[variant.kernel]
    runtime = [name for name in fn.arg_names if name not in variant.constexprs]
    if len(runtime) != len(variant.args):
        raise ValueError(f"{variant.name}: the kernel takes run-time arguments {runtime}, the variant types "
                         f"{list(variant.args)}")
    signature = {**dict(zip(runtime, variant.args.values())), **{k: "constexpr" for k in variant.constexprs}}
    compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=variant.constexprs),
                              target=GPUTarget("cuda", int(capability), 32), options={"num_warps": variant.num_warps})
    return compiled.asm["ptx"]


def compile_kernels(capability: int = 90, n_sources: int = 4) -> dict[str, str]:
    """Every variant of :func:`kernel_variants` compiled for compute ``capability`` without a GPU (see
    :func:`compile_variant`): name → PTX. Catches what Triton's interpreter cannot (it runs the kernels as Python):
    type errors between branches, operations a dtype lacks, bad constexpr use."""
    return {v.name: compile_variant(v, capability) for v in kernel_variants(n_sources)}


KERNELS = ("_reduce_kernel", "_reduce_tile_kernel", "_combine_kernel", "_combine_tile_kernel", "_coef_kernel")


def check_launch_binders(capability: int = 90) -> None:
    """Builds Triton's launch binder (the generated function that binds a launch's arguments before the cache look-up)
    of every kernel in :data:`KERNELS` for compute ``capability``, without a GPU, and calls it with a distinct integer
    per argument: raises if an argument does not come back as itself. The binder's own locals (``params``,
    ``specialization``, ``options``) shadow kernel arguments of those names, which then fail only at launch, on the
    device (the coefficient kernel's ``params`` did, on an H200 on 2026-11-26); neither the interpreter nor
    :func:`compile_kernels` goes through the binder."""
    if triton is None:
        raise RuntimeError("checking the launch binders needs Triton (pip install triton), which the CPU torch wheel lacks")
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    backend = make_backend(GPUTarget("cuda", int(capability), 32))
    for name in KERNELS:
        fn = globals()[name]
        values = [1000 + i for i in range(len(fn.params))]
        try:
            bound = create_function_from_signature(fn.signature, fn.params, backend)(*values)[0]
        except TypeError as error:
            raise RuntimeError(f"{name}: Triton's launch binder cannot bind its arguments {fn.arg_names}: {error}")
        if bound != dict(zip(fn.arg_names, values)):
            raise RuntimeError(f"{name}: Triton's launch binder binds {bound}, not its arguments {fn.arg_names}")


def _checked_config(config: KernelConfig | None, table: ChunkTable, n_sources: int) -> KernelConfig:
    config = config or _DEFAULT
    if config.chunk(n_sources) != table.block:
        raise ValueError(f"the chunk table was cut into chunks of {table.block} elements but config {config} uses "
                         f"{config.chunk(n_sources)} for {n_sources} sources; build it with table_for(lengths, sources, "
                         "config)")
    return config
