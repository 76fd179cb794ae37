"""Fed INB experiments on Rotated MNIST (paper Sec. 4.1, Fig. 2–3, App. F.6; notebook 06).

One call, :func:`run_translation`, fits one translator configuration on the client domains and returns
a JSON-serialisable record: WD (held-out, per depth) against the parameters transmitted per client, the
communication per layer and per message type, the max-K-SW objective traces and iteration counts, and
optionally a grid of translated digits. :mod:`fda_core.experiments.translation.study` stores these records
in a :class:`fda_core.common.store.ResultStore` tied to this module's code revision, so a re-run only fits
what is missing and a change to the code they depend on refits them.
"""

from __future__ import annotations

import json
import time
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ...common.devices import resolve_device
from ...common.files import atomic_write
from ...common.provenance import code_revision
from ...common.store import config_hash
from ...core.wasserstein import wasserstein_distances
from ...data.autoencoder import ConvAutoencoder, train_autoencoder
from ...data.rotated_domains import RotatedDomains, rotated_mnist
from .comms import expected_messages
from .inb import FedINB

__all__ = ["set_threads", "load_domains", "autoencoder_revision", "get_autoencoders", "identity_wd", "wd_by_depth",
           "build_translator", "run_translation", "vw_equals_plain", "vw_record_from_plain"]


def set_threads(n: int | None) -> int:
    """Set torch's CPU threads (None: leave as is); returns the number in use. On a shared 2-core machine
    one thread is much faster: OpenMP's spinning barriers collapse when the cores are oversubscribed."""
    if n is not None:
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"threads must be an integer >= 1, got {n!r}")
        torch.set_num_threads(n)
    return torch.get_num_threads()


@lru_cache(maxsize=4)
def _domains(angles: tuple, n_train: int, n_test: int, data_root: str, seed: int) -> RotatedDomains:
    return rotated_mnist(angles, n_train, n_test, data_root, seed)


def load_domains(angles=(0, 15, 30, 45, 60), n_train_per_class: int = 400, n_test_per_class: int = 100,
                 data_root: str = "", seed: int = 0) -> RotatedDomains:
    """Rotated-MNIST clients (cached in memory), see :func:`fda_core.data.rotated_domains.rotated_mnist`."""
    return _domains(tuple(float(a) for a in angles), n_train_per_class, n_test_per_class, data_root, seed)


def _data_key(d: RotatedDomains) -> dict:
    return dict(angles=d.angles, source=d.source, **d.sizes)


def autoencoder_revision() -> str:
    """Code revision of the trained autoencoders: the autoencoder module (architecture and training) and
    the module that builds the client domains they are trained on, with everything they import
    (:func:`fda_core.common.provenance.code_revision`)."""
    return code_revision("fda_core.data.autoencoder", "fda_core.data.rotated_domains")


def _load_states(path: Path, revision: str) -> list | None:
    """The stored state dicts when ``path`` holds autoencoders of code revision ``revision``, else None
    (files of other revisions, or from before revisions were recorded, are stale)."""
    stored = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(stored, dict) or stored.get("revision") != revision:
        return None
    return stored["states"]


def get_autoencoders(kind: str, domains: RotatedDomains, epochs: int = 8, seed: int = 0, device: str = "auto",
                     cache_dir: str | Path | None = None, recompute: bool = False) -> tuple[object, dict]:
    """The autoencoders of AEINB (``kind="shared"``: one trained on all clients' training digits, as in the
    paper) or IndAEINB (``kind="individual"``: one per client on its own digits).

    Cached in ``cache_dir`` when given: one file per (kind, epochs, seed, data) holding the state dicts and
    the code revision that trained them (:func:`autoencoder_revision`), written atomically. A file of another
    revision is stale: the autoencoders are retrained and the file replaced, so a changed autoencoder is never
    served from the cache; ``recompute=True`` retrains regardless. Returns (model or list of models, info) with
    info = kind, number of models, epochs, revision, whether they came from the cache (``cached``) or replaced
    a stale file (``stale``), training seconds and the held-out reconstruction error (mean per-image squared
    error) per client."""
    if kind not in ("shared", "individual"):
        raise ValueError(f"kind must be 'shared' or 'individual', got {kind!r}")
    dev = resolve_device(device)
    revision = autoencoder_revision()
    key = dict(kind=kind, epochs=epochs, seed=seed, data=_data_key(domains))
    path = None if cache_dir is None else Path(cache_dir) / f"{kind}_{config_hash(key)}.pt"
    n_models = 1 if kind == "shared" else len(domains.train_x)
    t0 = time.perf_counter()
    states = None if path is None or recompute or not path.exists() else _load_states(path, revision)
    stale = states is None and path is not None and not recompute and path.exists()
    if states is not None:
        models = []
        for st in states:
            m = ConvAutoencoder()
            m.load_state_dict(st)
            models.append(m.to(dev).eval())
    else:
        if kind == "shared":
            models = [train_autoencoder(torch.cat(domains.train_x), epochs=epochs, seed=seed, device=dev)[0]]
        else:
            models = [train_autoencoder(x, epochs=epochs, seed=seed + i, device=dev)[0]
                      for i, x in enumerate(domains.train_x)]
        if path is not None:
            payload = {"revision": revision,
                       "states": [{k: v.detach().cpu() for k, v in m.state_dict().items()} for m in models]}
            atomic_write(path, lambda tmp: torch.save(payload, tmp))
    seconds = time.perf_counter() - t0
    errors = []
    with torch.inference_mode():
        for i, x in enumerate(domains.test_x):
            m = models[0 if kind == "shared" else i]
            xd = x.to(dev)
            errors.append(float((m(xd) - xd).square().sum(1).mean()))
    info = dict(kind=kind, n_models=n_models, epochs=epochs, revision=revision, seconds=seconds,
                cached=states is not None, stale=stale, test_recon_sq_error=errors)
    return (models[0] if kind == "shared" else models), info


def _class_pairs(xs: torch.Tensor, ys: torch.Tensor, xt: torch.Tensor, yt: torch.Tensor, classes) -> list:
    return [(xs[ys == c], xt[yt.to(xt.device) == c]) for c in classes]


def identity_wd(domains: RotatedDomains, method: str = "emd", reg: float = 0.02, chunk: int = 1000,
                device: str | torch.device | None = None, sinkhorn_domain: str = "auto") -> pd.DataFrame:
    """WD of the identity translator on held-out data: per (source, target ≠ source, class),
    WD(real target digits, untranslated source digits). ``device``: where the costs (and Sinkhorn) are computed;
    ``sinkhorn_domain``: as :func:`~fda_core.core.wasserstein.wasserstein_distances`."""
    rows, pairs = [], []
    m = len(domains.test_x)
    classes = sorted(domains.test_y[0].unique().tolist())
    for s in range(m):
        for t in range(m):
            if s != t:
                pairs += _class_pairs(domains.test_x[s], domains.test_y[s], domains.test_x[t], domains.test_y[t], classes)
                rows += [dict(source=s, target=t, label=c) for c in classes]
    wd = wasserstein_distances([(b, a) for a, b in pairs], method, reg, chunk=chunk, device=device,
                               sinkhorn_domain=sinkhorn_domain)
    return pd.DataFrame(rows).assign(wd=wd)


def wd_by_depth(model: FedINB, domains: RotatedDomains, depths, method: str = "emd", reg: float = 0.02,
                chunk: int = 1000, known: dict[int, pd.DataFrame] | None = None,
                device: str | torch.device | None = None, pairs_at: dict[int, list] | None = None) -> pd.DataFrame:
    """Held-out WD after ℓ layers for ℓ in ``depths``: per (depth, source, target ≠ source, class),
    WD(real target digits, digits translated source → target) (paper Sec. 4 Metrics). ``device``: where the
    costs (and Sinkhorn) are computed.

    ``known``: depth → rows of this table already measured (e.g. depth 0, where every translator of one
    variant and input transform is the same map); those depths are not translated again.
    ``pairs_at``: a dict whose keys are depths; each depth measured here gets its (real, translated) pairs, in the
    table's row order, so another metric can be computed on the same translations (the Sinkhorn/EMD cross-check)."""
    known = {d: t for d, t in (known or {}).items() if d in set(depths)}
    rows = [known[d] for d in sorted(known)]
    todo = [d for d in depths if d not in known]
    classes = sorted(domains.test_y[0].unique().tolist())
    real: dict[int, list[torch.Tensor]] = {}  # target -> its real held-out digits per class (shared by sources, depths)
    by_depth: dict[int, tuple[list, list]] = {}
    for depth, s, t, xs, ys in (model.translate_all(domains.test_x, domains.test_y, todo) if todo else ()):
        r, p = by_depth.setdefault(depth, ([], []))
        if t not in real:
            real[t] = [domains.test_x[t][domains.test_y[t] == c] for c in classes]
        p += [(real[t][i], xs[(ys == c).to(xs.device)].cpu()) for i, c in enumerate(classes)]
        r += [dict(depth=depth, source=s, target=t, label=c) for c in classes]
    for depth, (r, p) in by_depth.items():
        if pairs_at is not None and depth in pairs_at:
            pairs_at[depth] = p
        rows.append(pd.DataFrame(r).assign(wd=wasserstein_distances(p, method, reg, chunk=chunk, device=device)))
    return pd.concat(rows, ignore_index=True).sort_values(["depth", "source", "target", "label"], kind="stable",
                                                          ignore_index=True)


def build_translator(config: dict, autoencoders=None) -> FedINB:
    """The (unfitted) :class:`~fda_core.experiments.translation.inb.FedINB` of a run config (the keys of
    :func:`run_translation`): the one constructor every fit of a stored configuration goes through, so a
    translator refitted from the same config (e.g. for notebook 08) is the stored run's translator."""
    cfg = dict(config)
    return FedINB(cfg["n_layers"], cfg["n_directions"], cfg["max_iter"], cfg.get("n_bins"), variant=cfg["variant"],
                  autoencoders=autoencoders, seed=cfg.get("seed", 0), device=cfg.get("device", "auto"),
                  convention=cfg.get("convention", "library"), input_transform=cfg.get("input_transform", "auto"))


def run_translation(config: dict, domains: RotatedDomains, autoencoders=None, grid_per_class: int = 0,
                    sinkhorn_check: bool = False, depth0_cache: dict | None = None,
                    keep: dict | None = None) -> dict:
    """Fit one Fed INB configuration and evaluate it (paper Sec. 4.1). JSON-serialisable result.

    ``config`` keys: variant ("INB", "AEINB", "IndAEINB"), n_layers, n_directions, max_iter, n_bins (None
    or V), seed, device, eval_depths (list of depths, or None for every layer), wd_method ("emd" or
    "sinkhorn"), wd_reg, wd_chunk, convention ("library" or "reference", default "library") and
    input_transform ("auto", "probit" or "none", default "auto"): the options of
    :class:`~fda_core.experiments.translation.inb.FedINB` (``docs/translation.md`` § Reference-code
    conventions). ``autoencoders``: the model(s) for AE variants. ``grid_per_class``:
    how many held-out digits per class of client 0 to translate to the last client (Fig. 3a).
    ``sinkhorn_check``: also compute the final WD with the other solver, on the same translated digits
    (Sinkhorn vs EMD cross-check).
    ``depth0_cache``: a dict shared by the runs of one set of domains and autoencoders; the depth-0 WD rows
    (no layer applied: the same map for every run of a variant and input transform) are measured once per
    (variant, input transform, WD method) and reused. ``keep``: a dict that receives the fitted translator
    under ``"model"`` (so the caller can store it, :mod:`fda_core.experiments.translation.translators`).
    """
    cfg = dict(config)
    model = build_translator(cfg, autoencoders)
    t0 = time.perf_counter()
    model.fit(domains.train_x, domains.train_y)
    if keep is not None:
        keep["model"] = model
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    fit_seconds = time.perf_counter() - t0
    depths = cfg.get("eval_depths") or list(range(model.n_layers + 1))
    depths = sorted({int(d) for d in depths if 0 <= int(d) <= model.n_layers} | {model.n_layers})
    method, reg, chunk = cfg.get("wd_method", "emd"), cfg.get("wd_reg", 0.02), cfg.get("wd_chunk", 1000)
    t1 = time.perf_counter()
    key = (model.variant, model.input_transform_, method, reg, chunk)
    known = {0: depth0_cache[key]} if depth0_cache is not None and key in depth0_cache else None
    final_pairs: dict[int, list] = {model.n_layers: []} if sinkhorn_check else {}
    wd = wd_by_depth(model, domains, depths, method, reg, chunk, known=known, device=model.device, pairs_at=final_pairs)
    if depth0_cache is not None and 0 in depths:
        depth0_cache.setdefault(key, wd[wd.depth == 0].reset_index(drop=True))
    eval_seconds = time.perf_counter() - t1
    comm = model.communication.per_layer()
    cum = np.concatenate([[0], comm["cumulative"].to_numpy()])
    up = np.concatenate([[0], comm["up"].cumsum().to_numpy()])
    down = np.concatenate([[0], comm["down"].cumsum().to_numpy()])
    g = wd.groupby("depth").wd
    curve = [dict(depth=d, params=int(cum[d]), params_up=int(up[d]), params_down=int(down[d]),
                  wd=float(g.mean()[d]), wd_sem=float(g.std()[d] / np.sqrt(g.count()[d]))) for d in depths]
    tags = model.communication.table().groupby(["stage", "tag", "direction"]).params_per_client.sum()
    hist = pd.DataFrame([{k: v for k, v in h.items() if k != "trace"} for h in model.history])
    result = dict(
        name=model.name, device=str(model.device), fit_seconds=fit_seconds, eval_seconds=eval_seconds,
        dim=model.dim, classes=model.classes, curve=curve, convention=model.convention,
        input_transform=model.input_transform_,
        bary_bins=model.client_bins(int(domains.sizes["n_train_per_class"])), bary_grid=model.bary_grid,
        wd_final=curve[-1]["wd"], wd_start=curve[0]["wd"],
        wd_final_per_class=wd[wd.depth == depths[-1]].groupby("label").wd.mean().round(6).tolist(),
        comm_per_layer=json.loads(comm.drop(columns="cumulative").to_json(orient="records")),
        comm_by_tag=[dict(stage=k[0], tag=k[1], direction=k[2], params=int(v)) for k, v in tags.items()],
        params_total=int(model.communication.total()), params_up=int(model.communication.total("up")),
        params_down=int(model.communication.total("down")),
        iterations_per_class={str(k): v for k, v in model.iteration_counts().items()},
        history=json.loads(hist.to_json(orient="records")),
        traces=[dict(layer=h["layer"], label=h["label"], trace=[round(v, 8) for v in h["trace"]])
                for h in model.history],
    )
    if sinkhorn_check:
        other = "sinkhorn" if method == "emd" else "emd"
        t2 = time.perf_counter()
        if final_pairs[model.n_layers]:  # the primary metric's translations after the last layer
            wd2 = wasserstein_distances(final_pairs[model.n_layers], other, reg, chunk=chunk, device=model.device)
        else:  # that depth came from depth0_cache (n_layers = 0): translate again
            wd2 = wd_by_depth(model, domains, [model.n_layers], other, reg, chunk, device=model.device).wd.to_numpy()
        result["cross_check"] = dict(method=other, wd=float(pd.Series(wd2).mean()), wd_primary=curve[-1]["wd"],
                                     seconds=time.perf_counter() - t2)
    if grid_per_class > 0:
        src, tgt = 0, len(domains.test_x) - 1
        y0 = domains.test_y[src]
        idx = torch.cat([(y0 == c).nonzero().flatten()[:grid_per_class] for c in model.classes])
        x = domains.test_x[src][idx]
        out = model.translate(x, src, tgt, y0[idx]).float().cpu()
        result["grid"] = dict(source=src, target=tgt, labels=y0[idx].tolist(),
                              original=x.numpy().round(4).tolist(), translated=out.numpy().round(4).tolist(),
                              target_real=domains.test_x[tgt][idx].numpy().round(4).tolist())
    return result


def vw_equals_plain(n_bins: int | None, n: int) -> bool:
    """Whether VW histograms with V = ``n_bins`` bins reproduce the plain search bit for bit for n samples per
    client and class: V a multiple of n (``docs/translation.md`` § VW histograms). Then every pseudo-sample
    of the barycenter (paper eq. 3) sits at an integer edge position k·i, and that edge is the order statistic
    i of every client exactly (:func:`~fda_core.core.barycenter.vw_edges`), so the objective, the search, the
    1-D maps and the translator are those of the run with sorted projections; only the messages differ."""
    return n_bins is not None and n_bins >= n and n_bins % n == 0


def vw_record_from_plain(plain: dict, n_bins: int) -> dict:
    """The record :func:`run_translation` returns for VW histograms with V = ``n_bins`` (a multiple of n, see
    :func:`vw_equals_plain`), built without refitting from ``plain``, the record (with its ``config``) of the
    same configuration with sorted projections: the same translator, WD, iterations and traces; the
    communication counted per layer and message by the closed form of the VW protocol
    (:func:`~fda_core.experiments.translation.comms.expected_messages` with Q = V + 1, from each layer's and
    class's iterations and Armijo trials — what the message log of a fit counts, ``tests/test_inb_reference.py``).
    ``derived_from`` names the plain run; no time is spent (``fit_seconds`` = ``eval_seconds`` = 0). The result
    has no ``config`` (the caller adds the VW run's)."""
    cfg = plain["config"]
    n, k = int(cfg["data"]["n_train"]), int(cfg["n_directions"])
    if cfg["n_bins"] is not None or not vw_equals_plain(n_bins, n):
        raise ValueError(f"plain must be a run with sorted projections and n_bins a multiple of n={n} (V = k·n "
                         f"reproduces the plain search), got n_bins={n_bins!r} for a run with n_bins={cfg['n_bins']!r}")
    per_layer: dict[int, dict[tuple[str, str, str], int]] = {}
    for h in plain["history"]:
        msgs = expected_messages(plain["dim"], k, n, h["n_iter"], h["n_trials"], n_bins, plain["bary_bins"],
                                 plain["bary_grid"])
        acc = per_layer.setdefault(h["layer"], {})
        for key, v in msgs.items():
            acc[key] = acc.get(key, 0) + v
    layers = sorted(per_layer)
    up = [sum(v for key, v in per_layer[ly].items() if key[2] == "up") for ly in layers]
    down = [sum(v for key, v in per_layer[ly].items() if key[2] == "down") for ly in layers]
    cum, cum_up, cum_down = (np.concatenate([[0], np.cumsum(x)]) for x in ([u + d for u, d in zip(up, down)], up, down))
    curve = [{**p, "params": int(cum[p["depth"]]), "params_up": int(cum_up[p["depth"]]),
              "params_down": int(cum_down[p["depth"]])} for p in plain["curve"]]
    tags: dict[tuple[str, str, str], int] = {}
    for acc in per_layer.values():
        for key, v in acc.items():
            tags[key] = tags.get(key, 0) + v
    out = {key: v for key, v in plain.items() if key not in ("grid", "cross_check", "config")}
    out.update(
        name=f"Hist {plain['name']}-V{n_bins}", fit_seconds=0.0, eval_seconds=0.0, derived_from=plain["name"],
        curve=curve, wd_final=curve[-1]["wd"], wd_start=curve[0]["wd"],
        comm_per_layer=[dict(layer=ly, up=int(u), down=int(d), total=int(u + d)) for ly, u, d in zip(layers, up, down)],
        comm_by_tag=[dict(stage=key[0], tag=key[1], direction=key[2], params=int(v))
                     for key, v in sorted(tags.items())],
        params_total=int(sum(up) + sum(down)), params_up=int(sum(up)), params_down=int(sum(down)))
    return out
