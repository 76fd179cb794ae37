"""Target metrics recorded by the federated loop: accuracy and the area under the ROC curve (AUC).

The weakly-supervised FDA paper reports both for every data set (Table 2; ``docs/auxiliary.md`` § Metrics
and confidence intervals). AUC comes from scikit-learn's ``roc_auc_score``: for two classes the score of
class 1; for more classes the one-vs-rest AUC of each class that occurs in ``y`` together with other
classes, averaged with equal weights (scikit-learn's ``multi_class="ovr", average="macro"`` when every
class occurs). A test set with a single class has no AUC (NaN).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = ["METRICS", "auc_score", "evaluate_metrics"]

#: Metric names a dataset may list in its ``metrics`` attribute.
METRICS = ("acc", "auc")


def auc_score(scores: Tensor, y: Tensor) -> float:
    """AUC of class scores ``scores`` (n, C) (probabilities or logits: AUC only uses their order within a
    class) for labels ``y`` (n,) in 0 … C − 1; NaN when ``y`` holds a single class."""
    from sklearn.metrics import roc_auc_score

    if scores.ndim != 2 or y.ndim != 1 or scores.shape[0] != y.shape[0]:
        raise ValueError(f"scores must be (n, C) and y (n,), got {tuple(scores.shape)} and {tuple(y.shape)}")
    s = scores.detach().double().cpu().numpy()
    t = y.detach().cpu().numpy()
    present = sorted(set(t.tolist()))
    if len(present) < 2:
        return math.nan
    if s.shape[1] == 2:
        return float(roc_auc_score(t, s[:, 1]))
    return float(sum(roc_auc_score(t == c, s[:, c]) for c in present) / len(present))


@torch.no_grad()
def evaluate_metrics(module: nn.Module, x: Tensor, y: Tensor, metrics: tuple[str, ...] = ("acc",),
                     chunk: int = 2048) -> dict[str, float]:
    """``{"target_acc": …, "target_auc": …}`` of ``module``'s logits on (x, y), the metrics named in
    ``metrics`` (``"acc"`` always); one pass over the data in eval mode. AUC uses the softmax
    probabilities."""
    bad = [m for m in metrics if m not in METRICS]
    if bad:
        raise ValueError(f"metrics must be among {list(METRICS)}, got {list(metrics)}")
    module.eval()
    outs = [module(x[s:s + chunk]) for s in range(0, x.shape[0], chunk)]
    logits = torch.cat(outs) if outs else torch.empty(0, 0)
    n = max(x.shape[0], 1)
    res = {"target_acc": int((logits.argmax(1) == y).sum()) / n if len(outs) else 0.0}
    if "auc" in metrics:
        res["target_auc"] = auc_score(logits.softmax(1), y) if len(outs) else math.nan
    return res
