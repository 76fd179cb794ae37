"""Fitted Fed INB translators on disk, beside the result store's record of the run that fitted them.

The result store keeps a finished translation run as a JSON record (WD, communication, iterations); the
fitted translator itself is not JSON. Notebook 06 writes the translators it draws (and notebook 08 uses) as
a *sidecar* of that record: ``<store root>/<experiment>/<config hash>.translator.pt``, the same key as the
record, holding the code revision that fitted it (``docs/translation.md`` § Fitted translators reused). A
sidecar of another revision is stale and never served, exactly like a stored record.

What is saved is everything :meth:`~fda_core.experiments.translation.inb.FedINB.transform` and
:meth:`~fda_core.experiments.translation.inb.FedINB.inverse_transform` read — per class block the layers'
Θ, client CDFs and barycenter quantile functions, the class positions, the resolved input transform — plus
the fit's communication log and history. The autoencoders of the AE variants are *not* in the file: they
come from notebook 06's autoencoder cache (keyed by their own code revision), and the caller passes them in.
Only tensors, numbers, strings, lists and dicts are stored, so the file loads with ``weights_only=True``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ...common.files import atomic_write
from ...common.store import config_hash
from ...core.barycenter import BarycenterQuantile, ClientCDF
from . import experiments as ex
from .comms import CommunicationLog
from .inb import FedINB, INBLayer, _Block

__all__ = ["translator_path", "translator_state", "translator_from_state", "save_translator", "load_translator"]

#: format version of the sidecar file (bump when the layout changes)
FORMAT = 1


def translator_path(root: str | Path, experiment: str, config: Mapping[str, Any]) -> Path:
    """Where the translator of the run ``config`` of ``experiment`` lives: next to its store record,
    ``<root>/<experiment>/<config hash>.translator.pt``."""
    if not experiment or "/" in experiment or experiment.startswith("."):
        raise ValueError(f"experiment must be a plain folder name, got {experiment!r}")
    return Path(root) / experiment / f"{config_hash(dict(config))}.translator.pt"


def _layer_state(layer: INBLayer) -> dict[str, torch.Tensor]:
    c, b = layer.cdf, layer.bary
    return dict(theta=layer.theta, mu=c.mu, sigma=c.sigma, mass=c.mass, s_lo=c.s_lo, s_hi=c.s_hi, grid=b.grid,
                values=b.values, slope=b.slope)


def _layer_from(state: Mapping[str, torch.Tensor], device: torch.device) -> INBLayer:
    t = {k: v.to(device) for k, v in state.items()}
    return INBLayer(t["theta"], ClientCDF(t["mu"], t["sigma"], t["mass"], t["s_lo"], t["s_hi"]),
                    BarycenterQuantile(t["grid"], t["values"], t["slope"]))


def translator_state(model: FedINB) -> dict[str, Any]:
    """The fitted state of ``model`` (tensors on the CPU, plain Python values otherwise). ValueError when the
    model is not fitted."""
    if not getattr(model, "_blocks", None):
        raise ValueError("model is not fitted: call fit() first")
    cpu = lambda t: t.detach().cpu()  # noqa: E731
    return dict(
        format=FORMAT, name=model.name, variant=model.variant, n_domains=int(model.n_domains),
        input_dim=int(model.input_dim), dim=int(model.dim), classes=[int(c) for c in model.classes],
        input_transform_=model.input_transform_,
        class_pos={str(c): [int(b), int(g)] for c, (b, g) in model._class_pos.items()},
        blocks=[dict(classes=[int(c) for c in blk.classes], n=int(blk.n),
                     layers=[{k: cpu(v) for k, v in _layer_state(ly).items()} for ly in blk.layers])
                for blk in model._blocks],
        communication=model.communication.to_dict() if model.communication is not None else None,
        history=[{k: v for k, v in h.items()} for h in model.history])


def translator_from_state(state: Mapping[str, Any], config: Mapping[str, Any], autoencoders=None) -> FedINB:
    """A fitted :class:`FedINB` rebuilt from :func:`translator_state` and the run ``config`` it was fitted with
    (the constructor is :func:`~fda_core.experiments.translation.experiments.build_translator`, as for the fit).
    ``autoencoders``: the AE variants' model(s), as for the fit. ValueError when the state does not belong to
    the config or the autoencoders are missing."""
    if state.get("format") != FORMAT:
        raise ValueError(f"translator state has format {state.get('format')!r}, expected {FORMAT}")
    model = ex.build_translator(dict(config), autoencoders)
    if state["name"] != model.name or state["variant"] != model.variant:
        raise ValueError(f"translator state of {state['name']!r} does not match the config's run {model.name!r}")
    if model.variant != "INB" and autoencoders is None:
        raise ValueError(f"variant {model.variant} needs its autoencoders (the fit's), got autoencoders=None")
    model.n_domains, model.input_dim, model.dim = state["n_domains"], state["input_dim"], state["dim"]
    model.classes = list(state["classes"])
    model.input_transform_ = state["input_transform_"]
    model._class_pos = {int(c): (int(b), int(g)) for c, (b, g) in state["class_pos"].items()}
    model._blocks = [_Block(list(b["classes"]), int(b["n"]), [_layer_from(ly, model.device) for ly in b["layers"]])
                     for b in state["blocks"]]
    if state["communication"] is not None:
        model.communication = CommunicationLog.from_dict(state["communication"])
    model.history = [dict(h) for h in state["history"]]
    if model.variant != "INB":
        aes = autoencoders if isinstance(autoencoders, (list, tuple)) else [autoencoders]
        for ae in aes:
            ae.to(model.device).eval()
    return model


def save_translator(path: str | Path, model: FedINB, config: Mapping[str, Any], revision: str) -> Path:
    """Write ``model``'s state with its run ``config`` and the code ``revision`` that fitted it, atomically."""
    payload = {"revision": revision, "config_hash": config_hash(dict(config)), "state": translator_state(model)}
    return atomic_write(path, lambda tmp: torch.save(payload, tmp))


def load_translator(path: str | Path, config: Mapping[str, Any], revision: str, autoencoders=None) -> FedINB | None:
    """The translator stored at ``path`` when it was fitted for ``config`` by code revision ``revision``; None
    when there is no file or it is stale (another revision or another config)."""
    path = Path(path)
    if not path.exists():
        return None
    payload = torch.load(path, map_location="cpu", weights_only=True)
    if (not isinstance(payload, dict) or payload.get("revision") != revision
            or payload.get("config_hash") != config_hash(dict(config))):
        return None
    return translator_from_state(payload["state"], config, autoencoders)
