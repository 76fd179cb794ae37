"""The phase-diagram trainer against the papers' reference code (``docs/experiments.md`` § Synthetic phase
diagram): its training step (squared error summed over the 10 outputs, momentum applying lr twice) and
FedGP projected per parameter tensor are the defaults; the library's step (mean MSE, ``torch.optim.SGD``)
and the flat projection stay available as named options and give the numbers of the code before the
options existed."""

import numpy as np
import pytest
import torch
from torch import nn

from fda_core.core.aggregation import fedda, fedgp
from fda_core.data import sigmoid_net as N
from fda_core.experiments import phase_diagram as S
from fda_core.experiments.phase_diagram import trainer as T

F64 = torch.float64
RULES = ("source_only", "target_only", "fedda", "fedgp", "fedda_auto", "fedgp_auto")


@pytest.fixture(scope="module")
def tiny64():
    """n = 60 points, 2 shift levels, 2 subset sizes, 2 trials, float64."""
    return S.make_phase_diagram_data(60, shift_levels=[0.0, 0.4], subset_sizes=[6, 20], n_trials=2, seed=11,
                                     dtype=F64)


@pytest.fixture(scope="module")
def tiny32():
    return S.make_phase_diagram_data(60, shift_levels=[0.0, 0.4], subset_sizes=[6, 20], n_trials=1, seed=11)


# ------------------------------------------------------------------------ the reference code, written out
def _reference_loss(params: list[torch.Tensor], X: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
    """The reference code's network and loss: data (dim, N), Ŷ = W2 σ(W1 X + b1) + b2 and
    MSE(Y, Ŷ) = ((Y − Ŷ)²).sum() / N (summed over the outputs)."""
    W1, b1, W2, b2 = params
    Y_pred = W2.mm(torch.sigmoid(W1.mm(X) + b1)) + b2
    return ((Y - Y_pred) ** 2).sum() / Y.shape[1]


def _reference_gradients(params, X, Y):
    return list(torch.autograd.grad(_reference_loss(params, X, Y), params))


def _gradient_proj(g_t, g_s, beta):
    """The reference code's projection of one tensor: β max(⟨g_T, g_S⟩, 0) g_S/‖g_S‖² + (1 − β) g_T."""
    inner = torch.sum(g_t * g_s)
    if inner < 0:
        inner = 0
    return beta * inner / torch.norm(g_s) ** 2 * g_s + (1 - beta) * g_t


def _convex_combine(g_t, g_s, beta):
    return beta * g_s + (1 - beta) * g_t


def reference_training(data, trial, shift_index, size_index, rule, beta, steps, lr=0.2, momentum=0.9):
    """The reference code's training loop (its ``NN.train``), one tensor at a time: per step the source and
    target gradients of the summed loss, the rule per tensor (source only = convex combination with β = 1,
    target only β = 0), then v ← μ·v + lr·u and W ← W − lr·v per tensor. Returns the target test MSE
    (mean over points and outputs, as the trainer records it) at steps 0..steps and the final flat θ."""
    theta0 = S.init_params(data, trial)
    W1, b1, W2, b2 = N.param_views(theta0)
    params = [W1.clone().requires_grad_(True), b1.reshape(-1, 1).clone().requires_grad_(True),
              W2.clone().requires_grad_(True), b2.reshape(-1, 1).clone().requires_grad_(True)]
    idx, test = data.train_indices(size_index, trial), data.test_indices(size_index, trial)
    Xs, Ys = data.x.T, data.y_sources[shift_index].T
    Xt, Yt = data.x[idx].T, data.y_target[idx].T
    Xte, Yte = data.x[test].T, data.y_target[test].T
    kind = rule.replace("_auto", "")
    if kind == "source_only":
        kind, beta = "fedda", 1.0
    elif kind == "target_only":
        kind, beta = "fedda", 0.0
    velocity = [0.0] * 4
    losses = []

    def test_loss():
        with torch.no_grad():
            return float(_reference_loss(params, Xte, Yte)) / N.N_OUTPUTS  # mean over the 10 outputs

    for _ in range(steps):
        losses.append(test_loss())
        grad_s = _reference_gradients(params, Xs, Ys)
        grad_t = _reference_gradients(params, Xt, Yt)
        combine = _gradient_proj if kind == "fedgp" else _convex_combine
        updates = [combine(gt, gs, beta) for gt, gs in zip(grad_t, grad_s)]
        with torch.no_grad():
            for k, (p, u) in enumerate(zip(params, updates)):
                velocity[k] = momentum * velocity[k] + lr * u
                p -= lr * velocity[k]
    losses.append(test_loss())
    return np.array(losses), torch.cat([p.detach().reshape(-1) for p in params])


# ------------------------------------------------------------------------ the reference step (defaults)
@pytest.mark.parametrize("dtype, rtol", [(F64, 1e-11), (torch.float32, 2e-6)])
def test_three_steps_match_the_reference_code(tiny64, tiny32, dtype, rtol):
    """Three steps of train_grid (defaults: reference step, per-tensor FedGP) = the reference code's loop,
    for every rule and cell; auto rules with the β the trainer estimated (the estimator is tested elsewhere)."""
    data = tiny64 if dtype == F64 else tiny32
    assert T.REFERENCE_TRAINING["training_step"] == "reference" and T.REFERENCE_TRAINING["granularity"] == "per_tensor"
    res = S.train_grid(data, rules=RULES, betas=(0.3,), steps=3, eval_every=1, progress=False)
    assert res.config["training_step"] == "reference" and res.config["granularity"] == "per_tensor"
    worst = 0.0
    for r in res.table.itertuples():
        beta = r.beta_used if r.rule.endswith("_auto") else r.beta
        ref, theta = reference_training(data, r.trial, r.shift_index, r.size_index, r.rule, beta, steps=3)
        np.testing.assert_allclose(res.curves[r.row], ref, rtol=rtol, atol=0)
        worst = max(worst, float(np.max(np.abs(res.curves[r.row] - ref) / ref)))
        if r.trial == 0 and r.shift_index == 1 and r.size_index == 0:  # θ itself, via the plain single training
            single = S.train_single(data, shift_index=1, size_index=0, rule=r.rule, beta=beta if r.rule in ("fedda", "fedgp") else None,
                                    trial=0, steps=3)
            tol = 1e-12 if dtype == F64 else 2e-6
            assert float((single["theta"] - theta).abs().max()) < tol, r.rule
    assert worst < rtol


def test_reference_step_is_library_sgd_at_ten_lr_squared(tiny64):
    """The algebra of docs/experiments.md: summing over the 10 outputs multiplies ĝ by 10 (every rule is
    positively homogeneous of degree 1 in the gradients; auto β is scale-free), and with v = lr·10·b the
    reference step v ← μv + lr·10ĝ, θ ← θ − lr·v is torch.optim.SGD's b ← μb + ĝ, θ ← θ − 10·lr²·b: the
    library step at lr 0.4 for lr 0.2 (equal up to rounding; three float64 steps agree to ~1e-15)."""
    kw = dict(rules=RULES, betas=(0.5,), steps=3, eval_every=1, progress=False)
    ref = S.train_grid(tiny64, lr=0.2, training_step="reference", **kw)
    lib = S.train_grid(tiny64, lr=10 * 0.2 ** 2, training_step="library", **kw)
    np.testing.assert_allclose(ref.curves, lib.curves, rtol=1e-12)
    np.testing.assert_allclose(ref.table.beta_used, lib.table.beta_used, rtol=1e-12)
    slow = S.train_grid(tiny64, lr=0.2, training_step="library", **kw)  # the library at the same lr is slower
    assert not np.allclose(ref.curves[:, -1], slow.curves[:, -1], rtol=1e-3)


# ------------------------------------------------------------------------ the library step (named option)
def _library_training(data, trial, shift_index, size_index, rule, beta, steps, lr, momentum):
    """The library's step written out: nn.MSELoss() (mean over points and outputs), the flat library rule,
    torch.optim.SGD."""
    net = S.make_network(S.init_params(data, trial))
    params = list(net.parameters())
    opt = torch.optim.SGD(params, lr=lr, momentum=momentum)
    idx, test = data.train_indices(size_index, trial), data.test_indices(size_index, trial)
    loss_fn = nn.MSELoss()

    def grad(x, y):
        return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss_fn(net(x), y), params)])

    losses = []
    for _ in range(steps):
        with torch.no_grad():
            losses.append(float(loss_fn(net(data.x[test]), data.y_target[test])))
        g_s, g_t = grad(data.x, data.y_sources[shift_index]), grad(data.x[idx], data.y_target[idx])
        g = {"source_only": g_s, "target_only": g_t}.get(rule)
        if g is None:
            g = (fedgp if rule == "fedgp" else fedda)(g_s.unsqueeze(0), g_t, beta)
        off = 0
        for p in params:
            p.grad = g[off:off + p.numel()].view_as(p).clone()
            off += p.numel()
        opt.step()
    with torch.no_grad():
        losses.append(float(loss_fn(net(data.x[test]), data.y_target[test])))
    return np.array(losses)


def test_library_options_keep_the_library_step(tiny64):
    """training_step="library", granularity="flat": torch.optim.SGD on the mean MSE with the flat rule, as
    before the options existed."""
    kw = dict(rules=("source_only", "target_only", "fedda", "fedgp"), betas=(0.4,), steps=3, eval_every=1,
              lr=0.2, momentum=0.9, progress=False)
    res = S.train_grid(tiny64, training_step="library", granularity="flat", **kw)
    assert res.config["loss"] == "MSE, mean over points and outputs"
    for r in res.table.itertuples():
        ref = _library_training(tiny64, r.trial, r.shift_index, r.size_index, r.rule, r.beta, 3, 0.2, 0.9)
        np.testing.assert_allclose(res.curves[r.row], ref, rtol=1e-11)


def test_library_options_give_the_numbers_before_the_options():
    """Pinned: final test losses of the code before training_step/granularity existed (commit fc664bf,
    float64), reproduced by the library options."""
    data = S.make_phase_diagram_data(300, shift_levels=[0.0, 0.25, 0.5], subset_sizes=[6, 20, 60], n_trials=1,
                                     seed=3, dtype=F64)
    res = S.train_grid(data, rules=("fedgp", "fedgp_auto"), betas=(0.5,), steps=30, eval_every=10,
                       shift_indices=[1, 2], size_indices=[0, 2], training_step="library", granularity="flat",
                       progress=False)
    pinned = [0.1886336189875225, 0.12599162954426038, 0.12891806202647366, 0.10475051342404267,
              0.36501751128356386, 0.26416240667012086, 0.32596516840517115, 0.31774548383389956]
    np.testing.assert_allclose(res.table.final_test_loss.to_numpy(), pinned, rtol=1e-9)


# ------------------------------------------------------------------------ per-tensor projection
def _random_grads(C: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    gs = torch.randn(C, N.N_PARAMS, generator=g, dtype=F64)
    gt = torch.randn(C, N.N_PARAMS, generator=g, dtype=F64)
    # tensor by tensor: an aligned source, an opposed one (filtered), a zero one
    b1 = dict((name, sl) for name, sl, _ in N.PARAM_TENSORS)
    gs[0, b1["0.bias"]] = 2.0 * gt[0, b1["0.bias"]]
    gs[1, b1["2.weight"]] = -gt[1, b1["2.weight"]]
    gs[2, b1["2.bias"]] = 0.0
    return gs, gt, torch.rand(C, generator=g, dtype=F64)


def test_per_tensor_projection_is_fedgp_on_parameter_dicts():
    gs, gt, beta = _random_grads(5, 0)
    out = T.batched_rule("fedgp", gs, gt, beta, "per_tensor")
    assert torch.equal(out, T.fedgp_per_tensor(gs, gt, beta))
    for c in range(5):
        want = fedgp([N.param_dict(gs[c])], N.param_dict(gt[c]), float(beta[c]))
        assert list(want) == [name for name, _, _ in N.PARAM_TENSORS]
        torch.testing.assert_close(out[c], torch.cat([v.reshape(-1) for v in want.values()]), rtol=1e-12, atol=1e-14)
    flat = T.batched_rule("fedgp", gs, gt, beta, "flat")
    for c in range(5):
        torch.testing.assert_close(flat[c], fedgp(gs[c].unsqueeze(0), gt[c], float(beta[c])), rtol=1e-12, atol=1e-14)
    rel = (out - flat).norm(dim=1) / flat.norm(dim=1)
    assert int((rel > 1e-2).sum()) >= 3  # the two granularities are different rules
    # FedDA (linear) and source/target only: the same either way
    for kind in ("fedda", "source_only", "target_only"):
        torch.testing.assert_close(T.batched_rule(kind, gs, gt, beta, "per_tensor"),
                                   T.batched_rule(kind, gs, gt, beta, "flat"), rtol=0, atol=0)
    torch.testing.assert_close(T.batched_rule("fedda", gs, gt, beta), fedda(gs.unsqueeze(1), gt, beta.unsqueeze(1)))
    # a zero source tensor contributes nothing; an opposed one is filtered
    b2 = N.PARAM_TENSORS[3][1]
    torch.testing.assert_close(out[2, b2], (1 - beta[2]) * gt[2, b2])
    w2 = N.PARAM_TENSORS[2][1]
    torch.testing.assert_close(out[1, w2], (1 - beta[1]) * gt[1, w2])


def test_flat_and_per_tensor_trainings_differ_and_match_the_plain_loop(tiny64):
    kw = dict(rules=("fedgp", "fedgp_auto"), steps=4, eval_every=2, progress=False, trials=[1])
    per = S.train_grid(tiny64, **kw)
    flat = S.train_grid(tiny64, granularity="flat", **kw)
    assert not np.allclose(per.curves[:, -1], flat.curves[:, -1], rtol=1e-6)
    for res, gran in ((per, "per_tensor"), (flat, "flat")):
        for r in res.table.itertuples():
            single = S.train_single(tiny64, shift_index=r.shift_index, size_index=r.size_index, rule=r.rule,
                                    trial=1, steps=4, eval_every=2, granularity=gran)
            np.testing.assert_allclose(res.curves[r.row], single["test_loss"], rtol=1e-10)


# ------------------------------------------------------------------------ options: bad values, notes
@pytest.mark.parametrize("kwargs, name", [
    (dict(training_step="sgd"), "training_step must be one of \\['reference', 'library'\\]"),
    (dict(training_step=None), "training_step"),
    (dict(granularity="layerwise"), "granularity must be one of \\['per_tensor', 'flat'\\]"),
])
def test_bad_options_name_the_parameter_and_the_values(tiny64, kwargs, name):
    with pytest.raises(ValueError, match=name):
        S.train_grid(tiny64, progress=False, **kwargs)
    with pytest.raises(ValueError, match=name):
        S.train_single(tiny64, shift_index=0, size_index=0, rule="fedgp", **kwargs)
    with pytest.raises(ValueError, match=name):
        S.run_phase_diagram(tiny64, progress=False, **kwargs)
    with pytest.raises(ValueError, match="output_reduction must be one of"):
        N.outputs_averaged("max")


def test_notes_say_which_step_and_granularity_ran(tiny64):
    kw = dict(rules=("source_only", "fedgp"), steps=1, progress=False, trials=[0], shift_indices=[0], size_indices=[0])
    ref = T.describe_training(S.train_grid(tiny64, **kw).config)
    assert "the reference code's step" in ref and "lr 0.4 on the mean MSE" in ref and "per parameter tensor" in ref
    lib = T.describe_training(S.train_grid(tiny64, training_step="library", granularity="flat", **kw).config)
    assert "torch.optim.SGD" in lib and "whole flat parameter vector" in lib
    old = {k: v for k, v in S.train_grid(tiny64, **kw).config.items() if k not in ("training_step", "granularity")}
    assert "the library's step" in T.describe_training(old)  # configs stored before the options: library, flat
