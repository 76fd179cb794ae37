"""Unsupervised federated domain-adaptation baselines of the weakly-supervised FDA paper's Table 2 on the method
interface: FADA and KD3A (``docs/baselines.md`` § Unsupervised FDA baselines).

Both adapt the federated model to the target with the target's UNLABELLED data (``run.target["x_unlab"]``,
the train split without its labelled samples) and use none of its labels, as in their papers. Both are built
from the parts that define them, with the simplifications their docstrings state; both weight the sources'
updates by weights that sum to 1 (recorded every evaluation as ``source_weights``) instead of the sample
weights of FedAvg, and both keep the FDA methods' warm-up rounds (FedAvg).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..common.checks import check_choice, check_int, check_number
from ..common.seeding import derive_seed, generator
from .methods import ClientInfo, Method, Option, RoundInfo, RoundPlan, RoundResults, ServerResult, register_method

__all__ = ["FADA", "KD3A", "knowledge_vote", "consensus_focus", "clustering_score", "FOCUS_RULES"]

#: Seed streams and mini-batch roles of these methods (``Run.train_local`` keys; the engine's roles are 0-2).
_STREAM_UNLAB, _STREAM_DISC = 31, 32
_ROLE_ADV, _ROLE_DISTIL = 12, 13


def _unlabelled_subset(run: Any, r: int, n: int) -> Tensor:
    """A seeded subset of ``n`` of the target's unlabelled train images for round ``r`` (all when fewer)."""
    x = run.target["x_unlab"]
    if x.shape[0] == 0:
        raise ValueError("this method adapts on the target's unlabelled train images, but the target has none: "
                         "lower n_target_labeled or target_fraction")
    if x.shape[0] <= n:
        return x
    idx = torch.randperm(x.shape[0], generator=generator(run.config["seed"], _STREAM_UNLAB, r))[:n]
    return x[idx.to(x.device)]


@torch.no_grad()
def _outputs(run: Any, params: Tensor, buffers: dict[str, Tensor] | None, x: Tensor) -> tuple[Tensor, Tensor]:
    """(features (n, d), class probabilities (n, C)) of the shared model with ``params`` on ``x``, eval mode."""
    fm = run.model
    fm.flat.copy_(params)
    fm.load_buffers(run.buffers if not buffers else buffers)
    fm.module.eval()
    f = fm.module.features(x)
    return f, fm.module.classifier(f).softmax(1)


def _weighted_buffers(weights: Tensor, buffers: list[dict[str, Tensor]]) -> dict[str, Tensor]:
    if not buffers or not buffers[0]:
        return {}
    w = weights.tolist()
    return {k: sum(wi * b[k] for wi, b in zip(w, buffers)) for k in buffers[0]}


# ---------------------------------------------------------------------------------------------
# FADA
# ---------------------------------------------------------------------------------------------
def clustering_score(features: Tensor, labels: Tensor) -> float:
    """log(W / T): W the within-cluster sum of squares of ``features`` (n, d) grouped by ``labels`` (n,)
    (Σ_c 1/(2 n_c) Σ_{j,j'∈c} ‖f_j − f_j'‖², the data term of the gap statistic), T the total sum of squares;
    lower is tighter clustering. Scale-free, so models with different feature scales compare."""
    total = (features - features.mean(0)).square().sum()
    within = torch.zeros((), dtype=features.dtype, device=features.device)
    for c in labels.unique():
        f = features[labels == c]
        within += (f - f.mean(0)).square().sum()
    return float(torch.log(within.clamp_min(1e-12) / total.clamp_min(1e-12)))


class FADA(Method):
    """FADA (Peng, Huang, Zhu & Saenko, ICLR 2020, "Federated Adversarial Domain Adaptation";
    ``docs/baselines.md`` § FADA), from the two parts that define it:

    * **dynamic attention** (paper § 3.2, Eq. 3-4): the gain of source i is the drop of a clustering score of the
      target's features when its update is applied, Gain_i = I(h) − I(h + g_i), and the sources are averaged
      with weights softmax(Gain) (summing to 1) instead of their sample counts. I is :func:`clustering_score`
      (log W/T of ``attention_samples`` unlabelled target images clustered by the model's predicted class);
    * **federated adversarial alignment** (§ 3.1, Eq. 1-2): one domain discriminator D_i per source (an MLP
      on the features, kept across rounds) learns to tell source i's features from the target's, and the target
      then moves the aggregated model's feature extractor to fool every D_i (−log D_i(G(x_t)), weight
      ``adv_weight``), on ``unlabeled_per_round`` unlabelled target images per round (one pass, the sources'
      batch size, the round's target learning rate); the result is the new global model.

    Simplified relative to the paper: one shared feature extractor (the global model's body) instead of one
    per source plus a target one, each source's features computed by the aggregated model on a sample of its
    images (``source_feature_samples``; in the paper the sources' extractors send features to the
    discriminators too); no representation disentanglement (§ 3.3); the gap statistic is reduced to its data
    term, normalised (no reference distribution); a subset of the unlabelled images per round. No target
    label is used."""

    name, label = "fada", "FADA"
    options = {
        "adv_weight": Option(1.0, lambda v, n: check_number(v, n, 0.0), lambda v: f"adv {v:g}",
                             "weight of the adversarial (feature-alignment) loss ≥ 0"),
        "unlabeled_per_round": Option(512, lambda v, n: check_int(v, n, 1), lambda v: f"{v} unlabelled/round",
                                      "unlabelled target images used per round ≥ 1"),
        "attention_samples": Option(256, lambda v, n: check_int(v, n, 2), None,
                                    "unlabelled target images scored by the dynamic attention ≥ 2"),
        "source_feature_samples": Option(256, lambda v, n: check_int(v, n, 1), None,
                                         "images of each source whose features train its discriminator ≥ 1"),
        "disc_hidden": Option(64, lambda v, n: check_int(v, n, 1), None, "hidden units of each discriminator"),
    }

    def setup(self, run: Any) -> None:
        self.run = run
        d = int(getattr(run.model.module, "n_outputs", 0)) or run.model.module.classifier.in_features
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(run.config["seed"], _STREAM_DISC))
            self.discs = nn.ModuleList(nn.Sequential(nn.Linear(d, self.disc_hidden), nn.ReLU(),
                                                     nn.Linear(self.disc_hidden, 1))
                                       for _ in run.sources).to(run.device)
        self.disc_opt = torch.optim.Adam(self.discs.parameters(), lr=run.config["source_lr"])
        self.source_weights: list[float] = run.weights.tolist()

    def configure_round(self, rnd: RoundInfo) -> RoundPlan:
        return RoundPlan("warmup" if rnd.warmup else "fada", sources=True)

    def attention(self, rnd: RoundInfo, res: RoundResults, theta: Tensor) -> Tensor:
        """softmax over sources of Gain_i = I(h) − I(h + g_i) (paper Eq. 3-4), (N,)."""
        run = self.run
        x = _unlabelled_subset(run, rnd.round, self.attention_samples)
        f, p = _outputs(run, theta, run.buffers, x)
        before = clustering_score(f, p.argmax(1))
        gains = []
        for i in range(res.source_updates.shape[0]):
            f, p = _outputs(run, theta + res.source_updates[i], res.source_buffers[i], x)
            gains.append(before - clustering_score(f, p.argmax(1)))
        return torch.tensor(gains, dtype=theta.dtype, device=theta.device).softmax(0)

    def aggregate(self, rnd: RoundInfo, res: RoundResults, theta: Tensor) -> ServerResult:
        if rnd.warmup:
            self.source_weights = list(res.weight_values())  # the engine's, read once per run
            return super().aggregate(rnd, res, theta)
        w = self.attention(rnd, res, theta)
        self.source_weights = w.tolist()
        theta.addmv_(res.source_updates.T, w)
        return ServerResult(buffers=_weighted_buffers(w, res.source_buffers) or None)

    def after_round(self, rnd: RoundInfo, run: Any) -> None:
        if rnd.warmup or self.adv_weight == 0:
            return
        # features of each source under the aggregated model (what its discriminator sees as "source")
        src_feats = []
        for i, s in enumerate(run.sources):
            n = s["x"].shape[0]
            idx = torch.randperm(n, generator=generator(run.config["seed"], _STREAM_UNLAB, rnd.round, 1 + i))
            src_feats.append(_outputs(run, run.theta, run.buffers, s["x"][idx[:self.source_feature_samples].to(s["x"].device)])[0])
        x = _unlabelled_subset(run, rnd.round, self.unlabeled_per_round)
        gen = generator(run.config["seed"], _STREAM_DISC, rnd.round)
        discs, opt, weight = self.discs, self.disc_opt, self.adv_weight

        def loss(module: nn.Module, xb: Tensor, _y: Tensor) -> Tensor:
            f_t = module.features(xb)
            # discriminator step (Eq. 1): source i's features → 1, the target's → 0
            opt.zero_grad()
            d_loss = 0.0
            for i, fs in enumerate(src_feats):
                pick = torch.randint(fs.shape[0], (xb.shape[0],), generator=gen).to(fs.device)
                ds, dt = discs[i](fs[pick]), discs[i](f_t.detach())
                d_loss = d_loss + F.binary_cross_entropy_with_logits(ds, torch.ones_like(ds)) + \
                    F.binary_cross_entropy_with_logits(dt, torch.zeros_like(dt))
            d_loss.backward()
            opt.step()
            # the target's feature extractor fools every discriminator (Eq. 2)
            g_loss = sum(F.binary_cross_entropy_with_logits(dt, torch.ones_like(dt))
                         for dt in (d(f_t) for d in discs)) / len(discs)
            return weight * g_loss

        dummy = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
        new, bufs, _ = run.train_local(x, dummy, start=run.theta, epochs=1, lr=rnd.lr_target,
                                       batch_size=rnd.config["source_batch_size"], key=(rnd.round, _ROLE_ADV, 0),
                                       client=ClientInfo("target", 0, run.target_name, rnd.round),
                                       who=f"FADA adversarial alignment, round {rnd.round}", loss_fn=loss)
        for p in discs.parameters():
            p.grad = None
        run.theta.copy_(new)
        run.buffers = bufs

    def target_scores(self, run: Any) -> dict[str, Any]:
        return {**run.score(), "source_weights": list(self.source_weights)}


# ---------------------------------------------------------------------------------------------
# KD3A
# ---------------------------------------------------------------------------------------------
def knowledge_vote(probs: Tensor, confidence: float) -> tuple[Tensor, Tensor]:
    """KD3A's knowledge vote (Feng et al. 2021, § 3.2) on (N, n, C) class probabilities of N sources: a source
    votes for its top class on a sample when its top probability is ≥ ``confidence``; the class with the most
    votes wins (ties: the larger summed confidence); the consensus is the mean probability vector of the sources
    that voted for it, with weight the number of those votes. Samples without a vote get the mean of all
    sources with weight 0. Returns (consensus (n, C), votes (n,))."""
    n_src, n, c = probs.shape
    conf, top = probs.max(2)  # (N, n)
    voting = conf >= confidence
    onehot = F.one_hot(top, c).to(probs.dtype) * voting.unsqueeze(2)  # (N, n, C)
    counts = onehot.sum(0)  # (n, C)
    strength = (onehot * conf.unsqueeze(2)).sum(0)
    winner = (counts * (1 + strength.max() + 1) + strength).argmax(1)  # most votes, then summed confidence
    support = (top == winner.unsqueeze(0)) & voting  # (N, n)
    votes = support.sum(0).to(probs.dtype)
    summed = (probs * support.unsqueeze(2)).sum(0)
    consensus = torch.where(votes.unsqueeze(1) > 0, summed / votes.clamp_min(1).unsqueeze(1), probs.mean(0))
    return consensus, votes


#: KD3A's ways of crediting a source for the consensus (``docs/baselines.md`` § KD3A).
FOCUS_RULES = ("leave_one_out", "shapley")


def consensus_focus(probs: Tensor, confidence: float, rule: str = "leave_one_out") -> Tensor:
    """KD3A's consensus focus (§ 3.3, Eq. 6-7) on (N, n, C) probabilities of N sources, (N,): with the consensus
    quality Q(S) = Σ_x votes(x) · max_c consensus(x)_c of a set S of sources (0 for no source),

    * ``rule="leave_one_out"`` (the paper's Eq. 6): CF_i = Q(S) − Q(S \\ {i}), the drop when source i leaves the
      vote, clamped at 0;
    * ``rule="shapley"`` (KD3A's code, ``calculate_consensus_focus``): source i's Shapley value, its marginal
      contribution Q(P ∪ {i}) − Q(P) averaged over all orders of the sources (P: those before i), summed here
      over the subsets P with weight |P|! (N − |P| − 1)! / N!."""
    from itertools import combinations
    from math import factorial

    check_choice(rule, "rule", FOCUS_RULES)

    def quality(members: tuple[int, ...]) -> Tensor:
        if not members:
            return probs.new_zeros(())
        cons, votes = knowledge_vote(probs[list(members)], confidence)
        return (votes * cons.max(1).values).sum()

    n_src = probs.shape[0]
    everyone = tuple(range(n_src))
    if rule == "leave_one_out":
        q_all = quality(everyone)
        return torch.stack([(q_all - quality(everyone[:i] + everyone[i + 1:])).clamp_min(0) for i in everyone])
    q = {s: quality(s) for k in range(n_src + 1) for s in combinations(everyone, k)}
    cf = probs.new_zeros(n_src)
    for i in everyone:
        others = everyone[:i] + everyone[i + 1:]
        for k in range(n_src):
            weight = factorial(k) * factorial(n_src - k - 1) / factorial(n_src)
            for s in combinations(others, k):
                cf[i] += weight * (q[tuple(sorted(s + (i,)))] - q[s])
    return cf


class KD3A(Method):
    """KD3A (Feng, You, Chen, Zhang, Zhu, Wu, Wu & Chen, ICML 2021, "Unsupervised Multi-source Decentralized
    Domain Adaptation via Knowledge Distillation"; ``docs/baselines.md`` § KD3A), from the parts that define it:

    * **knowledge vote** (§ 3.2): every source model labels ``distill_samples`` unlabelled target images;
      :func:`knowledge_vote` keeps, per image, the class most confident sources (top probability ≥ the gate)
      agree on, with the mean of their probabilities and the number of votes. The gate rises linearly over the
      FDA rounds from ``confidence`` to ``confidence_end`` (KD3A's code: ``confidence_gate = (end − begin) ·
      epoch / total_epochs + begin``, 0.9 → 0.95 in its configurations; "we gradually increase" it, as its
      paper says); ``confidence_end=None`` keeps it fixed;
    * **consensus focus** (§ 3.3, Eq. 6-8): source weights α_i ∝ n_i · CF_i (:func:`consensus_focus`,
      ``focus``: the paper's leave-one-out or the code's Shapley value), normalised to sum to 1 (sample weights
      when every CF_i is 0), replace FedAvg's; ``weight_momentum`` m > 0 smooths them across rounds as KD3A's
      code does (``update_domain_weight``, m = 0.9): α ← m α_previous + (1 − m) α_round, from the first FDA
      round's α on;
    * **knowledge distillation** (§ 3.2, Eq. 4): the target trains the aggregated model on those images
      against the consensus (soft cross-entropy weighted by the votes), one pass at the sources' batch size and
      the round's target learning rate; the result is the new global model;
    * **BatchNorm statistics**: the aggregated model's BatchNorm statistics are the α-weighted sources', and
      the distillation pass (in training mode) re-estimates them on the target's images.

    Simplified relative to the paper: its BatchNorm-MMD search of the aggregation weights (§ 3.4) is reduced
    to the last item (the statistics the target's data give, with no search; for models without BatchNorm, as
    the default ``small_cnn``/``mlp``, it does nothing); the distilled target model is not a separate extra
    member of the average but the global model itself; no mixup of the paper's distillation; a subset of the
    unlabelled images per round. No target label is used."""

    name, label = "kd3a", "KD3A"
    options = {
        "confidence": Option(0.9, lambda v, n: check_number(v, n, 0.0, 1.0), lambda v: f"gate {v:g}",
                             "confidence gate of the knowledge vote at the first FDA round, in [0, 1] (KD3A: 0.9)"),
        "confidence_end": Option(0.95, lambda v, n: None if v is None else check_number(v, n, 0.0, 1.0),
                                 lambda v: "fixed gate" if v is None else f"gate to {v:g}",
                                 "the gate the linear rise heads for at the end of the FDA rounds, in [0, 1] "
                                 "(KD3A's code: 0.95); None: a fixed gate"),
        "focus": Option("leave_one_out", lambda v, n: check_choice(v, n, FOCUS_RULES), lambda v: f"{v} focus",
                        "consensus focus: 'leave_one_out' (the paper's Eq. 6) or 'shapley' (KD3A's code)"),
        "weight_momentum": Option(0.0, lambda v, n: check_number(v, n, 0.0, 1.0, hi_open=True),
                                  lambda v: f"momentum {v:g}",
                                  "moving average of the source weights across rounds in [0, 1) (KD3A's code: 0.9)"),
        "distill_samples": Option(512, lambda v, n: check_int(v, n, 1), lambda v: f"{v} unlabelled/round",
                                  "unlabelled target images distilled per round ≥ 1"),
    }

    def setup(self, run: Any) -> None:
        self.run = run
        self.source_weights: list[float] = run.weights.tolist()
        self._batch: tuple[Tensor, Tensor, Tensor] | None = None
        self._smoothed: Tensor | None = None  # the smoothed source weights (weight_momentum > 0)

    def gate(self, rnd: RoundInfo) -> float:
        """The knowledge vote's gate in round ``rnd``: ``confidence`` + (``confidence_end`` − ``confidence``) · j / R
        for the j-th FDA round (j = 0, 1, …) of R, as KD3A's code raises it epoch by epoch."""
        if self.confidence_end is None:
            return self.confidence
        c = rnd.config
        fda_rounds = c["rounds"] - c["warmup_rounds"]
        j = rnd.round - c["warmup_rounds"] - 1
        return self.confidence + (self.confidence_end - self.confidence) * j / fda_rounds

    def configure_round(self, rnd: RoundInfo) -> RoundPlan:
        return RoundPlan("warmup" if rnd.warmup else "kd3a", sources=True)

    def aggregate(self, rnd: RoundInfo, res: RoundResults, theta: Tensor) -> ServerResult:
        if rnd.warmup:
            self.source_weights = list(res.weight_values())  # the engine's, read once per run
            return super().aggregate(rnd, res, theta)
        run = self.run
        x = _unlabelled_subset(run, rnd.round, self.distill_samples)
        probs = torch.stack([_outputs(run, theta + res.source_updates[i], res.source_buffers[i], x)[1]
                             for i in range(res.source_updates.shape[0])])  # (N, n, C)
        gate = self.gate(rnd)
        consensus, votes = knowledge_vote(probs, gate)
        cf = consensus_focus(probs, gate, self.focus)
        raw = res.weights * cf
        w = raw / raw.sum() if float(raw.sum()) > 0 else res.weights.clone()
        if self.weight_momentum > 0 and self._smoothed is not None:  # KD3A's update_domain_weight
            w = self._smoothed * self.weight_momentum + w * (1 - self.weight_momentum)
        self._smoothed = w
        self.source_weights = w.tolist()
        theta.addmv_(res.source_updates.T, w)
        self._batch = (x, consensus, votes)
        return ServerResult(buffers=_weighted_buffers(w, res.source_buffers) or None)

    def after_round(self, rnd: RoundInfo, run: Any) -> None:
        if rnd.warmup or self._batch is None:
            return
        x, consensus, votes = self._batch
        self._batch = None
        if float(votes.sum()) == 0:
            return  # no confident vote: nothing to distil this round
        target = torch.cat([votes.unsqueeze(1), consensus], 1)  # (n, 1 + C): weight, soft label

        def loss(module: nn.Module, xb: Tensor, yb: Tensor) -> Tensor:
            logp = F.log_softmax(module(xb), 1)
            return -(yb[:, 0] * (yb[:, 1:] * logp).sum(1)).sum() / yb[:, 0].sum().clamp_min(1.0)

        new, bufs, _ = run.train_local(x, target, start=run.theta, epochs=1, lr=rnd.lr_target,
                                       batch_size=rnd.config["source_batch_size"], key=(rnd.round, _ROLE_DISTIL, 0),
                                       client=ClientInfo("target", 0, run.target_name, rnd.round),
                                       who=f"KD3A distillation, round {rnd.round}", loss_fn=loss)
        run.theta.copy_(new)
        run.buffers = bufs

    def target_scores(self, run: Any) -> dict[str, Any]:
        return {**run.score(), "source_weights": list(self.source_weights)}


for _cls in (FADA, KD3A):
    register_method(_cls)
