"""Communication accounting of Fed INB: every tensor that crosses the client/server boundary goes through
:class:`CommunicationLog`, which counts its parameters per client where it is sent (``docs/translation.md``
§ Communication accounting; paper Sec. 2.6 and App. C.3–C.4).

Protocol counted (per class problem, per layer, per client; Q = n sorted projections, or V + 1 VW
quantile edges; B client-histogram bins; B₂ barycenter grid points):

* ``theta_init`` ↓ d·K (Haar Θ₀ drawn by the server);
* each objective evaluation (the initial one and every Armijo trial): ``projections`` or
  ``vw_quantiles`` ↑ K·Q, ``barycenter`` ↓ K·Q, ``objective`` ↑ 1 (the client's term, for the line search);
* each iteration: ``gradient`` ↑ d·K, ``gradient_sum`` ↓ d·K (paper App. C.3: clients rebuild every trial
  Θ(τ) = Θ − τU(I + τ/2·VᵀU)⁻¹VᵀΘ themselves, so Θ is never re-sent), and ``step_size`` ↓ 1 per trial;
* 1-D barycenter (paper Alg. 2): ``client_cdf`` ↑ K·(B + 2) (μ, σ and B masses per direction),
  ``barycenter_quantiles`` ↓ K·(B₂ + 1) (values on the shared grid and the tail slope).

Hence per layer and class, with E = 1 + T evaluations, T Armijo trials and I gradient iterations:
up = E·(K·Q + 1) + I·d·K + K·(B + 2) and down = d·K + E·K·Q + I·d·K + T + K·(B₂ + 1)
(:func:`expected_parameters`), i.e. O((J + J′)·K·(n + d)) or O((J + J′)·K·(V + d)) as in the paper.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
from torch import Tensor

__all__ = ["CommunicationLog", "expected_parameters", "expected_messages"]


class CommunicationLog:
    """Parameters sent between each client and the server, recorded by the code that sends them.

    Entries are aggregated by (layer, stage, tag, direction); ``up`` = client → server, ``down`` =
    server → client. Counts are per client (every client sends and receives the same amount here).
    """

    def __init__(self, n_clients: int):
        if n_clients < 1:
            raise ValueError(f"n_clients must be >= 1, got {n_clients}")
        self.n_clients = n_clients
        self._entries: dict[tuple[int, str, str, str], list[int]] = {}

    def _record(self, layer: int, stage: str, tag: str, direction: str, params: int, messages: int) -> None:
        e = self._entries.setdefault((layer, stage, tag, direction), [0, 0])
        e[0] += int(params)
        e[1] += int(messages)

    def up(self, layer: int, stage: str, tag: str, payload: Tensor, client_dim: int, n_problems: int = 1) -> Tensor:
        """Each client sends its slice of ``payload`` along ``client_dim`` (n_problems messages each)."""
        m = payload.shape[client_dim]
        if m != self.n_clients:
            raise ValueError(f"payload has {m} clients along dim {client_dim}, log has {self.n_clients}")
        self._record(layer, stage, tag, "up", payload.numel() // m, n_problems)
        return payload

    def down(self, layer: int, stage: str, tag: str, payload: Tensor, n_problems: int = 1) -> Tensor:
        """The server broadcasts ``payload``: every client receives all of it."""
        self._record(layer, stage, tag, "down", payload.numel(), n_problems)
        return payload

    def table(self) -> pd.DataFrame:
        """One row per (layer, stage, tag, direction): params_per_client, messages_per_client."""
        rows = [dict(layer=k[0], stage=k[1], tag=k[2], direction=k[3], params_per_client=v[0],
                     messages_per_client=v[1]) for k, v in sorted(self._entries.items())]
        return pd.DataFrame(rows, columns=["layer", "stage", "tag", "direction", "params_per_client",
                                           "messages_per_client"])

    def total(self, direction: str | None = None, layer: int | None = None, stage: str | None = None) -> int:
        """Parameters per client, summed over the selected entries (both directions by default)."""
        return sum(v[0] for k, v in self._entries.items()
                   if (direction is None or k[3] == direction) and (layer is None or k[0] == layer)
                   and (stage is None or k[1] == stage))

    def per_layer(self) -> pd.DataFrame:
        """Per layer: up, down, total parameters per client and the cumulative total."""
        t = self.table()
        if t.empty:
            return pd.DataFrame(columns=["layer", "up", "down", "total", "cumulative"])
        p = t.pivot_table(index="layer", columns="direction", values="params_per_client", aggfunc="sum",
                          fill_value=0).reindex(columns=["up", "down"], fill_value=0)
        p["total"] = p["up"] + p["down"]
        p["cumulative"] = p["total"].cumsum()
        return p.reset_index()

    def to_dict(self) -> dict:
        return {"n_clients": self.n_clients, "entries": [[*k, *v] for k, v in sorted(self._entries.items())]}

    @classmethod
    def from_dict(cls, d: dict) -> CommunicationLog:
        log = cls(d["n_clients"])
        for layer, stage, tag, direction, params, messages in d["entries"]:
            log._record(layer, stage, tag, direction, params, messages)
        return log


@dataclass(frozen=True)
class ExpectedParameters:
    up: int
    down: int

    @property
    def total(self) -> int:
        return self.up + self.down


def expected_messages(d: int, k: int, n: int, n_iter: int, n_trials: int, n_bins: int | None, bary_bins: int,
                      bary_grid: int) -> dict[tuple[str, str, str], int]:
    """Parameters one client sends or receives for one layer of one class problem, per message:
    {(stage, tag, direction): params}, the protocol of the module docstring (``docs/translation.md``
    § Communication accounting): Q = n (sorted projections) or V + 1 (VW edges), E = 1 + n_trials evaluations,
    n_iter gradients. A :class:`CommunicationLog` of a fit holds, per layer and message, the sum of these
    over the class problems."""
    q = n if n_bins is None else n_bins + 1
    e = 1 + n_trials
    return {
        ("max_k_sw", "theta_init", "down"): d * k,
        ("max_k_sw", "projections" if n_bins is None else "vw_quantiles", "up"): e * k * q,
        ("max_k_sw", "barycenter", "down"): e * k * q,
        ("max_k_sw", "objective", "up"): e,
        ("max_k_sw", "gradient", "up"): n_iter * d * k,
        ("max_k_sw", "gradient_sum", "down"): n_iter * d * k,
        ("max_k_sw", "step_size", "down"): n_trials,
        ("barycenter", "client_cdf", "up"): k * (bary_bins + 2),
        ("barycenter", "barycenter_quantiles", "down"): k * (bary_grid + 1),
    }


def expected_parameters(d: int, k: int, n: int, n_iter: int, n_trials: int, n_bins: int | None,
                        bary_bins: int, bary_grid: int) -> ExpectedParameters:
    """Parameters one client sends (up) and receives (down) for one layer of one class problem.

    Module docstring formula (``docs/translation.md`` § Communication accounting): Q = n (plain) or V + 1 (VW),
    E = 1 + n_trials evaluations, n_iter gradients; the sums of :func:`expected_messages` by direction.
    """
    msgs = expected_messages(d, k, n, n_iter, n_trials, n_bins, bary_bins, bary_grid)
    return ExpectedParameters(sum(v for key, v in msgs.items() if key[2] == "up"),
                              sum(v for key, v in msgs.items() if key[2] == "down"))
