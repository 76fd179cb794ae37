"""Aggregation rules: hand-computed cases, invariants (hypothesis), forms, registry and bad input."""

import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
import numpy as np

from fda_core.core.aggregation import (
    fedda,
    fedda_auto,
    fedgp,
    fedgp_auto,
    fedgp_cosine,
    get_rule,
    list_rules,
    magnitude_alignment,
    source_only,
    target_only,
)

T = lambda *x: torch.tensor(x, dtype=torch.float64)  # noqa: E731


# ------------------------------------------------------------------ hand-computed cases
def test_source_only_hand():
    s = torch.stack([T(1, 0), T(0, 2)])
    assert torch.allclose(source_only(s), T(0.5, 1.0))
    assert torch.allclose(source_only(s, weights=[3, 1]), T(0.75, 0.5))


def test_target_only_returns_target():
    t = T(1, -2, 3)
    assert target_only(t) is t


def test_fedda_hand():
    # (1-β) g_T + β mean(g_S): 0.75*(4,0) + 0.25*(0.5,1) = (3.125, 0.25)
    s = torch.stack([T(1, 0), T(0, 2)])
    t = T(4, 0)
    assert torch.allclose(fedda(s, t, 0.25), T(3.125, 0.25))


def test_fedda_per_source_beta_hand():
    # Σ w_i[(1-β_i) t + β_i s_i] with w = (1/2, 1/2), β = (0, 1): 0.5 t + 0.5 s_2
    s = torch.stack([T(1, 0), T(0, 2)])
    t = T(4, 0)
    assert torch.allclose(fedda(s, t, [0.0, 1.0]), T(2.0, 1.0))


def test_fedgp_hand():
    # one source along e1, target (3, 4): Proj₊ = (3, 0); β = 0.5 → 0.5(3,4) + 0.5(3,0) = (3, 2)
    s = T(2, 0).unsqueeze(0)
    t = T(3, 4)
    assert torch.allclose(fedgp(s, t, 0.5), T(3.0, 2.0))
    # source pointing away: filtered out, (1-β) g_T remains
    assert torch.allclose(fedgp(-s, t, 0.5), T(1.5, 2.0))


def test_fedgp_two_sources_hand():
    # sources e1 and e2 (scaled), target (3, 4), β = 1, w uniform: 0.5(3,0) + 0.5(0,4) = (1.5, 2)
    s = torch.stack([T(5, 0), T(0, -0.1)])
    t = T(3, 4)
    # second source points to -e2: <t, s2> < 0, filtered → 0.5 (3, 0) + 0 = (1.5, 0)
    assert torch.allclose(fedgp(s, t, 1.0), T(1.5, 0.0))
    s[1] = T(0, 0.1)
    assert torch.allclose(fedgp(s, t, 1.0), T(1.5, 2.0))


def test_fedgp_zero_source_contributes_nothing():
    s = torch.stack([T(0, 0), T(1, 0)])
    t = T(3, 4)
    out = fedgp(s, t, 1.0)
    assert torch.isfinite(out).all()
    assert torch.allclose(out, T(1.5, 0.0))  # 0.5·0 + 0.5·(3, 0)


def test_fedgp_cosine_hand():
    # cos((3,4),(2,0)) = 0.6; term = β a cos g_S = 0.5·2·0.6·(2,0) = (1.2, 0); plus 0.5·(3,4)
    s = T(2, 0).unsqueeze(0)
    t = T(3, 4)
    assert torch.allclose(fedgp_cosine(s, t, 0.5, alignment=[2.0]), T(2.7, 2.0))
    assert torch.allclose(fedgp_cosine(-s, t, 0.5, alignment=[2.0]), T(1.5, 2.0))


def test_fedgp_cosine_equals_projection_with_norm_ratio_alignment():
    g = torch.Generator().manual_seed(0)
    s = torch.randn(3, 7, generator=g, dtype=torch.float64)
    t = torch.randn(7, generator=g, dtype=torch.float64)
    a = torch.linalg.vector_norm(t) / torch.linalg.vector_norm(s, dim=1)
    assert torch.allclose(fedgp_cosine(s, t, 0.7, alignment=a), fedgp(s, t, 0.7))


def test_magnitude_alignment_formula():
    # a = (lr_T/lr_S)(n_T/bs_T)/(n_i/bs_S)/r_S
    a = magnitude_alignment(0.05, 0.01, 100, 16, [6400, 3200], 64, local_epochs_source=2)
    assert a == pytest.approx([5 * (100 / 16) / 100 / 2, 5 * (100 / 16) / 50 / 2])
    with pytest.raises(ValueError, match="lr_source"):
        magnitude_alignment(0.05, 0.0, 100, 16, 10, 64)


# ------------------------------------------------------------------ invariants (hypothesis)
def vec_strategy(n, m):
    return arrays(np.float64, (n, m), elements=st.floats(-10, 10, allow_nan=False, allow_infinity=False))


@st.composite
def problem(draw):
    n = draw(st.integers(1, 5))
    m = draw(st.integers(1, 8))
    s = torch.from_numpy(draw(vec_strategy(n, m)))
    t = torch.from_numpy(draw(vec_strategy(1, m))[0])
    w = torch.from_numpy(draw(arrays(np.float64, (n,), elements=st.floats(0.1, 5))))
    return s, t, w


@settings(max_examples=60, deadline=None)
@given(problem())
def test_beta_zero_gives_target(p):
    s, t, w = p
    for rule in (fedda, fedgp, fedgp_cosine):
        assert torch.allclose(rule(s, t, 0.0, w), t)


@settings(max_examples=60, deadline=None)
@given(problem())
def test_fedda_beta_one_is_weighted_source_mean(p):
    s, t, w = p
    expected = (w / w.sum()) @ s
    assert torch.allclose(fedda(s, t, 1.0, w), expected)
    assert torch.allclose(source_only(s, w), expected)


@settings(max_examples=60, deadline=None)
@given(problem(), st.floats(0, 1))
def test_fedgp_all_sources_opposed(p, beta):
    s, t, w = p
    # make every source point against the target: ⟨t, s_i⟩ ≤ 0
    opposed = -torch.sign(s @ t).clamp_min(0).unsqueeze(1) * 2 + 1  # flips sources with positive dot
    s = s * opposed
    assert bool((s @ t <= 0).all())
    assert torch.allclose(fedgp(s, t, beta, w), (1 - beta) * t)


@settings(max_examples=60, deadline=None)
@given(problem(), st.floats(0, 1), st.floats(0.1, 10))
def test_fedgp_parallel_source_gives_target(p, beta, scale):
    _, t, _ = p
    s = (scale * t).unsqueeze(0).repeat(3, 1)
    assert torch.allclose(fedgp(s, t, beta), t, atol=1e-9)


@settings(max_examples=60, deadline=None)
@given(problem(), st.floats(0, 1))
def test_fedgp_matches_definition(p, beta):
    s, t, w = p
    wn = w / w.sum()
    expected = torch.zeros_like(t)
    for i in range(s.shape[0]):
        n2 = float(s[i] @ s[i])
        proj = max(float(t @ s[i]), 0.0) / n2 * s[i] if n2 > 0 else torch.zeros_like(t)
        expected += wn[i] * ((1 - beta) * t + beta * proj)
    assert torch.allclose(fedgp(s, t, beta, w), expected, atol=1e-9)


@settings(max_examples=40, deadline=None)
@given(problem(), st.floats(0, 1))
def test_flat_and_per_tensor_agree_with_one_layer(p, beta):
    s, t, w = p
    dicts = [{"layer": s[i]} for i in range(s.shape[0])]
    for rule in (fedda, fedgp, fedgp_cosine):
        flat = rule(s, t, beta, w)
        per = rule(dicts, {"layer": t}, beta, w)
        assert torch.allclose(per["layer"], flat)
    assert torch.allclose(source_only(dicts, w)["layer"], source_only(s, w))


def test_sequence_form_keeps_shape_and_agrees():
    g = torch.Generator().manual_seed(1)
    s = torch.randn(3, 4, 5, generator=g)
    t = torch.randn(4, 5, generator=g)
    out = fedgp(list(s), t, 0.3)
    assert out.shape == (4, 5)
    assert torch.allclose(out.reshape(-1), fedgp(s.reshape(3, -1), t.reshape(-1), 0.3))


def test_per_tensor_projects_each_tensor_separately():
    # layer a: source aligned with target, layer b: opposed → b gets only (1-β) t_b
    src = [{"a": T(1, 0), "b": T(-1, 0)}]
    tgt = {"a": T(2, 1), "b": T(2, 1)}
    out = fedgp(src, tgt, 1.0)
    assert torch.allclose(out["a"], T(2, 0))
    assert torch.allclose(out["b"], T(0, 0))
    # whereas the flat projection uses the whole vector: <(2,1,2,1), (1,0,-1,0)> = 0 → filtered
    flat = fedgp(torch.cat([src[0]["a"], src[0]["b"]]).unsqueeze(0), torch.cat([tgt["a"], tgt["b"]]), 1.0)
    assert torch.allclose(flat, torch.zeros(4, dtype=torch.float64))


def test_batched_form_matches_loop():
    g = torch.Generator().manual_seed(2)
    s = torch.randn(6, 3, 4, generator=g)
    t = torch.randn(6, 4, generator=g)
    beta = torch.rand(6, 3, generator=g)
    out = fedgp(s, t, beta)
    for k in range(6):
        assert torch.allclose(out[k], fedgp(s[k], t[k], beta[k]), atol=1e-6)


def test_result_does_not_alias_or_modify_inputs():
    s = torch.randn(3, 5)
    t = torch.randn(5)
    s0, t0 = s.clone(), t.clone()
    d = [{"w": s[i].clone()} for i in range(3)]
    for rule in (fedda, fedgp):
        rule(s, t, 0.5)
        rule(d, {"w": t}, 0.5)
    assert torch.equal(s, s0) and torch.equal(t, t0)
    assert all(torch.equal(d[i]["w"], s0[i]) for i in range(3))


# ------------------------------------------------------------------ auto rules
def test_auto_rules_use_estimated_beta():
    from fda_core.core.estimators import auto_beta

    g = torch.Generator().manual_seed(3)
    s = torch.randn(2, 6, generator=g, dtype=torch.float64)
    parts = torch.randn(4, 6, generator=g, dtype=torch.float64) + 1.0
    for name, rule, base in (("fedgp", fedgp_auto, fedgp), ("fedda", fedda_auto, fedda)):
        out, beta = rule(s, parts, return_beta=True)
        assert torch.allclose(beta, auto_beta(parts, s, rule=name))
        assert torch.allclose(out, base(s, parts.mean(0), beta))


def test_auto_rules_dict_form():
    g = torch.Generator().manual_seed(4)
    s = torch.randn(2, 6, generator=g, dtype=torch.float64)
    parts = torch.randn(3, 6, generator=g, dtype=torch.float64)
    split = lambda v: {"a": v[:2], "b": v[2:]}  # noqa: E731
    flat, beta_flat = fedgp_auto(s, parts, return_beta=True)
    per, beta_per = fedgp_auto([split(x) for x in s], [split(p) for p in parts], return_beta=True)
    assert torch.allclose(beta_flat, beta_per)
    expected = fedgp([split(x) for x in s], split(parts.mean(0)), beta_flat)
    assert all(torch.allclose(per[k], expected[k]) for k in ("a", "b"))


def test_auto_rules_dict_form_whatever_the_key_order():
    """The target's per-batch parts may list their parameters in another order than the sources: the estimators
    compare the same coordinates either way (found by audit: the parts were flattened in their own key order, the
    sources in theirs, so β was estimated from mismatched coordinates when the sizes happened to agree)."""
    g = torch.Generator().manual_seed(5)
    s = torch.randn(4, 7, generator=g, dtype=torch.float64)
    parts = torch.randn(5, 7, generator=g, dtype=torch.float64) + 0.5
    ab = lambda v: {"a": v[:3], "b": v[3:].reshape(2, 2)}  # noqa: E731
    ba = lambda v: {"b": v[3:].reshape(2, 2), "a": v[:3]}  # noqa: E731  the same dict, keys the other way round
    for rule in (fedgp_auto, fedda_auto):
        _, beta_flat = rule(s, parts, return_beta=True)
        same, beta_same = rule([ab(x) for x in s], [ab(p) for p in parts], return_beta=True)
        other, beta_other = rule([ab(x) for x in s], [ba(p) for p in parts], return_beta=True)
        assert torch.allclose(beta_same, beta_flat) and torch.equal(beta_other, beta_same)
        assert all(torch.equal(other[k], same[k]) for k in ("a", "b"))
    with pytest.raises(ValueError, match=r"target_part_grads\[2\] keys differ.*missing \['b'\]"):
        fedgp_auto([ab(x) for x in s], [ab(p) if j != 2 else {"a": p[:3]} for j, p in enumerate(parts)])
    with pytest.raises(ValueError):
        fedgp_auto(s, [ab(p) for p in parts])  # dict parts, flat sources


# ------------------------------------------------------------------ registry
def test_registry_names():
    for name in ("source_only", "target_only", "fedda", "fedgp", "fedda_auto", "fedgp_auto", "fedgp_cosine"):
        assert name in list_rules()
        assert get_rule(name).name == name
    with pytest.raises(ValueError, match="unknown rule 'fedxx'.*fedgp"):
        get_rule("fedxx")


def test_rule_apply_dispatch():
    s = torch.randn(2, 3)
    t = torch.randn(3)
    parts = torch.randn(2, 3)
    assert torch.allclose(get_rule("fedgp").apply(s, t, beta=0.5), fedgp(s, t, 0.5))
    assert torch.equal(get_rule("target_only").apply(s, t, beta=0.5), t)
    assert torch.allclose(get_rule("source_only").apply(s, t), source_only(s))
    assert torch.allclose(get_rule("fedgp_auto").apply(s, target_part_grads=parts), fedgp_auto(s, parts))
    with pytest.raises(ValueError, match="beta"):
        get_rule("fedda").apply(s, t)
    with pytest.raises(ValueError, match="target_part_grads"):
        get_rule("fedda_auto").apply(s, t)


# ------------------------------------------------------------------ bad input
S = torch.randn(3, 4)
TG = torch.randn(4)


@pytest.mark.parametrize("beta", [-0.1, 1.5, [0.5, 0.5, 2.0], float("nan")])
def test_bad_beta(beta):
    for rule in (fedda, fedgp, fedgp_cosine):
        with pytest.raises(ValueError, match="beta"):
            rule(S, TG, beta)


def test_beta_wrong_length():
    with pytest.raises(ValueError, match="beta has 2 entries but there are 3 sources"):
        fedgp(S, TG, [0.1, 0.2])


@pytest.mark.parametrize("weights,msg", [([1, -1, 1], "non-negative"), ([0, 0, 0], "positive sum"),
                                         ([1, 1], "weights has 2 entries"), ([1, float("inf"), 1], "finite")])
def test_bad_weights(weights, msg):
    with pytest.raises(ValueError, match=msg):
        fedgp(S, TG, 0.5, weights)
    with pytest.raises(ValueError, match=msg):
        source_only(S, weights)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_inputs_named(bad):
    s = S.clone()
    s[1, 2] = bad
    for rule in (fedda, fedgp):
        with pytest.raises(ValueError, match=r"source_grads\[1\] contains NaN or inf"):
            rule(s, TG, 0.5)
    t = TG.clone()
    t[0] = bad
    for rule in (fedda, fedgp):
        with pytest.raises(ValueError, match="target_grad contains NaN or inf"):
            rule(S, t, 0.5)
    with pytest.raises(ValueError, match="target_grad contains NaN"):
        target_only(t)
    with pytest.raises(ValueError, match=r"source_grads\[1\]"):
        source_only(s)
    d = [{"a": S[i].clone()} for i in range(3)]
    d[2]["a"][0] = bad
    with pytest.raises(ValueError, match=r"source_grads\[2\]\['a'\] contains NaN or inf"):
        fedgp(d, {"a": TG}, 0.5)


def test_nan_source_with_beta_zero_still_caught():
    s = S.clone()
    s[0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        fedda(s, TG, 0.0)


def test_shape_mismatch():
    with pytest.raises(ValueError, match="target_grad has shape"):
        fedgp(S, torch.randn(5), 0.5)
    with pytest.raises(ValueError, match=r"source_grads\[1\] has shape"):
        fedgp([torch.randn(4), torch.randn(5)], TG, 0.5)
    with pytest.raises(ValueError, match="shape \\(N, m\\)"):
        fedgp(torch.randn(4), TG, 0.5)


def test_key_mismatch():
    src = [{"a": torch.randn(2), "b": torch.randn(2)}, {"a": torch.randn(2)}]
    with pytest.raises(ValueError, match=r"source_grads\[1\] keys differ.*missing \['b'\]"):
        fedgp(src, {"a": torch.randn(2), "b": torch.randn(2)}, 0.5)
    src = [{"a": torch.randn(2), "b": torch.randn(2)}]
    with pytest.raises(ValueError, match=r"target_grad keys differ.*extra \['c'\]"):
        fedgp(src, {"a": torch.randn(2), "b": torch.randn(2), "c": torch.randn(1)}, 0.5)
    with pytest.raises(ValueError, match=r"target_grad\['a'\] has shape"):
        fedgp(src, {"a": torch.randn(3), "b": torch.randn(2)}, 0.5)


def test_empty_sources():
    with pytest.raises(ValueError, match="at least one source"):
        fedgp([], TG, 0.5)
    with pytest.raises(ValueError, match="at least one source"):
        source_only(torch.zeros(0, 4))


def test_mixed_forms_rejected():
    with pytest.raises(ValueError, match="target_grad is a dict"):
        fedgp(S, {"a": TG}, 0.5)
    with pytest.raises(ValueError, match="only tensors or only parameter dicts"):
        fedgp([TG, {"a": TG}], TG, 0.5)


def test_overflow_reported():
    s = torch.full((1, 4), 1e30)
    with pytest.raises(ValueError, match="overflow"):
        fedgp(s, torch.ones(4), 0.5)


def test_auto_needs_two_parts():
    with pytest.raises(ValueError, match="B >= 2"):
        fedgp_auto(S, torch.randn(1, 4))
    with pytest.raises(ValueError, match="B >= 2"):
        fedgp_auto(S, [TG])
    with pytest.raises(ValueError, match="target_part_grads do not match source_grads"):
        fedgp_auto(S, torch.randn(3, 5))


def test_float32_inputs_supported():
    s = torch.randn(4, 10)
    t = torch.randn(10)
    out = fedgp(s, t, 0.5)
    assert out.dtype == torch.float32
    assert math.isfinite(float(out.sum()))


#: Python numbers at the edges of what the rules accept, before and after rounding to float32: -1e-50 rounds to -0.0
#: (accepted), 1 + 1e-9 to 1.0 (accepted), 1 + 1e-6 stays above 1, 4e38 overflows float32 to inf, 1e-45 is subnormal
_EDGE_NUMBERS = [0.0, -0.0, 0.5, 1.0, 1, 0, 2, -1, 1 + 1e-9, 1 + 1e-6, -1e-50, -1e-30, 1e-45, 3e38, 4e38, float("inf"),
                 float("nan")]
_number = st.one_of(st.sampled_from(_EDGE_NUMBERS), st.floats(-0.5, 1.5, allow_nan=False))
_per_source = st.one_of(st.none(), _number, st.lists(_number, min_size=3, max_size=3),
                        st.lists(_number, min_size=3, max_size=3).map(tuple))


def _outcome(call):
    try:
        return "result", call()
    except ValueError as e:
        return "error", str(e).split(", got")[0]


@settings(max_examples=200, deadline=None)
@given(dtype=st.sampled_from([torch.float32, torch.float64]), rule=st.sampled_from(["fedgp", "fedda", "fedgp_cosine"]),
       beta=_per_source, weights=_per_source, alignment=_per_source)
def test_python_numbers_are_checked_as_their_tensors_are(dtype, rule, beta, weights, alignment):
    """β, weights and alignment given as Python numbers are checked in Python (no torch operators): the outcome, the
    result's bits or the error (up to the repr of the value), equals that of the same values given as tensors."""
    gen = torch.Generator().manual_seed(0)
    S, t = torch.randn(3, 5, generator=gen, dtype=dtype), torch.randn(5, generator=gen, dtype=dtype)
    beta = 0.5 if beta is None else beta
    as_tensor = lambda v: None if v is None else torch.tensor(v, dtype=dtype)  # noqa: E731

    def call(b, w, a):
        if rule == "fedgp_cosine":
            return lambda: fedgp_cosine(S, t, b, w, alignment=a)
        return lambda: get_rule(rule)(S, t, b, w)

    python = _outcome(call(beta, weights, alignment))
    tensors = _outcome(call(as_tensor(beta), as_tensor(weights), as_tensor(alignment)))
    assert python[0] == tensors[0], (python, tensors)
    if python[0] == "result":
        assert torch.equal(python[1], tensors[1])
    else:
        assert python[1] == tensors[1]


# ------------------------------------------------------------------ out= buffers
def test_out_buffer_flat_sequence_and_dict():
    g = torch.Generator().manual_seed(7)
    s = torch.randn(3, 6, generator=g)
    t = torch.randn(6, generator=g)
    for rule in (fedda, fedgp, fedgp_cosine):
        buf = torch.empty(6)
        res = rule(s, t, 0.4, out=buf)
        assert res is buf and torch.allclose(buf, rule(s, t, 0.4))
    buf = torch.empty(6)
    assert source_only(s, out=buf) is buf and torch.allclose(buf, source_only(s))
    buf = torch.empty(2, 3)
    assert torch.allclose(fedgp(list(s.view(3, 2, 3)), t.view(2, 3), 0.4, out=buf), fedgp(s, t, 0.4).view(2, 3))
    d = [{"a": x[:2].clone(), "b": x[2:].clone()} for x in s]
    td = {"a": t[:2].clone(), "b": t[2:].clone()}
    bufs = {"a": torch.empty(2), "b": torch.empty(4)}
    res = fedgp(d, td, 0.4, out=bufs)
    assert res is bufs
    expected = fedgp(d, td, 0.4)
    assert all(torch.allclose(bufs[k], expected[k]) for k in "ab")
    parts = torch.randn(4, 6, generator=g)
    buf = torch.empty(6)
    assert torch.allclose(fedgp_auto(s, parts, out=buf), fedgp_auto(s, parts)) and torch.allclose(buf, fedgp_auto(s, parts))


def test_out_may_be_the_target_in_place():
    s = torch.randn(3, 5)
    t = torch.randn(5)
    expected = fedgp(s, t, 0.5)
    fedgp(s, t, 0.5, out=t)
    assert torch.allclose(t, expected)


def test_out_bad():
    with pytest.raises(ValueError, match="out must have shape"):
        fedgp(S, TG, 0.5, out=torch.empty(5))
    with pytest.raises(ValueError, match="dtype"):
        fedgp(S, TG, 0.5, out=torch.empty(4, dtype=torch.float64))
    with pytest.raises(ValueError, match="shares memory with source_grads"):
        s = S.clone()
        fedgp(s, TG, 0.5, out=s[0])
    with pytest.raises(ValueError, match="contiguous"):
        fedgp(S, TG, 0.5, out=torch.empty(4, 2)[:, 0])
    with pytest.raises(ValueError, match="unbatched"):
        fedgp(S.expand(2, 3, 4), TG.expand(2, 4), 0.5, out=torch.empty(2, 4))
    with pytest.raises(ValueError, match="same keys"):
        fedgp([{"a": TG}], {"a": TG}, 0.5, out={"b": torch.empty(4)})


def test_fedgp_nofilter_keeps_negative_projections():
    """FedGP paper Table 4 ablation: without the filter a source opposed to the target contributes its
    signed projection ⟨g_T, g_i⟩ g_i / ‖g_i‖²; when every projection is positive it equals FedGP."""
    from fda_core.core.aggregation import fedgp, fedgp_nofilter

    gt = torch.tensor([1.0, 2.0])
    src = torch.tensor([[-1.0, 0.0], [0.0, 3.0]])
    got = fedgp_nofilter(src, gt, 1.0)
    want = 0.5 * (-1.0 / 1.0) * src[0] + 0.5 * (6.0 / 9.0) * src[1]
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(fedgp(src, gt, 1.0), 0.5 * (6.0 / 9.0) * src[1])
    pos = torch.tensor([[1.0, 0.5], [0.2, 3.0]])
    torch.testing.assert_close(fedgp_nofilter(pos, gt, 0.4), fedgp(pos, gt, 0.4))


def test_fedgp_cosine_without_the_filter_by_hand():
    """The filter's ablation in the papers' rule (FedGP paper Table 4; docs/theory.md § Rules): the signed cosine
    replaces max(cos, 0), layer by layer, with the alignment as it is, so only the layers a source opposes change."""
    # layer 0 = entries 0-1, layer 1 = entries 2-3; β = 0.5, weights 1/2 each, alignment a = (2, 1)
    S = T(1, 0, 0, -2, 0, 1, 3, 0).reshape(2, 4)
    t = T(1, 1, 0, 1)
    c = 1 / math.sqrt(2)  # cos(t, s_i) on layer 0, both sources
    # layer 0: 0.5 t + 0.5 [0.5·2·c·(1, 0) + 0.5·1·c·(0, 1)]
    layer_0 = [0.5 + 0.5 * c, 0.5 + 0.25 * c]
    # layer 1: cos(t, s_0) = (0·0 + 1·(−2)) / (1·2) = −1, cos(t, s_1) = 0: 0.5 t + 0.5·0.5·2·(−1)·(0, −2) with no filter
    kept = T(*layer_0, 0.0, 0.5 + 1.0)
    filtered = T(*layer_0, 0.0, 0.5)
    got = fedgp_cosine(S, t, 0.5, alignment=[2.0, 1.0], segments=[2, 2], filter_negative=False)
    torch.testing.assert_close(got, kept)
    torch.testing.assert_close(fedgp_cosine(S, t, 0.5, alignment=[2.0, 1.0], segments=[2, 2]), filtered)
    # the dict form, the same rule per tensor
    views = [{"w": row[:2], "b": row[2:]} for row in [*S, t]]
    as_dict = fedgp_cosine(views[:2], views[2], 0.5, alignment=[2.0, 1.0], filter_negative=False)
    torch.testing.assert_close(torch.cat([as_dict["w"], as_dict["b"]]), kept)
    with pytest.raises(ValueError, match="filter_negative must be True or False, got 0"):
        fedgp_cosine(S, t, 0.5, filter_negative=0)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), n=st.integers(1, 4), lengths=st.lists(st.integers(1, 9), min_size=1, max_size=4),
       beta=st.floats(0, 1))
def test_fedgp_cosine_without_the_filter_adds_the_opposed_layers_only(seed, n, lengths, beta):
    """Without the filter the result is the filtered one plus, for every layer ℓ and source i whose cosine is
    negative, w_i β a_i cos_ℓ(t, s_i) s_i on that layer (the term the filter drops); with no negative cosine the
    two are equal."""
    gen = torch.Generator().manual_seed(seed)
    m = sum(lengths)
    S, t = torch.randn(n, m, generator=gen, dtype=torch.float64), torch.randn(m, generator=gen, dtype=torch.float64)
    a = torch.rand(n, generator=gen, dtype=torch.float64) * 2
    w = torch.rand(n, generator=gen, dtype=torch.float64) + 0.1
    kept = fedgp_cosine(S, t, beta, w, a, segments=lengths, filter_negative=False)
    filtered = fedgp_cosine(S, t, beta, w, a, segments=lengths)
    dropped = torch.zeros(m, dtype=torch.float64)
    start = 0
    for length in lengths:
        part = slice(start, start + length)
        for i in range(n):
            cos = torch.dot(S[i, part], t[part]) / (S[i, part].norm() * t[part].norm())
            if cos < 0:
                dropped[part] += (w[i] / w.sum()) * beta * a[i] * cos * S[i, part]
        start += length
    torch.testing.assert_close(kept, filtered + dropped)
    aligned = S * torch.sign(S @ t).unsqueeze(1)  # every source turned towards t on the whole vector
    torch.testing.assert_close(fedgp_cosine(aligned, t, beta, w, a, filter_negative=False),
                               fedgp_cosine(aligned, t, beta, w, a))


# ------------------------------------------------------------------ the kernel path's Python-packed parameters
def _blocks(n: int, dtype: torch.dtype):
    import fda_core.core.aggregation as agg

    return agg._normalise(torch.zeros(n, 3, dtype=dtype), torch.zeros(3, dtype=dtype), [1, 2])


def _torch_params(beta, weights, alignment, blocks):
    """The same (2N + 1,) vector by the torch construction (the tensor path of _project_fused)."""
    import fda_core.core.aggregation as agg

    return agg._tensor_params(blocks, beta, weights, alignment)


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 10), dtype=st.sampled_from([torch.float32, torch.float64]), data=st.data())
def test_python_params_equal_the_torch_construction_to_rounding(n, dtype, data):
    """β, the weights and the alignment given as Python numbers are packed in Python ([w_i β_i, scale_i, a = 1 −
    Σ w_i β_i], docs/theory.md § Rules): the torch construction's values to the dtype's rounding, a + Σ w_i β_i = 1."""
    import fda_core.core.aggregation as agg

    unit = st.floats(0, 1, allow_nan=False)
    beta = data.draw(st.one_of(unit, st.lists(unit, min_size=n, max_size=n)))
    weights = data.draw(st.one_of(st.none(), st.lists(st.floats(0.01, 100), min_size=n, max_size=n),
                                  st.lists(st.integers(1, 5), min_size=n, max_size=n)))
    alignment = data.draw(st.one_of(st.none(), st.lists(st.floats(0, 10), min_size=n, max_size=n)))
    blocks = _blocks(n, dtype)
    got = agg._python_params(beta, weights, alignment, blocks)
    expected = _torch_params(beta, weights, alignment, blocks)
    assert got.dtype == dtype and got.shape == (2 * n + 1,)
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(got, expected, rtol=8 * eps, atol=8 * eps)
    assert abs(float(got[-1]) + math.fsum(got[:n].tolist()) - 1.0) <= 8 * eps


def test_python_params_leave_tensors_and_other_dtypes_to_the_torch_path():
    import fda_core.core.aggregation as agg

    blocks = _blocks(3, torch.float32)
    assert agg._python_params(torch.tensor(0.5), None, None, blocks) is None
    assert agg._python_params(0.5, torch.ones(3), None, blocks) is None
    assert agg._python_params(0.5, None, torch.ones(3), blocks) is None
    assert agg._python_params(0.5, None, None, _blocks(3, torch.float16)) is None
    # weights whose sum leaves float32's range: the torch path decides what they mean, as for every other path
    assert agg._python_params(0.5, [3e38, 3e38, 1.0], None, blocks) is None
    assert agg._python_params(0.5, [1, 2, 3], [1.0, 2.0, 0.0], blocks) is not None


@pytest.mark.parametrize("kwargs, message", [
    (dict(beta=1.5), "beta must lie in [0, 1]"), (dict(beta=[0.5, -0.1, 0.2]), "beta must lie in [0, 1]"),
    (dict(beta=math.nan), "beta must be finite"), (dict(beta=0.5, weights=[1, -1, 1]), "weights must be non-negative"),
    (dict(beta=0.5, weights=[0, 0, 0]), "weights must have a positive sum"),
    (dict(beta=0.5, weights=[1, math.inf, 1]), "weights must be finite"),
    (dict(beta=0.5, alignment=[1, -2, 1]), "alignment must be non-negative"),
    (dict(beta=[0.5, 0.5]), "beta has 2 entries but there are 3 sources"),
])
def test_python_params_raise_as_the_checks_do(kwargs, message):
    """Bad β, weights or alignment raise in the Python packing with the messages of the checks every path uses."""
    import fda_core.core.aggregation as agg

    kwargs = dict(dict(weights=None, alignment=None), **kwargs)
    blocks = _blocks(3, torch.float64)
    with pytest.raises(ValueError, match=re.escape(message)):
        params = agg._python_params(kwargs["beta"], kwargs["weights"], kwargs["alignment"], blocks)
        if params is None:  # not Python numbers of the right count: the torch path's checks
            _torch_params(kwargs["beta"], kwargs["weights"], kwargs["alignment"], blocks)
    with pytest.raises(ValueError, match=re.escape(message)):
        fedgp_cosine(torch.randn(3, 3, dtype=torch.float64), torch.randn(3, dtype=torch.float64), **kwargs)


def test_per_source_arguments_cost_one_device_read_each():
    """Each tensor argument (β, the weights) is checked with one read of its result — on a GPU one host
    synchronisation — and Python numbers with none. Counted as aten._local_scalar_dense, which every read of a
    tensor's value dispatches (on the device, a call with β and the weights as device tensors made 7 synchronisations,
    2026-11-26, docs/performance.md § GPU: 3 for β, 3 for the weights, 1 for the result's finiteness)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Reads(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.count += func is torch.ops.aten._local_scalar_dense.default
            return func(*args, **(kwargs or {}))

    S, t = torch.randn(3, 50, dtype=torch.float64), torch.randn(50, dtype=torch.float64)
    beta, weights = [0.2, 0.5, 0.9], [1.0, 2.0, 3.0]
    counts, results = {}, {}
    for form, args in (("python", (beta, weights)),
                        ("tensors", tuple(torch.tensor(v, dtype=torch.float64) for v in (beta, weights)))):
        with Reads() as reads:
            results[form] = fedgp(S, t, *args)
        counts[form] = reads.count
    assert torch.equal(results["python"], results["tensors"])
    assert counts["tensors"] - counts["python"] == 2, counts
    # a failing check still names what failed, in the order finite, bounds, positive sum
    for bad, message in ((torch.tensor([0.1, math.nan, 0.2]), "weights must be finite"),
                         (torch.tensor([0.1, -1.0, 0.2]), "weights must be non-negative"),
                         (torch.zeros(3), "weights must have a positive sum")):
        with pytest.raises(ValueError, match=message):
            fedgp(S, t, 0.5, bad.double())
    with pytest.raises(ValueError, match=re.escape("beta must lie in [0, 1]")):
        fedgp(S, t, torch.tensor([0.1, 1.5, 0.2], dtype=torch.float64))
