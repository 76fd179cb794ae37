"""Layer-wise FedGP prepared once for fixed buffers and called every round: :func:`prepare`.

A federated loop aggregates the same buffers every round — the (N, m) source updates, the (m,) target update and the
(m,) result, rewritten in place — with new β and weights. :func:`fda_core.core.aggregation.fedgp` checks all of its
arguments at every call; on a GPU that host work, and launching the three Triton kernels of the layer-wise rule one
after another, is what keeps a call above the device's copy floor for few sources (docs/performance.md § GPU: at N = 4 on an H200
the kernels alone took 0.24–0.29 ms launched eagerly, 0.18 ms replayed from a CUDA graph, a whole call 0.35–0.39 ms,
the floor 0.11 ms). A :class:`PreparedRule` checks the buffers once, when it is made, and afterwards each call only
checks and packs β, the weights and the alignment (in Python where they are Python numbers), copies them into one
(2N + 1,) device tensor and runs the kernels — on CUDA replayed from one CUDA graph captured at the second call — and
reads the kernels' finiteness flag (the call's one host synchronisation).

The arithmetic is that of :func:`~fda_core.core.aggregation.fedgp`, :func:`~fda_core.core.aggregation.fedgp_nofilter`
and :func:`~fda_core.core.aggregation.fedgp_cosine` (docs/theory.md § Rules, § Layer-wise application) on the
buffers' contents at the time of the call: on a device without the kernels (the CPU) a prepared call *is* that
function's call; with them it runs the same kernels on the same (2N + 1,) parameters, so the results are the same
bits. β weights the SOURCE part, as everywhere in the library.

What the buffers must do: stay alive and keep their shape, dtype, device and memory (write each round's numbers into
them, ``buf.copy_(...)`` or ``torch.sub(..., out=buf)``), as the federated engine keeps its update buffers. A graph
replays reads and writes at the addresses it was captured with; the prepared rule holds references to the buffers so
that their memory is not freed.
"""

from __future__ import annotations

import struct
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from . import aggregation as _agg
from .aggregation import BetaLike

__all__ = ["prepare", "PreparedRule", "PREPARED_RULES", "GRAPH_MODES"]

#: the rules a prepared call can run: name -> (projection, filter_negative)
PREPARED_RULES = {"fedgp": ("exact", True), "fedgp_nofilter": ("exact", False), "fedgp_cosine": ("cosine", True)}
#: ``graph``: "auto" (a CUDA graph where the kernels run on a CUDA device), True (required) or False (never)
GRAPH_MODES = ("auto", True, False)


def _graphs_on(device: torch.device) -> bool:
    """Whether CUDA graphs can be captured for work on ``device``."""
    return device.type == "cuda"


def _capture(step: Callable[[], tuple[Tensor, Tensor]]) -> tuple[Callable[[], None], tuple[Tensor, Tensor]]:
    """``step`` captured in a CUDA graph: (replay, the captured (flag, checks), refilled by every replay). Nothing runs
    at capture; the caller has run ``step`` once already (Triton compiles its kernels at their first launch, which
    cannot happen inside a capture). The step is not run again to warm up: with ``out`` the target itself it is not
    idempotent."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = step()
    return graph.replay, result


def _number_bytes(values: Sequence[Any]) -> bytes | None:
    try:
        return struct.pack(f"{len(values)}d", *values)
    except (OverflowError, struct.error):  # an int too large for a double: no key, so the call checks it
        return None


def _arguments_key(*arguments: Any) -> bytes | None:
    """The Python numbers among a call's arguments (None, a number or a list/tuple of numbers each) as bytes that
    differ wherever the parameters they give can differ (-0.0 and 0.0 included); None where one is anything else (a
    tensor, whose contents may change between calls)."""
    parts = []
    for value in arguments:
        if value is None:
            parts.append(b"n")
            continue
        if type(value) in (int, float):
            packed = _number_bytes((value,))
        elif type(value) in (list, tuple) and all(type(v) in (int, float) for v in value):
            packed = _number_bytes(value)
        else:
            return None
        if packed is None:
            return None
        parts.append(b"l%d:" % len(packed) + packed)
    return b"|".join(parts)


class PreparedRule:
    """A layer-wise FedGP rule bound to fixed buffers (:func:`prepare`); call it with β, the weights and (the cosine
    form) the alignment each round: ``prepared(beta, weights=None, alignment=None)`` writes the result into ``out``
    and returns it.

    Attributes: ``rule`` (its name), ``path``: "eager" (the library function at every call: no Triton kernels here,
    e.g. the CPU), "kernels" (the three kernels launched at every call) or "graph" (replayed from a CUDA graph from
    the second call on), ``captured`` (whether the graph exists yet). Where β, the weights and the alignment are Python
    numbers equal to the last call's (a fixed-β rule, round after round), their checked parameters are still on the
    device and are neither packed nor copied again.
    """

    def __init__(self, rule: str, source_grads: Tensor, target_grad: Tensor, out: Tensor,
                 segments: Sequence[int] | None = None, *, graph: bool | str = "auto") -> None:
        if rule not in PREPARED_RULES:
            raise ValueError(f"rule must be one of {sorted(PREPARED_RULES)}, got {rule!r}")
        if not (graph is True or graph is False or graph == "auto"):
            raise ValueError(f"graph must be 'auto', True or False, got {graph!r}")
        if not isinstance(source_grads, Tensor) or source_grads.ndim != 2:
            shape = tuple(source_grads.shape) if isinstance(source_grads, Tensor) else type(source_grads).__name__
            raise ValueError(f"source_grads must be one (N, m) tensor for a prepared rule, got {shape}")
        if not isinstance(target_grad, Tensor) or target_grad.ndim != 1:
            shape = tuple(target_grad.shape) if isinstance(target_grad, Tensor) else type(target_grad).__name__
            raise ValueError(f"target_grad must be one (m,) tensor for a prepared rule, got {shape}")
        if not isinstance(out, Tensor):
            raise ValueError(f"out must be an (m,) tensor (the buffer every call writes), got {type(out).__name__}")
        blocks = _agg._normalise(source_grads, target_grad, segments)  # shapes, dtypes, devices, segments
        _agg._out_buffers(out, blocks)  # form, contiguity, no memory shared with the sources
        self.rule, self._graph = rule, graph
        self._projection, self._filter = PREPARED_RULES[rule]
        self._fn = getattr(_agg, rule)
        self._sources, self._target, self._out = source_grads, target_grad, out
        self._segments = None if segments is None else tuple(int(n) for n in segments)
        layout = _agg._kernel_layout(blocks)
        on_cuda = _graphs_on(target_grad.device)
        if graph is True and (layout is None or not on_cuda):
            raise ValueError("graph=True needs the three-kernel path on a CUDA device (Triton importable, float32 or "
                             "float64, fda_core.core.aggregation.LAYERWISE_COEFFICIENTS = 'kernel'); here the rule "
                             f"runs {'without the kernels' if layout is None else 'on ' + str(target_grad.device)}")
        self.path = "eager" if layout is None else ("graph" if graph is not False and on_cuda else "kernels")
        self._replay: Callable[[], None] | None = None
        self._key: bytes | None = None  # the Python arguments whose parameters the device vector holds
        self._result: tuple[Tensor, Tensor] | None = None
        if layout is not None:
            from . import segmented_triton

            blocks.flat = layout
            self._blocks, self._kernels = blocks, segmented_triton
            self._table = segmented_triton.table_for(layout.lengths, layout.sources)
            self._params = torch.empty(2 * blocks.n_sources + 1, dtype=target_grad.dtype, device=target_grad.device)

    @property
    def captured(self) -> bool:
        return self._replay is not None

    def __repr__(self) -> str:
        return (f"PreparedRule({self.rule!r}, N={self._sources.shape[0]}, m={self._sources.shape[1]}, "
                f"path={self.path!r}, captured={self.captured})")

    def __call__(self, beta: BetaLike, weights: BetaLike | None = None, alignment: BetaLike | None = None) -> Tensor:
        """ĝ of the rule on the buffers' current contents (docs/theory.md § Rules), written into ``out`` (returned).

        Args:
            beta: float in [0, 1] or (N,) per-source values (weights the source part).
            weights: (N,) non-negative per-source weights, default uniform; normalised to sum 1.
            alignment: (N,) magnitude-alignment factors a_i ≥ 0 of ``fedgp_cosine`` (default 1); only that rule.
        Raises ValueError naming the argument, as the rule's function does (a NaN/inf in a buffer names it).
        """
        if alignment is not None and self._projection != "cosine":
            raise ValueError(f"alignment is an argument of fedgp_cosine only, not of {self.rule}")
        if self.path == "eager":
            extra = () if self._projection != "cosine" else (alignment,)
            return self._fn(self._sources, self._target, beta, weights, *extra, out=self._out, segments=self._segments)
        blocks = self._blocks
        key = _arguments_key(beta, weights, alignment)
        if key is None or key != self._key:  # else the device vector holds these arguments' parameters already
            self._key = None
            host = _agg._python_params_host(beta, weights, alignment, blocks)  # checked before anything is written
            self._params.copy_(host if host is not None else _agg._tensor_params(blocks, beta, weights, alignment),
                               non_blocking=host is not None)
            self._key = key
        if self._replay is not None:
            self._replay()
            flag, checks = self._result  # type: ignore[misc]
        else:
            flag, checks = self._step()
        _agg._check_flag(blocks, flag, [self._out], checks)
        if self.path == "graph" and self._replay is None:
            self._capture_or_fall_back()
        return self._out

    def _capture_or_fall_back(self) -> None:
        """Capture the step (after its first eager run). Where the capture fails and ``graph`` was "auto", warn and
        launch the kernels at every call from now on ("kernels"): a slower call, the same results."""
        try:
            self._replay, self._result = _capture(self._step)
        except RuntimeError as error:
            if self._graph is True:
                raise
            warnings.warn(f"prepared {self.rule}: capturing its kernels in a CUDA graph failed ({error}); its calls "
                          "launch them one by one instead (same results)", RuntimeWarning, stacklevel=3)
            self.path = "kernels"

    def _step(self) -> tuple[Tensor, Tensor]:
        """The three kernels on the buffers and ``self._params``: (finiteness flag (1,), checks (2, N, L))."""
        layout = self._blocks.flat
        return self._kernels.project(layout.sources, layout.target, self._params, self._table, self._out,
                                     projection=self._projection, filter_negative=self._filter)


def prepare(rule: str, source_grads: Tensor, target_grad: Tensor, *, out: Tensor,
            segments: Sequence[int] | None = None, graph: bool | str = "auto") -> PreparedRule:
    """``rule`` ("fedgp", "fedgp_nofilter" or "fedgp_cosine") bound to the buffers ``source_grads`` (N, m),
    ``target_grad`` (m,) and ``out`` (m,; contiguous, sharing no memory with the sources, may be ``target_grad``
    itself), with ``segments`` the parameter tensors' lengths (the layer-wise rule) or None (the flat rule). Every
    argument is checked here, as the rule's function checks it (a ValueError naming it). Each call of the result,
    ``prepared(beta, weights, alignment)``, equals ``rule(source_grads, target_grad, beta, weights, [alignment,]
    out=out, segments=segments)`` on the buffers' contents at that time, bit for bit; see the module's docstring for
    what the buffers must do and for ``graph``.

    Example (a federated loop; ``S``, ``t`` rewritten in place each round)::

        step = prepare("fedgp", S, t, out=g, segments=lengths)
        for r in range(rounds):
            ...                         # S[i].copy_(update_i); t.copy_(target_update)
            step(0.5, weights)          # g <- FedGP(S, t, β = 0.5)
    """
    return PreparedRule(rule, source_grads, target_grad, out, segments, graph=graph)
